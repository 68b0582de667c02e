"""The help probe (``help.risk: probe``): a small probe on the policy's hidden activations that
predicts a person will have to step in, as in AEGIS (a linear probe on a policy's internal
state flags the steps before a failure).

Trained in the cloud from the run's own steps: a step is positive when an operator took over
or a failure verdict came within the next ``horizon`` steps (:func:`probe_labels`); steps where
a person already acts are left out (the probe is for autonomous states). Inputs are the
activations of the last hidden layer of the policy's head (:func:`head_activations`), the same
on the robot (``edge_agent.help_risk``) as here. The probe is logistic regression on
standardised activations: one matrix product per step on the robot.

Shipped like the reward classifier: its tensors under :data:`PREFIX` and a card
(:data:`CARD_KEY`, uint8 UTF-8 JSON: format, version, dim, figures) inside the weight
version; ``cloud_learner.policy_card.split_card`` leaves them out of the policy's weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

PREFIX = "help_probe."
CARD_KEY = PREFIX + "_card"
CARD_FORMAT = 1


class HelpProbeError(ValueError):
    """Unusable probe input: bad shapes or labels, an unreadable card, a policy without a head."""


def probe_labels(
    interventions: Sequence[bool] | np.ndarray, failed: bool, horizon: int
) -> tuple[np.ndarray, np.ndarray]:
    """Labels of one episode's steps, in order.

    Args:
        interventions: (N,) whether a person acted at each step.
        failed: the episode ended in a failure verdict (its last step is the verdict step).
        horizon: K, steps ahead a label looks (>= 1).

    Returns:
        (labels (N,) float32 0/1, keep (N,) bool: the autonomous steps to train on).
    """
    if horizon < 1:
        raise HelpProbeError(f"horizon must be >= 1, got {horizon}")
    acted = np.asarray(interventions, dtype=bool)
    n = len(acted)
    trouble = acted.copy()
    if failed and n:
        trouble[n - 1] = True
    labels = np.zeros(n, np.float32)
    idx = np.flatnonzero(trouble)
    for t in range(n):
        nxt = idx[idx > t]
        if len(nxt) and nxt[0] - t <= horizon:
            labels[t] = 1.0
    if failed and n:  # the verdict step itself is in trouble too
        labels[n - 1] = 1.0
    return labels, ~acted


def _tap_module(policy: Any) -> nn.Module:
    """The module whose output the probe reads: the last hidden layer's activation of the
    policy's head (``head`` of the MLP and Gaussian policies, ``velocity`` of flow-matching)."""
    inner = getattr(policy, "policy", policy)  # edge_agent's CardPolicy wraps the torch policy
    for name in ("head", "velocity"):
        head = getattr(inner, name, None)
        if isinstance(head, nn.Sequential) and len(head) >= 3:
            return head[-2]
    raise HelpProbeError(
        f"help.risk: probe needs a robofleet policy with an MLP head (mlp, cnn, gaussian, "
        f"flow-chunk); {type(inner).__name__} has none"
    )


