"""The run's reward classifier (``reward.source: classifier``): P(success) of the observation a
step reached, trained from the episodes people labelled.

Model: a small network of ours, not LeRobot's ``lerobot.rewards.classifier``: that classifier's
vision encoder is a pretrained ResNet-10 it builds with ``AutoModel.from_pretrained`` (hub
weights plus remote code), which a run must not download and which does not take the robot's
``observation.state``. Ours: per camera (``observation.images.*``, uint8 HWC) a 3-layer CNN on
the frame resized to 32x32; ``observation.state`` normalised (mean/std of the training frames)
into a 2-layer MLP; both concatenated into an MLP with one logit. Tasks share one classifier
(the scene and the state show what is solved).

Training data (HIL-SERL's recipe, Luo et al. 2024: success frames vs all others): positives are
the verdict frame of each success episode and the frame just before it (a person presses after
seeing it); negatives are every frame of failure episodes and the frames of success episodes
more than :data:`MARGIN` steps before the verdict (the frames in between are left out: the task
may already look solved there). Loss: binary cross-entropy with positives weighted by the
negatives/positives ratio; Adam.

Wire form (inside each published weight version, beside the policy, ``cloud_learner.policy_card``
strips it before a policy loads): the network's tensors under :data:`PREFIX` and its card
``reward_classifier._card`` (uint8 ``(N,)``, UTF-8 JSON: format, version, threshold, the input
features, sizes, the training figures), parsed with ``json``, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PREFIX = "reward_classifier."
CARD_KEY = PREFIX + "_card"
CARD_FORMAT = 1
IMAGE_SIZE = 32  # frames are resized to IMAGE_SIZE x IMAGE_SIZE
MARGIN = 5  # success-episode frames within MARGIN steps of the verdict are not negatives
STATE = "observation.state"
IMAGES = "observation.images."


class RewardClassifierError(ValueError):
    """Unusable classifier input: bad episodes or features, an unreadable card or tensors."""


@dataclass
class LabelledEpisode:
    """One episode a person judged.

    Attributes:
        frames: feature key -> (T, ...) array: the observation each of the T steps reached
            (``observation.state`` float (T, D); ``observation.images.<cam>`` uint8 (T, H, W, C)).
        verdict: ``success`` or ``failure``.
        verdict_frame: index of the verdict step (for failures the last step).
        task: the run's task index.
    """

    frames: dict[str, np.ndarray]
    verdict: str
    verdict_frame: int
    task: int = 0


def _inputs(features: Mapping[str, Any]) -> tuple[int, list[str], dict[str, int]]:
    """(state D or 0, camera keys, channels per camera) of a LeRobot feature dict."""
    state = 0
    if STATE in features:
        shape = tuple(_feature(features[STATE])["shape"])
        if len(shape) != 1:
            raise RewardClassifierError(f"{STATE} must be 1-D, got shape {shape}")
        state = int(shape[0])
    cams: dict[str, int] = {}
    for key in sorted(k for k in features if k.startswith(IMAGES)):
        shape = tuple(_feature(features[key])["shape"])
        if len(shape) != 3 or shape[-1] not in (1, 3, 4):
            raise RewardClassifierError(f"{key} must be an (H, W, C) image, got shape {shape}")
        cams[key] = int(shape[-1])
    if not state and not cams:
        raise RewardClassifierError(
            f"no {STATE} nor {IMAGES}* among the features {sorted(features)}"
        )
    return state, list(cams), cams


def _feature(f: Any) -> Mapping[str, Any]:
    return f if isinstance(f, Mapping) else {"shape": tuple(f.shape), "dtype": str(f.dtype)}


class _Net(nn.Module):
    state_mean: torch.Tensor
    state_std: torch.Tensor

    def __init__(self, state_dim: int, cameras: Mapping[str, int], hidden: int) -> None:
        super().__init__()
        self.state_dim = state_dim
        self.cameras = dict(cameras)
        self.register_buffer("state_mean", torch.zeros(max(state_dim, 1)))
        self.register_buffer("state_std", torch.ones(max(state_dim, 1)))
        self.convs = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(c, 16, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(32 * (IMAGE_SIZE // 8) ** 2, hidden),
                nn.ReLU(),
            )
            for c in self.cameras.values()
        )
        self.state = (
            nn.Sequential(nn.Linear(state_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            if state_dim
            else None
        )
        width = hidden * (len(self.cameras) + (1 if state_dim else 0))
        self.head = nn.Sequential(
            nn.ReLU(), nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        if self.state is not None:
            s = (x[STATE].float() - self.state_mean) / self.state_std
            parts.append(self.state(s))
        for conv, key in zip(self.convs, self.cameras, strict=True):
            img = x[key].float().permute(0, 3, 1, 2) / 255.0
            if img.shape[-2:] != (IMAGE_SIZE, IMAGE_SIZE):
                img = F.interpolate(img, size=(IMAGE_SIZE, IMAGE_SIZE), mode="area")
            parts.append(conv(img))
        out: torch.Tensor = self.head(torch.cat(parts, dim=-1)).squeeze(-1)
        return out


class RewardClassifier:
    """P(success) of observations; see the module docstring for the model and wire form.

    Attributes:
        features: the input features (key -> ``{"dtype", "shape"}``).
        threshold: P at or above which a step is a success (the run's ``classifier.threshold``).
        version: the classifier's version in its run (1, 2, ... per retraining; 0 untrained).
        info: training figures kept in the card (``train_episodes``, ``holdout_episodes``,
            ``precision``, ``recall``, ...).
    """

    def __init__(
        self,
        features: Mapping[str, Any],
        *,
        hidden: int = 64,
        threshold: float = 0.5,
        version: int = 0,
        info: Mapping[str, float] | None = None,
    ) -> None:
        state, _, cams = _inputs(features)
        keep = [STATE] * bool(state) + list(cams)
        self.features = {
            k: {
                "dtype": str(_feature(features[k]).get("dtype", "")),
                "shape": list(_shape(features[k])),
            }
            for k in keep
        }
        self.hidden = hidden
        self.threshold = float(threshold)
        self.version = int(version)
        self.info: dict[str, float] = dict(info or {})
        self.net = _Net(state, cams, hidden)
        self.net.eval()

    @property
    def keys(self) -> list[str]:
        """The observation keys the classifier reads."""
        return list(self.features)

    def _batch(self, frames: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        missing = [k for k in self.keys if k not in frames]
        if missing:
            raise RewardClassifierError(f"frames lack {missing} (have {sorted(frames)})")
        out = {}
        for k in self.keys:
            arr = np.asarray(frames[k])
            want = tuple(self.features[k]["shape"])
            if arr.shape[1:] != want:
                raise RewardClassifierError(f"{k}: frames of shape {arr.shape[1:]}, want {want}")
            out[k] = torch.from_numpy(np.ascontiguousarray(arr))
        return out

    @torch.no_grad()
    def success_probability(self, frames: Mapping[str, np.ndarray]) -> np.ndarray:
        """(T,) float64 P(success) in [0, 1] of T observations (key -> (T, ...) arrays).

        Raises:
            RewardClassifierError: a feature missing or of another shape.
        """
        self.net.eval()
        logits = self.net(self._batch(frames))
        return torch.sigmoid(logits).double().numpy()

    # -- wire form -----------------------------------------------------------------------

    def card(self) -> dict[str, Any]:
        return {
            "format": CARD_FORMAT,
            "version": self.version,
            "threshold": self.threshold,
            "hidden": self.hidden,
            "image_size": IMAGE_SIZE,
            "features": self.features,
            "info": self.info,
        }

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The network's tensors under :data:`PREFIX` plus the card under :data:`CARD_KEY`."""
        out = {PREFIX + k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()}
        raw = json.dumps(self.card(), sort_keys=True).encode()
        out[CARD_KEY] = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
        return out

    @classmethod
    def from_tensors(cls, weights: Mapping[str, Any]) -> RewardClassifier:
        """The classifier in ``weights`` (its :data:`PREFIX` keys; others are ignored).

        Raises:
            RewardClassifierError: no card, an unreadable card, or tensors that do not fit it.
        """
        card = read_card(weights)
        if card is None:
            raise RewardClassifierError(f"the weights carry no {CARD_KEY}")
        try:
            model = cls(
                card["features"],
                hidden=int(card["hidden"]),
                threshold=float(card["threshold"]),
                version=int(card["version"]),
                info=card.get("info") or {},
            )
        except (KeyError, TypeError) as exc:
            raise RewardClassifierError(f"{CARD_KEY} lacks {exc}") from None
        state = {
            k.removeprefix(PREFIX): torch.as_tensor(v)
            for k, v in weights.items()
            if k.startswith(PREFIX) and k != CARD_KEY
        }
        try:
            model.net.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise RewardClassifierError(f"reward classifier tensors do not fit: {exc}") from None
        model.net.eval()
        return model


def _shape(f: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in _feature(f)["shape"])


def read_card(weights: Mapping[str, Any]) -> dict[str, Any] | None:
    """The classifier card of a weight version, None when it carries no classifier.

    Raises:
        RewardClassifierError: a card that is not uint8 (N,) JSON of format :data:`CARD_FORMAT`.
    """
    raw = weights.get(CARD_KEY)
    if raw is None:
        return None
    arr = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise RewardClassifierError(f"{CARD_KEY} must be uint8 (N,), got {arr.dtype} {arr.shape}")
    try:
        card = json.loads(arr.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RewardClassifierError(f"{CARD_KEY} is not JSON: {exc}") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise RewardClassifierError(f"{CARD_KEY} is not a format-{CARD_FORMAT} card")
    return card


def strip(weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` without the classifier's tensors (what a policy loads)."""
    return {k: v for k, v in weights.items() if not k.startswith(PREFIX)}


# -- training ---------------------------------------------------------------------------------


def training_frames(
    episodes: Sequence[LabelledEpisode], keys: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(frames key -> (N, ...), labels (N,) float32) by the recipe of the module docstring.

    Raises:
        RewardClassifierError: a bad verdict, verdict frame, or frames of unequal length.
    """
    picked: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    labels: list[np.ndarray] = []
    for i, ep in enumerate(episodes):
        steps = _check_episode(i, ep, keys)
        t = np.arange(steps)
        if ep.verdict == "success":
            pos = (t == ep.verdict_frame) | (t == ep.verdict_frame - 1)
            neg = t < ep.verdict_frame - MARGIN
        else:
            pos, neg = np.zeros(steps, bool), np.ones(steps, bool)
        take = pos | neg
        for k in keys:
            picked[k].append(np.asarray(ep.frames[k])[take])
        labels.append(pos[take].astype(np.float32))
    frames = {k: np.concatenate(v) for k, v in picked.items()}
    return frames, np.concatenate(labels) if labels else np.zeros(0, np.float32)


def _check_episode(i: int, ep: LabelledEpisode, keys: Sequence[str]) -> int:
    if ep.verdict not in ("success", "failure"):
        raise RewardClassifierError(f"episode {i}: verdict {ep.verdict!r} is not success/failure")
    lengths = {k: len(ep.frames[k]) for k in keys if k in ep.frames}
    missing = [k for k in keys if k not in ep.frames]
    if missing:
        raise RewardClassifierError(f"episode {i}: frames lack {missing}")
    if len(set(lengths.values())) != 1:
        raise RewardClassifierError(f"episode {i}: frames of unequal length {lengths}")
    steps = next(iter(lengths.values()))
    if not 0 <= ep.verdict_frame < steps:
        raise RewardClassifierError(
            f"episode {i}: verdict_frame {ep.verdict_frame} outside its {steps} steps"
        )
    return steps


def fit_reward_classifier(
    episodes: Sequence[LabelledEpisode],
    features: Mapping[str, Any],
    *,
    epochs: int = 100,
    seed: int = 0,
    batch_size: int = 256,
    lr: float = 1e-3,
    hidden: int = 64,
    threshold: float = 0.5,
    version: int = 1,
) -> RewardClassifier:
    """Train a classifier on ``episodes`` (module docstring: model, recipe, loss).

    Args:
        episodes: labelled episodes, at least one success and one failure.
        features: LeRobot feature dict of the observations (``observation.state`` and
            ``observation.images.*`` are used, other keys ignored).
        epochs: passes over the training frames.
        seed: seeds initialisation and shuffling (the caller's torch RNG is left as it was).

    Raises:
        RewardClassifierError: no success or no failure episode, or bad episodes/features.
    """
    verdicts = {ep.verdict for ep in episodes}
    if not {"success", "failure"} <= verdicts:
        raise RewardClassifierError(
            f"training needs success and failure episodes; got verdicts {sorted(verdicts)}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RewardClassifier(features, hidden=hidden, threshold=threshold, version=version)
        frames, labels = training_frames(episodes, model.keys)
        _fit(model, frames, labels, epochs, batch_size, lr, seed)
    model.info.update(train_episodes=float(len(episodes)), train_frames=float(len(labels)))
    return model


def _fit(
    model: RewardClassifier,
    frames: Mapping[str, np.ndarray],
    labels: np.ndarray,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> None:
    net = model.net
    if STATE in frames:
        s = torch.as_tensor(np.asarray(frames[STATE], np.float32))
        net.state_mean.copy_(s.mean(0))
        net.state_std.copy_(s.std(0).clamp_min(1e-3) if len(s) > 1 else torch.ones_like(s[0]))
    data = model._batch(frames)
    y = torch.from_numpy(labels)
    n_pos = float(y.sum())
    pos_weight = torch.tensor((len(y) - n_pos) / max(n_pos, 1.0))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            logits = net({k: v[idx] for k, v in data.items()})
            loss = F.binary_cross_entropy_with_logits(logits, y[idx], pos_weight=pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()


def episode_precision_recall(
    model: RewardClassifier, episodes: Sequence[LabelledEpisode], threshold: float
) -> tuple[float, float, int]:
    """(precision, recall, n) of per-episode success predictions against the verdicts.

    An episode is predicted a success when any of its steps has P >= ``threshold``.
    Precision is 0.0 when nothing is predicted a success, recall 0.0 without success
    episodes; n = ``len(episodes)``.
    """
    tp = fp = positives = 0
    for ep in episodes:
        p = model.success_probability({k: ep.frames[k] for k in model.keys})
        predicted = bool(len(p) and p.max() >= threshold)
        actual = ep.verdict == "success"
        positives += actual
        tp += predicted and actual
        fp += predicted and not actual
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / positives if positives else 0.0
    return float(precision), float(recall), len(episodes)


def holdout(key: tuple[str, str, int], fraction: float) -> bool:
    """Whether episode ``key`` (run, robot, episode index) is held out of training: a fixed
    hash of the key below ``fraction``, so an episode is held out (or not) on every
    retraining."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(json.dumps(list(key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


__all__ = [
    "CARD_KEY",
    "PREFIX",
    "LabelledEpisode",
    "RewardClassifier",
    "RewardClassifierError",
    "episode_precision_recall",
    "fit_reward_classifier",
    "holdout",
    "read_card",
    "strip",
    "training_frames",
]
