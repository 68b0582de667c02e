"""One run from lease to report: :class:`RunDriver` (a thread in the cloud process).

Life of a run (every state change is an event in the metadata store)::

    pending/resuming -> lease robots (hal scheduler, beside the learner's Ray resources) ->
    open the buffer (+ demonstrations on a fresh run) -> learner process (supervised) starts
    while the robots' computers are assigned to the run over their Control streams
    (``assignments``) -> robots acting and first version out: the run's clock starts ->
    running/degraded
        loop: supervise the learner, follow the robots' assignments (re-assign a robot that
              comes back idle), hand new weight versions to comms, snapshot the policy for
              evaluation, metrics, reconcile robots, stop conditions
        pause: robots hold at a step boundary (a Control command to each edge agent, re-sent
               until its heartbeat says ``paused``; spools keep draining); the leases, the Ray
               placement, the assignments and the learner are KEPT; resume continues the
               episodes
    -> stopping: robots are released (each finishes its episode and drains its spool, then
       goes idle for the next run), learner's final checkpoint, final
       evaluation, report -> leases released -> finished / stopped (or crashed with a reason:
       at once, with its refusal, when the learner refuses the run)

Durable state of a run lives in its directory: ``spec.json``, ``buffer/`` (every acknowledged
step), ``checkpoints/``, ``weights/``, ``evals.jsonl`` and
``progress.jsonl`` (the curves), ``progress.json`` (elapsed time and robot-hours), and the
final ``report.json`` with its plots. A resumed run picks all of these up.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_learner.run_plan import RunPlan
from edge_agent.assignment import Assignment
from foundation.runspec import RunSpec
from foundation.store.models import RunState
from foundation.store.runs import set_state
from runs import leasing, live_state, stop_conditions
from runs.assignments import RobotAssignments, split_demonstrations
from runs.cadence import Every
from runs.clock import RunClock
from runs.cloud_context import CloudContext as CloudContext
from runs.disk_notice import DiskFullNotice
from runs.eval_record import EvaluationRecorder
from runs.help_dispatch import SimulatedOperators
from runs.hold import RobotHold
from runs.learning import LearnerRefused, RunLearning
from runs.operator_effort import OperatorEffort
from runs.pausing import PauseFollower
from runs.progress import RunProgress
from runs.progress_file import disk_full
from runs.run_assignment import run_assignment
from runs.run_end import quiet_teardown, teardown
from runs.run_evals import run_evaluations
from runs.supervisor import CrashLoop, ProcessSupervisor

log = logging.getLogger(__name__)


class RunDriver:
    """Drives one run; :meth:`start` runs it on a thread until it ends or is asked to stop.

    The parts it drives: the robots' leases (``hal.scheduler.RobotAllocation``), the learning
    side (:class:`~runs.learning.RunLearning`: buffer, batch server,
    learner process, weight feed), the robots' assignments
    (:class:`~runs.assignments.RobotAssignments`), the evaluations
    (:class:`~runs.eval_record.EvaluationRecorder`), the live figures
    (:class:`~runs.progress.RunProgress`), the run's clock and the
    robots' hold (pause, :mod:`runs.pausing`); its end: :mod:`runs.run_end`.

    Args:
        ctx: the cloud's shared services.
        run_id / spec / run_dir: the run.
        on_end: called with the driver when its thread ends.
    """

    def __init__(
        self,
        ctx: CloudContext,
        run_id: str,
        spec: RunSpec,
        run_dir: Path,
        on_end: Callable[[RunDriver], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.run_id = run_id
        self.run_dir = run_dir
        self.plan = RunPlan.from_spec(spec)
        self.spec = self.plan.spec  # its policy kind filled in
        self.params = self.plan.params
        self.on_end = on_end
        self.orchestration = ctx.settings.orchestration
        self.stop_reason: str | None = None  # set: end the run (requested or condition)
        self.detach = False  # set: cloud shutting down, leave the run to be resumed
        self.final_state = RunState.FINISHED
        self.result: dict[str, Any] = {}
        self.progress: dict[str, Any] = {"state": "pending"}
        self.want_pause = False  # set/cleared by the run manager; the loop follows it
        self.hold = RobotHold(ctx.store, ctx.server, run_id)
        self.pausing = PauseFollower(self.hold, self._event)
        self.clock = RunClock()
        self.allocation: Any = None
        self.features: Any = None  # hal.compat.RunFeatures of the leased robots
        self.learning: RunLearning | None = None
        self.agents: RobotAssignments | None = None
        self.evaluations: EvaluationRecorder | None = None
        self.figures = RunProgress(ctx.store, run_id, run_dir)
        self.effort = OperatorEffort(ctx.store, run_id, run_dir, spec.help.operators)
        help_people = spec.help.operators if spec.help.simulated_operators else None
        self.help_people = (
            SimulatedOperators(ctx.store, ctx.server, run_id, help_people)
            if help_people is not None
            else None
        )
        self.disk_full = DiskFullNotice(run_id, self._event)
        self.learner_restarts_base = 0
        self._checkpoint_requested = False
        self._thread = threading.Thread(target=self._main, name=f"run-{run_id}", daemon=True)

    # -- control from the run manager ----------------------------------------------------------

    def start(self) -> RunDriver:
        self._thread.start()
        return self

    def request_stop(
        self, reason: str = "stopped by request", final: RunState = RunState.STOPPED
    ) -> None:
        self.final_state = final
        self.stop_reason = reason

    def request_checkpoint(self) -> None:
        self._checkpoint_requested = True

    def request_pause(self) -> None:
        """Hold the robots at the next loop turn, keeping leases, placement and learner."""
        self.want_pause = True

    def request_resume(self) -> None:
        """Let the held robots of a paused run go on (same robots, same episodes)."""
        self.want_pause = False

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def paused(self) -> bool:
        """The robots were told to hold (the leases are kept)."""
        return self.clock.paused

    @property
    def learner(self) -> ProcessSupervisor | None:
        """The supervised learner process (its ``pid``: ``robofleet demo --kill-learner-at``)."""
        return None if self.learning is None else self.learning.learner

    @property
    def robot_reports(self) -> dict[str, dict[str, float]]:
        """Robot name -> its edge agent's final report (``EdgeAgent.report()``: steps,
        episodes, interventions, staleness...), as its robot computer reported it when it
        was released; heartbeats carry the same figures while it runs."""
        return {} if self.agents is None else self.agents.reports

    # -- the run ---------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> None:
        self.ctx.store.record_event(kind, run_id=self.run_id, **data)

    def _going(self) -> bool:
        return self.stop_reason is None and not self.detach

    def _main(self) -> None:
        store = self.ctx.store
        resumed = (self.run_dir / "progress.json").exists()
        try:
            self._setup(resumed)
            self._loop()
            if self.detach:
                teardown(self, final=False)
                return
            teardown(self, final=True)
            set_state(
                store, self.run_id, self.final_state, self.stop_reason or "", **self._summary()
            )
        except (CrashLoop, LearnerRefused) as exc:  # restarting cannot help (any more)
            log.error("run %s crashed: %s", self.run_id, exc)
            quiet_teardown(self)
            set_state(store, self.run_id, RunState.CRASHED, str(exc))
        except Exception as exc:
            log.exception("run %s failed", self.run_id)
            quiet_teardown(self)
            set_state(store, self.run_id, RunState.CRASHED, f"{type(exc).__name__}: {exc}")
        finally:
            if self.on_end is not None:
                self.on_end(self)

    def _summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.result.items() if isinstance(v, int | float | str)}

    # -- setup -----------------------------------------------------------------------------

    def _setup(self, resumed: bool) -> None:
        """Lease, then learning side, evaluator and edge agents side by side; the clock
        starts when the robots are up and the first version is out."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "spec.json").write_text(self.spec.model_dump_json(indent=2))
        if resumed:
            self._carry_on()
        self._lease(patient=resumed)
        self.learning = RunLearning(
            self.ctx, self.run_id, self.run_dir, self.plan, self.features, self._event
        )
        self.figures.offline_rows = self.learning.demo_rows
        self.evaluations = run_evaluations(
            self.ctx.store,
            self.run_id,
            self.run_dir,
            self.plan,
            robots=lambda: [] if self.agents is None else self.agents.names,
            robot_specs=self._robot_specs,
            features=self.features,
            orchestration=self.orchestration,
            on_event=self._event,
        )
        setup_t0 = time.monotonic()
        if self.learning.serves_an_earlier_version:
            # Robots would act on it at once: they start when this learner's first version
            # (published once its start checks passed) is out, none if it refuses the run.
            self._wait_first_version()
        self._start_agents()
        # Version 1 comes after the robots' demonstrations and the warm start on them.
        demos = self.spec.demonstrations
        self._wait_first_version(300.0 + (demos.wait_s if demos.episodes_per_task else 0.0))
        # The run's clock (stop.minutes, wall_s of every evaluation) starts when the robots are
        # up and the first version is out, so robots act from its first second; the learner's
        # start-up, the BC warm start and the agents' start-up before it are reported apart as
        # ``setup_s``, so a loaded machine cannot eat the budget.
        t0 = self.clock.start()
        self.progress.setdefault("setup_s", round(t0 - setup_t0, 2))
        if not (self.run_dir / "evals.jsonl").exists():
            self.snapshot_for_eval()  # the initial policy's success (version 1)
        # A pause or stop requested during setup stays; the loop acts on it.
        self._set_live_state(only_from={RunState.PENDING, RunState.RESUMING})

    def _carry_on(self) -> None:
        """A resumed run's clock and counters, as its last attempt left them."""
        p = json.loads((self.run_dir / "progress.json").read_text())
        self.clock = RunClock(float(p.get("elapsed_s", 0.0)), float(p.get("robot_seconds", 0.0)))
        self.learner_restarts_base = int(p.get("learner_restarts", 0))

    def _lease(self, patient: bool) -> None:
        """Lease the robots beside the learner's resources (after a cloud restart robots may
        be offline until their next heartbeat: ``patient`` waits for them).

        Raises:
            hal.scheduler.SchedulingError: not enough robots or no learner placement.
            hal.compat.SpecMismatch: two leased robots differ in a feature (named).
        """
        from hal.compat import run_features

        ctx = self.ctx
        self.allocation = leasing.allocation_for(ctx.store, self.run_id, self.spec)
        leasing.acquire(self.allocation, ctx.settings.hal, patient)
        try:
            self.features = run_features(self._robot_specs())
        except BaseException:
            self.allocation.release()  # all or nothing: robots that cannot share a policy
            raise
        ctx.server.invalidate_auth()

    def _robot_specs(self) -> dict[str, dict[str, Any]]:
        """Name -> enrolled spec of each leased robot."""
        return leasing.robot_specs(self.ctx.store, self.allocation.members)

    def assignment(self) -> Assignment:
        """What every robot of the run is told (each gets its own seed)."""
        return run_assignment(self.run_id, self.plan, self.ctx.settings.edge)

    def _start_agents(self) -> None:
        """Assign the leased robots: their computers build the run's agent (connect,
        subscribe, wait for the first version) while the learner starts and warm-starts."""
        assert self.allocation is not None and self.learning is not None
        ctx, route = self.ctx, self.learning.ingest_route
        self.agents = RobotAssignments(
            ctx.store, ctx.server, self.run_id, self.assignment(), self._event, route=route
        )
        members = sorted(self._members().items())
        per_task = self.spec.demonstrations.episodes_per_task
        for i, (name, robot_id) in enumerate(members):
            demos = split_demonstrations(self.spec.tasks, per_task, len(members), i)
            self.agents.start(name, robot_id, i, demos)
        ready_s = self.orchestration.robots_ready_timeout_s
        self.agents.wait_acting(ready_s, self._going, self._poll_learner)

    def _wait_first_version(self, timeout_s: float = 300.0) -> None:
        assert self.learning is not None
        deadline = time.monotonic() + timeout_s
        while not (self.learning.version or self.learning.publish_new_weights()):
            self._poll_learner()
            if not self._going():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no policy version within {timeout_s:.0f}s; see learner.log")
            time.sleep(0.2)

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self.learning is not None and self.agents is not None
        every = self.ctx.eval_every_s or self.spec.evaluation.every_seconds
        start = time.monotonic()
        metrics = Every(2.0)  # the first turn records
        hold, follow = Every(1.0, start), Every(1.0, start)
        reconcile = Every(self.ctx.settings.hal.heartbeat_interval_s * 5, start)
        while self._going():
            try:
                now = time.monotonic()
                self.clock.tick(len(self.agents.acting))  # robot-hours count robots acting
                self._poll_learner()  # CrashLoop ends the run as crashed
                if self._checkpoint_requested:
                    self._checkpoint_requested = False
                    self.learning.checkpoint()
                self.learning.publish_new_weights()
                self._follow_pause()
                if hold.due(now):
                    self._follow_hold()
                self._collect_eval()
                if self.help_people is not None and not self.paused:
                    self.help_people.turn()
                if metrics.due(now):
                    self.record_progress()
                if follow.due(now):  # a restarted robot is told to hold by _follow_hold
                    self.agents.follow()
                if not self.paused:  # robots hold still: nothing to evaluate, no robot to add
                    assert self.evaluations is not None
                    if now - self.evaluations.last_at >= every:
                        self.snapshot_for_eval()
                    if reconcile.due(now):
                        self._reconcile()
                self._check_stop_conditions()
            except OSError as exc:
                if not disk_full(exc):
                    raise
                # A file of the run (progress, evaluations, the best version) could not be
                # written: the run goes on and writes it at a later turn.
                self.disk_full.note(exc)
            time.sleep(0.25)

    def _poll_learner(self) -> None:
        assert self.learning is not None
        o = self.orchestration
        self.learning.poll(o.learner_hang_s, o.learner_warmup_hang_s)

    def _members(self) -> dict[str, int]:
        assert self.allocation is not None
        return leasing.members(self.allocation)

    def _set_live_state(self, reason: str = "", *, only_from: set[RunState]) -> None:
        assert self.allocation is not None
        store, count = self.ctx.store, self.spec.robots.count
        live_state.set_live_state(
            store, self.run_id, self.allocation, count, self.progress, reason, only_from=only_from
        )

    def _follow_pause(self) -> None:
        """Hold or release the robots as the run manager asks (``runs.pausing``)."""
        self.pausing.follow_pause(
            self.want_pause,
            self.clock,
            self._members,
            self.progress,
            lambda: self._set_live_state("resumed after a pause", only_from={RunState.RESUMING}),
        )

    def _follow_hold(self) -> None:
        """Re-send pause/resume to robots whose heartbeat disagrees; note when all hold."""
        if self.allocation is None:
            return
        self.pausing.follow_hold(self.paused, self._members(), self.allocation.active)

    def _check_stop_conditions(self) -> None:
        reason = stop_conditions.reached(self.spec.stop, self.clock.elapsed(), self.progress)
        if reason is not None:
            self.request_stop(reason, RunState.FINISHED)

    def _reconcile(self) -> None:
        assert self.agents is not None
        live_state.reconcile(
            self.ctx.store, self.run_id, self.allocation, self.agents, self.progress
        )

    # -- evaluation and progress -----------------------------------------------------------

    def snapshot_for_eval(self, final: bool = False) -> None:
        """Offer the latest version to the run's evaluations (``final``: the run's last)."""
        assert self.learning is not None and self.evaluations is not None
        learning = self.learning
        self.evaluations.snapshot(
            learning.version,
            learning.latest_bytes,
            self.clock,
            lambda: self.figures.counts(learning.buffer),
            final=final,
        )

    def _collect_eval(self, wait: bool = False) -> None:
        if self.evaluations is not None:
            got = self.evaluations.collect(wait)
            if got is not None:
                self.progress.update(got)

    def learner_restarts(self) -> int:
        """The learner's restarts over every attempt of the run."""
        learner = self.learner
        return self.learner_restarts_base + (learner.restarts if learner else 0)

    def record_progress(self) -> None:
        """Record the run's live figures and its operators' effort now."""
        assert self.learning is not None and self.agents is not None
        learner = self.learning.learner
        self.progress.update(
            self.figures.record(
                self.learning.buffer,
                self.clock,
                self.learning.stats,
                restarts=self.learner_restarts(),
                hangs=learner.hangs,
                robots=self.agents.names,
                version=self.learning.version,
                online_shares=self.learning.online_shares,
            )
        )
        self.progress["effort"] = self.effort.record(
            self.clock.elapsed(), self.agents.names, int(self.progress.get("env_steps", 0))
        )
