"""The edge agent: one robot's control loop, recording, uplink and weight apply.

See :mod:`edge_agent.core` for the step, in full. Timing: the loop ticks at ``control_hz``
(the driver's rate unless the ``edge.control_hz`` setting overrides it). A step's *latency* is
the time from reading the observation to the row being queued for upload (policy, operator,
``send_action`` and recording); a step whose latency plus the wait exceeds the period is an
*overrun* and the next tick starts at once instead of bursting to catch up.
Each step's row is queued one step late, so that a stop in the middle of an episode can still
mark the last row ``truncated`` with its real final observation.

Cloud control (:mod:`edge_agent.control`): an e-stop latches the driver on the listener's
thread and wakes the loop, which closes the episode as truncated and holds until the latch is
cleared; a pause holds at the next step boundary in the middle of the episode (timestamps
skip the pause) and a resume continues it. The uplink keeps draining the spool meanwhile.

Weight staleness is measured at every step: ``version_lag`` is how many versions the robot
had received but not yet applied when it acted, ``apply_delay`` how long the robot held a
newer version than the one it ran before a safe boundary let it apply one.
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
from edge_agent.control import CloudControl
from edge_agent.core import Driver, InterventionSource, Observation, PolicyRunner
from edge_agent.operators import NoOperator
from edge_agent.uplink import UplinkWorker
from robofleet.durable import atomic_write_bytes

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
    version_lag_sum: int = 0  # sum over steps of (received - applied) versions at act time
    version_lag_max: int = 0
    stale_steps: int = 0  # steps acted with a newer version already received
    apply_delay_sum: float = 0.0  # seconds received versions waited for their boundary
    apply_delay_max: float = 0.0
    hold_s: float = 0.0  # seconds held by a cloud e-stop or pause
    weights_wait_s: float = 0.0  # seconds waited for the first policy version
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
        self.control = CloudControl(
            driver,
            Path(uplink.spool.directory) / "control.jsonl",
            on_change=self._beat if heartbeat is not None else None,
        )
        # Since when the source has offered something newer than the applied version.
        self._newer_since: float | None = None
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
        self.control.changed.set()  # wake a held loop

    def clear_estop(self, reason: str = "local") -> None:
        """Release a cloud e-stop here at the robot (a human decision); the loop goes on."""
        self.control.handle("clear_estop", reason)

    @property
    def heartbeat_state(self) -> str:
        """``estopped`` / ``paused`` while the cloud holds the robot, else the loop's state."""
        if self.control.estopped or self.state == "estopped":
            return "estopped"
        if self.control.paused and self.state == "running":
            return "paused"
        return self.state

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
            version_lag_mean=s.version_lag_sum / s.steps if s.steps else 0.0,
            version_lag_max=float(s.version_lag_max),
            stale_steps=float(s.stale_steps),
            apply_delay_mean_s=s.apply_delay_sum / s.weight_swaps if s.weight_swaps else 0.0,
            apply_delay_max_s=s.apply_delay_max,
            hold_s=s.hold_s,
            weights_wait_s=s.weights_wait_s,
        )
        out.update(self.control.report())
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
                if self.control.holding:
                    self._hold()
                    continue
                if self._needs_first_weights():
                    self._wait_first_weights()
                    continue
                name = task or self.tasks[self.next_episode_index % len(self.tasks)]
                if self._episode(name):
                    done += 1
        finally:
            self.state = "estopped" if self.heartbeat_state == "estopped" else "stopped"
            self.uplink.flush()
            beat_stop.set()
            if beat_thread is not None:
                beat_thread.join(5)
                self._beat()  # the final numbers of this run
        return self.report()

    # -- the loop ----------------------------------------------------------------------------

    def _hold(self, in_episode: bool = False) -> float:
        """Send nothing while the cloud holds the robot (the uplink drains meanwhile); returns
        the seconds held. Returns at once on :meth:`stop`; ``in_episode`` (a pause inside an
        episode) also returns on an e-stop, so that the episode gets closed."""
        t0 = time.monotonic()
        self.uplink.flush()  # what is recorded so far goes to the spool and on to the cloud now

        def holding() -> bool:
            c = self.control
            return (c.paused and not c.estopped) if in_episode else c.holding

        while holding() and not self._stop.is_set():
            self.control.wait(0.1)
        held = time.monotonic() - t0
        self.stats.hold_s += held
        return held

    def _needs_first_weights(self) -> bool:
        return (
            self.settings.wait_for_first_weights
            and self.weights is not None
            and self.runner.policy_version < 0
            and self.weights.current()[0] < 0
        )

    def _wait_first_weights(self) -> None:
        """Hold until a version arrives (or a command or :meth:`stop` interrupts)."""
        t0 = time.monotonic()
        while self._needs_first_weights() and not self.control.holding:
            if self._stop.is_set():
                break
            self.control.wait(0.05)
        self.stats.weights_wait_s += time.monotonic() - t0

    def _episode(self, task: str) -> bool:
        """Run one episode; False when a cloud e-stop came before its first step."""
        self._apply_weights()  # an episode start is always a safe boundary
        episode_index = self.next_episode_index
        self.next_episode_index += 1
        self._save_episode_index()
        task_index = self.tasks.index(task)
        try:
            obs = self.driver.reset(task=task)
        except Exception:
            if not self.control.estopped:
                raise
            self.next_episode_index -= 1  # e-stopped before it began: it never existed
            self._save_episode_index()
            return False
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
            if self.control.paused and not self.control.estopped:
                t0 += self._hold(in_episode=True)  # at a step boundary; the clock skips it
                next_tick, last_tick = time.monotonic(), None
                if self._stop.is_set() and not self.control.estopped:
                    self._close_early(pending, obs, emit)
                    break
                if not self.control.estopped:
                    obs = self.driver.get_observation()  # the world may have moved meanwhile
            if self.control.estopped:
                self._close_early(pending, obs, emit)
                break
            start = time.monotonic()
            if frame == 0:
                t0 = next_tick = start  # timestamp 0 at the first step, as LeRobot stores it
            if self._boundary(frame):
                self._apply_weights()
            proposed, version = self.runner.act(obs, task_index)
            self._account_staleness(version)
            op = self.operator.step(obs, proposed)
            command = op.action if (op.is_intervention and op.action is not None) else proposed
            try:
                reply = self.driver.send_action({"action": command})
            except Exception:
                if not self.control.estopped:
                    raise
                # Latched between our check and the send: the robot refused, the step never
                # happened; the episode ends at the last executed step.
                self._close_early(pending, obs, emit)
                break
            sent = np.asarray(reply["action"], np.float32)
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
                # A cloud e-stop or pause wakes the loop at once; anything else sleeps on.
                while now < next_tick and not self.control.holding and not self._stop.is_set():
                    self.control.wait(next_tick - now)
                    now = time.monotonic()
        if frame == 0:  # e-stopped before the first step: the episode never happened
            self.next_episode_index -= 1
            self._save_episode_index()
            return False
        self.stats.episodes += 1
        if label in ("success", "failure"):
            self.stats.labels[label] += 1
        if label == "rerecord" and hold_all:
            self.stats.discarded_episodes += 1
            self.next_episode_index -= 1  # the episode never existed: reuse its index
            self._save_episode_index()
            return True
        if label == "rerecord":
            log.warning("rerecord in stream mode: episode %d was already uploaded", episode_index)
        for rec in held:
            self.uplink.submit(rec)
        self._log_episode(episode_index, task, frame, label)
        return True

    def _close_early(
        self, pending: dict[str, Any] | None, obs: Observation, emit: Callable[[Any], None]
    ) -> None:
        """End the episode at its last executed step (truncated, final observation ``obs``)."""
        if pending is None:
            return
        pending["truncated"] = pending["truncated"] or not pending["terminated"]
        pending.update(_final(obs))
        emit(pending)

    # -- weights -----------------------------------------------------------------------------

    def _boundary(self, frame: int) -> bool:
        """Whether a new version may apply before step ``frame`` (episode start is handled
        by the caller)."""
        at = self.settings.weight_apply_at
        if at == "episode_end" or not self.runner.at_chunk_boundary:
            return False
        if at == "every_n_steps":
            return frame % self.settings.weight_apply_every_steps == 0
        return True  # chunk_boundary

    def _account_staleness(self, version: int) -> None:
        if self.weights is None:
            return
        offered = self.weights.current()[0]
        if offered > self.runner.policy_version and self._newer_since is None:
            self._newer_since = time.monotonic()
        lag = max(0, offered - version) if version >= 0 else 0
        s = self.stats
        s.version_lag_sum += lag
        s.version_lag_max = max(s.version_lag_max, lag)
        s.stale_steps += lag > 0

    def _apply_weights(self) -> None:
        if self.weights is None:
            return
        version, tensors = self.weights.current()
        if version > self.runner.policy_version and self._newer_since is None:
            self._newer_since = time.monotonic()
        if version <= self.runner.policy_version or version == self._failed_version:
            return
        try:
            self.runner.set_weights(version, tensors)
            self.stats.weight_swaps += 1
            delay = time.monotonic() - (self._newer_since or time.monotonic())
            self._newer_since = None
            self.stats.apply_delay_sum += delay
            self.stats.apply_delay_max = max(self.stats.apply_delay_max, delay)
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
        atomic_write_bytes(self._state_file, data)

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
            self.heartbeat(self.heartbeat_state, self.applied_version, self.report())
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
