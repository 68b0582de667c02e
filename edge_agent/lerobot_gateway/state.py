"""What the actor-facing service and the cloud-facing gateway share, under one condition.

The gateway sets the run (an assignment opens it, a release closes it) and the latest
parameters (each new run version, converted); the service waits on them: ``Ready`` until both
exist, ``StreamParameters`` for a version newer than the one it sent, ``SendTransitions`` for
a run to store into. Counters and the latest interaction metrics go out in heartbeats.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from edge_agent.lerobot_gateway.replay import ReplayGuard


class RunSink(Protocol):
    """The run the gateway is assigned to, as the service sees it."""

    run_id: str
    replay_guard: ReplayGuard
    replaces_reward: bool  # the run's reward source replaces the one LeRobot's actor sent

    def store_transitions(self, data: bytes, policy_version: int) -> tuple[int, list[str]]:
        """Store the transitions of one LeRobot message durably; (stored, refusal reasons).

        Raises:
            edge_agent.lerobot_gateway.transitions.TransitionRefused: the whole message is
                unreadable.
        """
        ...


@dataclass
class Counters:
    """Totals since the gateway started (transitions, messages, interactions, streams)."""

    transitions_stored: int = 0
    transitions_refused: int = 0
    rewards_replaced: int = 0  # stored steps whose reward is the run's source's, not LeRobot's
    messages_refused: int = 0
    messages_replayed: int = 0  # sent again by a retried call, not stored twice
    interactions: int = 0
    interactions_refused: int = 0
    parameters_sent: int = 0
    parameter_errors: int = 0
    parameter_streams: int = 0  # open StreamParameters calls
    streams_freed: int = 0  # StreamParameters calls ended by a gone actor

    def as_stats(self) -> dict[str, float]:
        return {f"lerobot.{k}": float(v) for k, v in vars(self).items()}


@dataclass
class GatewayState:
    """Shared by the service's threads and the gateway's (every field under ``cond``)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    run: RunSink | None = None
    parameters: tuple[int, bytes] | None = None  # (run version, LeRobot's bytes)
    handed_version: int = -1  # the version last sent whole to an actor
    stopping: bool = False
    counters: Counters = field(default_factory=Counters)
    metrics: dict[str, float] = field(default_factory=dict)
    refusals: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    def set_run(self, run: RunSink | None) -> None:
        """Assign (or, with None, release); a release also forgets the run's parameters."""
        with self.cond:
            self.run = run
            if run is None:  # versions are a run's: the next run starts from none
                self.parameters = None
                self.handed_version = -1
            self.cond.notify_all()

    def set_parameters(self, version: int, data: bytes) -> None:
        """Offer ``version``'s bytes to every actor stream (an older one is ignored)."""
        with self.cond:
            if self.parameters is None or version > self.parameters[0]:
                self.parameters = (version, data)
                self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def ready(self) -> bool:
        """Assigned to a run that has a first version."""
        return self.run is not None and self.parameters is not None

    def wait_ready(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.ready() or self.stopping, timeout) and (
                not self.stopping
            )

    def wait_newer(self, sent: int, timeout: float) -> tuple[int, bytes] | None:
        """The latest parameters when newer than ``sent`` (within ``timeout`` s), else None."""
        with self.cond:

            def newer() -> bool:
                return self.stopping or (self.parameters is not None and self.parameters[0] > sent)

            if not self.cond.wait_for(newer, timeout) or self.stopping:
                return None
            return self.parameters

    def wait_run(self, timeout: float) -> RunSink | None:
        with self.cond:
            self.cond.wait_for(lambda: self.run is not None or self.stopping, timeout)
            return None if self.stopping else self.run

    def refuse(self, reason: str) -> None:
        with self.cond:
            self.refusals.append(reason)

    def snapshot(self) -> tuple[dict[str, float], list[str]]:
        """Heartbeat stats (counters, the actor's latest episode metrics) and recent refusals."""
        with self.cond:
            stats = {**self.counters.as_stats(), **self.metrics}
            stats["lerobot.handed_version"] = float(self.handed_version)
            return stats, list(self.refusals)
