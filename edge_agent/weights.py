"""Policy versions on the robot: the in-process weight slot and the rule that applies them.

A new version is offered by a :class:`~edge_agent.core.WeightSource` at any time, from any
thread; :class:`WeightApplier` swaps it into the runner only at a *safe boundary*: an episode
start always, and inside an episode as ``edge.weight_apply_at`` says (``chunk_boundary``: when
the runner's action chunk is used up; ``every_n_steps``: at such a boundary on frames
``0, n, 2n...``; ``episode_end``: never inside an episode).

Staleness (in :class:`~edge_agent.stats.LoopStats`): ``version_lag`` is how many versions the
robot had received but not yet applied when it acted, ``apply_delay`` how long (seconds) the
robot held a newer version than the one it ran before a boundary let it apply one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_agent.config import EdgeSettings
from edge_agent.core import PolicyRunner, WeightSource
from edge_agent.rewards import RewardSource
from edge_agent.stats import LoopStats

log = logging.getLogger(__name__)


class StagedWeights:
    """A thread-safe single slot: ``offer`` a version from any thread; the latest wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: tuple[int, Mapping[str, Any]] = (-1, {})

    def offer(self, version: int, weights: Mapping[str, Any]) -> None:
        with self._lock:
            if version > self._current[0]:
                self._current = (version, weights)

    def current(self) -> tuple[int, Mapping[str, Any]]:
        with self._lock:
            return self._current


class WeightApplier:
    """Moves versions from ``source`` into ``runner`` at safe boundaries (see the module).

    Each version the runner takes is also offered to ``rewards`` (the agent's reward source,
    ``RewardSource.offer_weights``: a reward classifier shipped beside the policy) and to each
    of ``also`` (the help risk's ``offer_weights``: a probe shipped beside it, an ensemble).

    With ``source`` None every method does nothing (a robot without a weight source). A
    version the runner refuses (``set_weights`` raises ValueError) is logged, counted in
    ``weight_errors`` and never tried again; the running version stays.
    """

    def __init__(
        self,
        source: WeightSource | None,
        runner: PolicyRunner,
        settings: EdgeSettings,
        stats: LoopStats,
        rewards: RewardSource | None = None,
        also: Sequence[Callable[[Mapping[str, Any]], None]] = (),
    ) -> None:
        self.source = source
        self.rewards = rewards
        self.also = list(also)
        self.runner = runner
        self.settings = settings
        self.stats = stats
        # Since when the source has offered something newer than the applied version.
        self._newer_since: float | None = None
        self._failed_version = -1

    def awaiting_first(self) -> bool:
        """No episode may start yet: ``wait_for_first_weights`` is on and no version exists."""
        return (
            self.settings.wait_for_first_weights
            and self.source is not None
            and self.runner.policy_version < 0
            and self.source.current()[0] < 0
        )

    def due(self, frame: int) -> bool:
        """Whether a new version may apply before step ``frame`` of an episode (its start is
        always a boundary; the caller applies there)."""
        at = self.settings.weight_apply_at
        if at == "episode_end" or not self.runner.at_chunk_boundary:
            return False
        if at == "every_n_steps":
            return frame % self.settings.weight_apply_every_steps == 0
        return True  # chunk_boundary

    def account(self, version: int) -> None:
        """Count the staleness of a step acted with ``version`` (-1: no policy acted)."""
        if self.source is None:
            return
        offered = self.source.current()[0]
        if offered > self.runner.policy_version and self._newer_since is None:
            self._newer_since = time.monotonic()
        lag = max(0, offered - version) if version >= 0 else 0
        s = self.stats
        s.version_lag_sum += lag
        s.version_lag_max = max(s.version_lag_max, lag)
        s.stale_steps += lag > 0

    def apply(self) -> None:
        """Swap in the source's newest version now, if it is newer than the runner's."""
        if self.source is None:
            return
        version, tensors = self.source.current()
        if version > self.runner.policy_version and self._newer_since is None:
            self._newer_since = time.monotonic()
        if version <= self.runner.policy_version or version == self._failed_version:
            return
        try:
            self.runner.set_weights(version, tensors)
            if self.rewards is not None:
                self.rewards.offer_weights(tensors)
            for offer in self.also:
                offer(tensors)
            self.stats.weight_swaps += 1
            delay = time.monotonic() - (self._newer_since or time.monotonic())
            self._newer_since = None
            self.stats.apply_delay_sum += delay
            self.stats.apply_delay_max = max(self.stats.apply_delay_max, delay)
        except ValueError as exc:
            self._failed_version = version
            self.stats.weight_errors += 1
            log.error("keeping policy version %d: %s", self.runner.policy_version, exc)
