"""The edge agent: one robot's control loop, recording, uplink and weight apply.

See :mod:`edge_agent.core` for the step, in full. Timing: the loop ticks at ``control_hz``
(the driver's rate unless the ``edge.control_hz`` setting overrides it). A step's *latency* is
the time from reading the observation to the row being queued for upload (policy, operator,
``send_action`` and recording); a step whose latency plus the wait exceeds the period is an
*overrun* and the next tick starts at once instead of bursting to catch up.
Each step's row is queued one step late, so that a stop in the middle of an episode can still
mark the last row ``truncated`` with its real final observation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_agent.config import EdgeSettings
from edge_agent.core import Driver, InterventionSource, Observation, PolicyRunner
from edge_agent.operators import NoOperator
from edge_agent.spool import _write_durably
from edge_agent.uplink import UplinkWorker

log = logging.getLogger(__name__)

Heartbeat = Callable[[str, int, Mapping[str, float]], object]


class WeightSource(Protocol):
    """Where new weights appear: ``current() -> (version, {name: tensor})``, version -1 = none.

    ``comms.receiver.WeightReceiver`` is one; :class:`StagedWeights` is the in-process one.
    """

    def current(self) -> tuple[int, Mapping[str, Any]]: ...


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


@dataclass
class LoopStats:
    """Control-loop accounting (latencies in seconds, last ``window`` steps)."""

    window: int = 20_000
    steps: int = 0
    overruns: int = 0
    episodes: int = 0
    interventions: int = 0
    discarded_episodes: int = 0
    weight_swaps: int = 0
    weight_errors: int = 0
    labels: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})
    latencies: deque[float] = field(default_factory=deque)
    periods: deque[float] = field(default_factory=deque)

    def record(self, latency: float, period: float | None) -> None:
        self.steps += 1
        self.latencies.append(latency)
        if len(self.latencies) > self.window:
            self.latencies.popleft()
        if period is not None:
            self.periods.append(period)
            if len(self.periods) > self.window:
                self.periods.popleft()

    def percentiles_ms(self) -> dict[str, float]:
        lat = np.asarray(self.latencies, np.float64) * 1e3
        per = np.asarray(self.periods, np.float64)
        out = {
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else 0.0,
            "latency_p99_ms": float(np.percentile(lat, 99)) if lat.size else 0.0,
            "latency_max_ms": float(lat.max()) if lat.size else 0.0,
            "loop_hz": float(1.0 / per.mean()) if per.size else 0.0,
            "period_p99_ms": float(np.percentile(per, 99) * 1e3) if per.size else 0.0,
        }
        return out


class EdgeAgent:
    """Runs one robot.

    Args:
        driver: the robot (hal's ``RobotDriver`` or anything with its shape).
        runner: the novice (:class:`~edge_agent.inference.LocalPolicyRunner` or remote).
        uplink: the robot's :class:`~edge_agent.uplink.UplinkWorker` (spool + sender), started.
        settings: the ``edge:`` settings.
        robot_id / run_id: stored in every row.
        tasks: task names; episode ``i`` runs ``tasks[i % len(tasks)]`` unless ``run`` is given
            one. The policy gets the task's index in this list.
        operator: intervention source (default: nobody).
        weights: where new policy versions appear (default: none).
        heartbeat: ``(state, applied_version, stats) -> None``, called every
            ``heartbeat_interval_s`` from a background thread; errors are logged, never raised.
    """

    def __init__(
        self,
        driver: Driver,
        runner: PolicyRunner,
        uplink: UplinkWorker,
        settings: EdgeSettings,
        *,
        robot_id: str,
        run_id: str,
        tasks: Sequence[str],
        operator: InterventionSource | None = None,
        weights: WeightSource | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        if not tasks:
            raise ValueError("an edge agent needs at least one task")
        self.driver = driver
        self.runner = runner
        self.uplink = uplink
        self.settings = settings
        self.robot_id = robot_id
        self.run_id = run_id
        self.tasks = list(tasks)
        self.operator: InterventionSource = operator or NoOperator()
        self.weights = weights
        self.heartbeat = heartbeat
        self.stats = LoopStats()
        self.state = "idle"
        self._stop = threading.Event()
        self._failed_version = -1
        self._state_file = Path(uplink.spool.directory) / "agent_state.json"
        self.next_episode_index = self._load_episode_index()
        hz = settings.control_hz or float(driver.control_hz)
        self.period = 1.0 / hz

    # -- public ----------------------------------------------------------------------------

    @property
    def applied_version(self) -> int:
        return self.runner.policy_version

    def stop(self) -> None:
        """Finish the current step, close the episode as truncated, return from ``run``."""
        self._stop.set()

    def report(self) -> dict[str, float]:
        """Heartbeat statistics: loop timing, interventions, spool and uplink counters."""
        s = self.stats
        spool = self.uplink.spool
        out = self.stats.percentiles_ms()
        out.update(
            steps=float(s.steps),
            overruns=float(s.overruns),
            episodes=float(s.episodes),
            interventions=float(s.interventions),
            discarded_episodes=float(s.discarded_episodes),
            weight_swaps=float(s.weight_swaps),
            weight_errors=float(s.weight_errors),
            spool_bytes=float(spool.nbytes),
            spool_batches=float(len(spool)),
            dropped_steps=float(spool.dropped_steps),
            invalid_steps=float(self.uplink.stats.invalid),
            acked_seq=float(spool.acked_seq),
            next_seq=float(spool.next_seq),
            holds=float(getattr(self.runner, "holds", 0)),
        )
        return out

    def run(self, episodes: int | None = None, task: str | None = None) -> dict[str, float]:
        """Run ``episodes`` episodes (None: until :meth:`stop`); returns :meth:`report`.

        Raises:
            ValueError: ``task`` is not one of the agent's tasks.
            hal's DriverError subclasses: the robot failed (the episode so far is kept).
        """
        if task is not None and task not in self.tasks:
            raise ValueError(f"task {task!r} is not one of {self.tasks}")
        self._stop.clear()
        if self.settings.realtime_priority is not None:
            _set_realtime(self.settings.realtime_priority)
        self.driver.connect()
        beat_stop = threading.Event()
        beat_thread = None
        if self.heartbeat is not None:
            beat_thread = threading.Thread(
                target=self._beat_loop, args=(beat_stop,), name="edge-heartbeat", daemon=True
            )
            beat_thread.start()
        self.state = "running"
        try:
            done = 0
            while (episodes is None or done < episodes) and not self._stop.is_set():
                name = task or self.tasks[self.next_episode_index % len(self.tasks)]
                self._episode(name)
                done += 1
        finally:
            self.state = "estopped" if self.state == "estopped" else "stopped"
            self.uplink.flush()
            beat_stop.set()
            if beat_thread is not None:
                beat_thread.join(5)
                self._beat()  # the final numbers of this run
        return self.report()

    # -- the loop ----------------------------------------------------------------------------

    def _episode(self, task: str) -> None:
        self._apply_weights()  # an episode start is always a safe boundary
        episode_index = self.next_episode_index
        self.next_episode_index += 1
        self._save_episode_index()
        task_index = self.tasks.index(task)
        obs = self.driver.reset(task=task)
        self.runner.reset()
        self.operator.reset()
        held: list[dict[str, Any]] = []
        hold_all = self.settings.episode_commit == "episode_end"
        emit = held.append if hold_all else self.uplink.submit
        pending: dict[str, Any] | None = None
        t0 = time.monotonic()
        next_tick = t0
        last_tick: float | None = None
        frame = 0
        limit = self.settings.max_episode_steps
        label: str | None = None
        while True:
            start = time.monotonic()
            if frame == 0:
                t0 = next_tick = start  # timestamp 0 at the first step, as LeRobot stores it
            if self.settings.weight_apply_at == "chunk_boundary" and self.runner.at_chunk_boundary:
                self._apply_weights()
            proposed, version = self.runner.act(obs, task_index)
            op = self.operator.step(obs, proposed)
            command = op.action if (op.is_intervention and op.action is not None) else proposed
            sent = np.asarray(self.driver.send_action({"action": command})["action"], np.float32)
            intervening = bool(op.is_intervention)
            if isinstance(self.operator, NoOperator):
                # Only with no source attached may the robot's own device (a leader arm that
                # overrode this step) claim it; an attached source's flag is never overridden.
                info = getattr(self.driver.episode, "info", None) or {}
                intervening = bool(info.get("is_intervention", False))
            if hasattr(self.runner, "last_executed"):
                self.runner.last_executed = sent
            next_obs = self.driver.get_observation()
            ep = self.driver.episode
            terminated, truncated = bool(ep.terminated), bool(ep.truncated)
            if limit is not None and frame + 1 >= limit:
                truncated = True
            if op.command == "estop":
                self.driver.estop()
                self.state = "estopped"
                self._stop.set()
            elif op.command in ("success", "failure"):
                label = op.command
                terminated = True
            elif op.command == "rerecord":
                label = "rerecord"
                truncated = True
            if pending is not None:
                emit(pending)
            pending = {
                "robot_id": self.robot_id,
                "run_id": self.run_id,
                "task": task,
                "episode_index": episode_index,
                "frame_index": frame,
                "timestamp": start - t0,
                "reward": float(ep.reward),
                "terminated": terminated,
                "truncated": truncated,
                "is_intervention": intervening,
                "policy_version": int(version),
                "action": sent,
                "action.policy": None if np.array_equal(proposed, sent) else proposed,
                "action.operator": (
                    op.action
                    if op.is_intervention
                    and op.action is not None
                    and not np.array_equal(op.action, sent)
                    else None
                ),
                **{k: v for k, v in obs.items() if k.startswith("observation.")},
            }
            if intervening:
                self.stats.interventions += 1
            frame += 1
            end_episode = terminated or truncated or self._stop.is_set()
            if end_episode:
                pending["truncated"] = pending["truncated"] or not pending["terminated"]
                pending.update(_final(next_obs))
                emit(pending)
            now = time.monotonic()
            self.stats.record(now - start, None if last_tick is None else start - last_tick)
            last_tick = start
            if end_episode:
                break
            obs = next_obs
            next_tick += self.period
            if now > next_tick:
                self.stats.overruns += 1
                next_tick = now
            else:
                time.sleep(next_tick - now)
        self.stats.episodes += 1
        if label in ("success", "failure"):
            self.stats.labels[label] += 1
        if label == "rerecord" and hold_all:
            self.stats.discarded_episodes += 1
            self.next_episode_index -= 1  # the episode never existed: reuse its index
            self._save_episode_index()
            return
        if label == "rerecord":
            log.warning("rerecord in stream mode: episode %d was already uploaded", episode_index)
        for rec in held:
            self.uplink.submit(rec)
        self._log_episode(episode_index, task, frame, label)

    # -- weights -----------------------------------------------------------------------------

    def _apply_weights(self) -> None:
        if self.weights is None:
            return
        version, tensors = self.weights.current()
        if version <= self.runner.policy_version or version == self._failed_version:
            return
        try:
            self.runner.set_weights(version, tensors)
            self.stats.weight_swaps += 1
        except ValueError as exc:
            self._failed_version = version
            self.stats.weight_errors += 1
            log.error("keeping policy version %d: %s", self.runner.policy_version, exc)

    # -- persistence -------------------------------------------------------------------------

    def _load_episode_index(self) -> int:
        if not self._state_file.exists():
            return 0
        try:
            return int(json.loads(self._state_file.read_text())["next_episode_index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self._state_file}: unreadable agent state ({exc})") from None

    def _save_episode_index(self) -> None:
        data = json.dumps({"next_episode_index": self.next_episode_index}).encode()
        _write_durably(self._state_file, data)

    def _log_episode(self, index: int, task: str, steps: int, label: str | None) -> None:
        line = {"episode_index": index, "task": task, "steps": steps, "label": label}
        with open(Path(self.uplink.spool.directory) / "episodes.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def _beat_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.heartbeat_interval_s):
            self._beat()

    def _beat(self) -> None:
        assert self.heartbeat is not None
        try:
            self.heartbeat(self.state, self.applied_version, self.report())
        except Exception as exc:  # a cloud outage must not stop the robot
            log.info("heartbeat failed: %s", exc)


def _set_realtime(priority: int) -> None:
    """SCHED_FIFO for the calling thread (pid 0 = this thread on Linux); warn when refused."""
    import os

    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, PermissionError, OSError) as exc:
        log.warning("control thread keeps the default scheduler (SCHED_FIFO refused: %s)", exc)


def _final(next_obs: Observation) -> dict[str, Any]:
    return {f"next.{k}": v for k, v in next_obs.items() if k.startswith("observation.")}
