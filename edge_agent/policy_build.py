"""The robot's policy, built from what each weight version says it is (its policy card).

:class:`CardPolicy` is what :class:`~edge_agent.inference.LocalPolicyRunner` runs. It starts as
the agent's fallback MLP (state + task one-hot, ``hidden`` wide, untrained). Each weight version
carries a :mod:`cloud_learner.policy_card` card; when the card differs from the running one a
new policy of that kind is built, the tensors are loaded into it, and only then does it replace
the running policy (all or nothing). Weights without a card load into the fallback MLP, so
HG-DAgger weights published before cards keep working.

How each kind acts here:

* ``mlp`` (HG-DAgger): the deterministic regression output.
* ``mlp`` with an indicator (RECAP): conditioned on "positive" with the card's guidance weight
  (pi*0.6's inference; ``TorchPolicy.predict_guided``).
* ``gaussian`` (SAC/RLPD): with ``stochastic=True`` (training episodes on a robot) a sample
  ``tanh(mu + sigma * eps)`` of the squashed Gaussian, which is SAC's exploration; with
  ``stochastic=False`` (evaluation) the deterministic ``tanh(mu)``.
* ``mlp`` / ``flow`` with ``chunk_size`` T > 1 and ``lerobot`` (ACT, Diffusion, ...): a whole
  chunk (T, A) per call; the policy runner executes it step by step and new weights apply at
  its boundaries (``edge.weight_apply_at: chunk_boundary``).

Cameras: a card whose policy sees cameras (``spec.image_keys``) must name cameras this robot
has, of the same frame size; the robot's frames reach the policy as they come (uint8 HWC).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.policies.base import TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.policies.lerobot_adapter import LeRobotPolicyAdapter
from cloud_learner.policies.lerobot_gaussian import LeRobotGaussianActor
from cloud_learner.policy_card import PolicyCard, PolicyCardError, split_card, with_card


class CardPolicy:
    """A ``cloud_learner.core.Policy`` whose network is chosen by the weights' policy card.

    Args:
        state_dim: D of the robot's ``observation.state``.
        action_dim: A of the robot's ``action``.
        num_tasks: tasks the robot runs (``task`` index range of ``act``).
        hidden: hidden width of the fallback MLP (weights without a card).
        stochastic: SAC's Gaussian samples its actions (training); False acts with the mean.
        seed: seed of the sampling noise (reproducible exploration per robot).
        cameras: the robot's cameras, ``observation.images.<name>`` -> (H, W).
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        num_tasks: int,
        hidden: int,
        *,
        stochastic: bool = True,
        seed: int = 0,
        cameras: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.num_tasks = num_tasks
        self.hidden = hidden
        self.stochastic = stochastic
        self.cameras = {k: tuple(v) for k, v in (cameras or {}).items()}
        self.card: PolicyCard | None = None
        self.policy: TorchPolicy | LeRobotPolicyAdapter | LeRobotGaussianActor = self._fallback()
        self._generator = torch.Generator().manual_seed(seed)

    def _fallback(self) -> TorchPolicy:
        spec = PolicySpec(
            self.state_dim, self.action_dim, num_tasks=self.num_tasks, hidden=self.hidden
        )
        return MLPPolicy(spec)

    @property
    def kind(self) -> str:
        """``mlp``, ``gaussian``, ``flow`` or ``lerobot`` (the running policy's class)."""
        return self.card.kind if self.card is not None else "mlp"

    def _check(self, card: PolicyCard) -> None:
        want: dict[str, Any] = {"state_dim": self.state_dim, "action_dim": self.action_dim}
        if card.lerobot is None:  # LeRobot policies are not conditioned on a task index
            want["num_tasks"] = self.num_tasks
        got = {k: getattr(card.spec, k) for k in want}
        wrong = {k: f"card says {got[k]}, robot has {v}" for k, v in want.items() if got[k] != v}
        for key in card.spec.image_keys:
            size = self.cameras.get(key)
            if size is None:
                wrong[key] = f"the policy sees it, the robot has {sorted(self.cameras) or 'none'}"
            elif card.lerobot is None and size != tuple(card.spec.image_shape):
                wrong[key] = f"card says {tuple(card.spec.image_shape)}, robot has {size}"
        if wrong:
            raise PolicyCardError(f"policy card does not fit this robot: {wrong}")

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Build (if the card changed) and load; the running policy is untouched on error.

        Raises:
            ValueError: (or its subclass PolicyCardError) an unreadable card, a card whose
                shapes do not fit the robot, or tensors that do not fit the card's policy.
        """
        card, tensors = split_card(weights)
        if card is not None:
            self._check(card)
        if card == self.card:
            # Names and shapes are checked before any tensor is copied (load_weights_strict).
            self.policy.set_weights(tensors)
            return
        candidate = card.build() if card is not None else self._fallback()
        candidate.set_weights(tensors)
        candidate.eval()
        self.policy, self.card = candidate, card

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The running weights, with the card when there is one (round-trips ``set_weights``)."""
        weights = self.policy.get_weights()
        return with_card(weights, self.card) if self.card is not None else weights

    def act(self, observation: Mapping[str, np.ndarray], task: int = 0) -> np.ndarray:
        """(A,) float32 action, or a (T, A) chunk, for one observation; see the module
        docstring per kind."""
        if self.stochastic and isinstance(self.policy, GaussianPolicy):
            return sample_action(self.policy, observation, task, self._generator)
        return self.policy.act(observation, task)


@torch.no_grad()
def sample_action(
    policy: GaussianPolicy,
    observation: Mapping[str, Any],
    task: int,
    generator: torch.Generator | None = None,
) -> np.ndarray:
    """One sample ``tanh(mu + sigma * eps)``, (A,) float32 in [-1, 1] (Haarnoja et al. 2018).

    Raises:
        KeyError: the observation has no ``observation.state``.
    """
    if "observation.state" not in observation:
        raise KeyError(f"observation needs 'observation.state'; got {sorted(observation)}")
    batch = {
        k: torch.as_tensor(np.asarray(v)).unsqueeze(0)
        for k, v in observation.items()
        if k == "observation.state" or k.startswith("observation.images.")
    }
    batch["observation.state"] = batch["observation.state"].float()
    batch["task_index"] = torch.tensor([task], dtype=torch.long)
    policy.eval()
    mean, log_std = policy.distribution(batch)
    eps = torch.randn(mean.shape, generator=generator)
    out: np.ndarray = torch.tanh(mean + log_std.exp() * eps)[0].numpy().astype(np.float32)
    return out