class ActivationTap:
    """Keeps the last output of the policy's probe layer (a forward hook), re-attached when
    the robot rebuilds its policy (a new card)."""

    def __init__(self, policy: Callable[[], Any]) -> None:
        self._policy = policy
        self._module: nn.Module | None = None
        self._handle: Any = None
        self.last: np.ndarray | None = None  # (B, H) float32 of the last forward pass

    def attach(self) -> None:
        """Hook the current policy's probe layer (no-op when already hooked).

        Raises:
            HelpProbeError: the policy has no MLP head.
        """
        module = _tap_module(self._policy())
        if module is self._module:
            return
        if self._handle is not None:
            self._handle.remove()
        self._module = module
        self._handle = module.register_forward_hook(self._keep)

    def _keep(self, _m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        self.last = out.detach().float().cpu().numpy()


@torch.no_grad()
def head_activations(policy: Any, batch: Mapping[str, torch.Tensor]) -> np.ndarray:
    """(B, H) float32: the probe layer's activations of ``policy.predict`` on ``batch``
    (``observation.state`` (B, D), cameras, ``task_index`` (B,))."""
    tap = ActivationTap(lambda: policy)
    tap.attach()
    try:
        policy.predict(dict(batch), None)
    finally:
        tap._handle.remove()
    assert tap.last is not None
    return tap.last


class HelpProbe:
    """Logistic regression on standardised activations: ``risk(x (N, H)) -> (N,)`` in [0, 1].

    Attributes:
        version: the probe's version (1, 2, ...).
        info: training figures (steps, positives, accuracy on the training steps).
    """

    def __init__(self, dim: int, version: int = 1, info: Mapping[str, Any] | None = None) -> None:
        if dim < 1:
            raise HelpProbeError(f"probe input dim must be >= 1, got {dim}")
        self.dim = dim
        self.version = version
        self.info = dict(info or {})
        self.linear = nn.Linear(dim, 1)
        self.mean = torch.zeros(dim)
        self.std = torch.ones(dim)

    @torch.no_grad()
    def risk(self, x: np.ndarray) -> np.ndarray:
        """(N,) float32 P(a person must step in soon) of activations (N, H)."""
        t = torch.as_tensor(np.asarray(x, np.float32))
        if t.ndim != 2 or t.shape[1] != self.dim:
            raise HelpProbeError(f"probe input must be (N, {self.dim}), got {tuple(t.shape)}")
        z = self.linear((t - self.mean) / self.std)[:, 0]
        out: np.ndarray = torch.sigmoid(z).numpy().astype(np.float32)
        return out

    def card(self) -> dict[str, Any]:
        return {"format": CARD_FORMAT, "version": self.version, "dim": self.dim, "info": self.info}

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The probe's tensors under :data:`PREFIX` plus its card under :data:`CARD_KEY`."""
        raw = json.dumps(self.card(), sort_keys=True).encode()
        return {
            PREFIX + "weight": self.linear.weight.detach().clone(),
            PREFIX + "bias": self.linear.bias.detach().clone(),
            PREFIX + "mean": self.mean.clone(),
            PREFIX + "std": self.std.clone(),
            CARD_KEY: torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()),
        }

    @classmethod
    def from_tensors(cls, weights: Mapping[str, Any]) -> HelpProbe:
        """The probe in ``weights`` (its :data:`PREFIX` keys).

        Raises:
            HelpProbeError: no card, an unreadable card, or tensors that do not fit it.
        """
        card = read_card(weights)
        if card is None:
            raise HelpProbeError(f"the weights carry no {CARD_KEY}")
        try:
            probe = cls(int(card["dim"]), int(card["version"]), card.get("info") or {})
            w = torch.as_tensor(np.asarray(weights[PREFIX + "weight"]), dtype=torch.float32)
            b = torch.as_tensor(np.asarray(weights[PREFIX + "bias"]), dtype=torch.float32)
            mean = torch.as_tensor(np.asarray(weights[PREFIX + "mean"]), dtype=torch.float32)
            std = torch.as_tensor(np.asarray(weights[PREFIX + "std"]), dtype=torch.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise HelpProbeError(f"help probe tensors lack {exc}") from None
        dim = probe.dim
        if w.shape != (1, dim) or b.shape != (1,) or mean.shape != (dim,) or std.shape != (dim,):
            raise HelpProbeError(f"help probe tensors do not fit dim {dim}")
        with torch.no_grad():
            probe.linear.weight.copy_(w)
            probe.linear.bias.copy_(b)
        probe.mean, probe.std = mean, std
        return probe


def read_card(weights: Mapping[str, Any]) -> dict[str, Any] | None:
    """The probe card of a weight version, None when it carries no probe.

    Raises:
        HelpProbeError: a card that is not uint8 (N,) JSON of format :data:`CARD_FORMAT`.
    """
    raw = weights.get(CARD_KEY)
    if raw is None:
        return None
    arr = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise HelpProbeError(f"{CARD_KEY} must be a uint8 (N,) tensor, got {arr.dtype}")
    try:
        card = json.loads(arr.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HelpProbeError(f"{CARD_KEY} is not JSON: {exc}") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise HelpProbeError(f"{CARD_KEY} is not a format-{CARD_FORMAT} probe card")
    return card


def strip(weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` without the probe's tensors."""
    return {k: v for k, v in weights.items() if not k.startswith(PREFIX)}


def fit_probe(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    version: int = 1,
    epochs: int = 200,
    lr: float = 0.05,
    seed: int = 0,
) -> HelpProbe:
    """Train a probe on activations ``features`` (N, H) float32 and 0/1 ``labels`` (N,).

    Positives are weighted by the negatives' share (takeovers are rare). Full-batch Adam.

    Raises:
        HelpProbeError: shapes that disagree, or labels without both classes.
    """
    x = torch.as_tensor(np.asarray(features, np.float32))
    y = torch.as_tensor(np.asarray(labels, np.float32))
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise HelpProbeError(
            f"features must be (N, H) and labels (N,), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    pos = float(y.sum())
    if pos == 0 or pos == len(y):
        raise HelpProbeError("probe labels need both positives and negatives")
    torch.manual_seed(seed)
    probe = HelpProbe(x.shape[1], version)
    probe.mean = x.mean(0)
    probe.std = x.std(0, unbiased=False).clamp_min(1e-3)
    z = (x - probe.mean) / probe.std
    opt = torch.optim.Adam(probe.linear.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(y) - pos) / pos))
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(probe.linear(z)[:, 0], y)
        loss.backward()
        opt.step()
    predicted = probe.risk(x.numpy()) >= 0.5
    probe.info = {
        "steps": len(y),
        "positives": int(pos),
        "accuracy": float((predicted == (y.numpy() >= 0.5)).mean()),
    }
    return probe
