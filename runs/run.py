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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_learner.run_plan import RunPlan
from edge_agent.assignment import Assignment, run_edge_settings
from foundation.runspec import RunSpec
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import RunState
from foundation.store.runs import set_state
from runs import leasing, stop_conditions
from runs.assignments import RobotAssignments, split_demonstrations
from runs.cadence import Every
from runs.clock import RunClock
from runs.disk_notice import DiskFullNotice
from runs.eval_record import EvaluationRecorder, NoEvaluations
from runs.evaluations import SimulatorEvaluations
from runs.help_dispatch import SimulatedOperators
from runs.hold import RobotHold
from runs.learning import LearnerRefused, RunLearning
from runs.operator_effort import OperatorEffort
from runs.progress import RunProgress
from runs.progress_file import disk_full
from runs.promotion import promote_best
from runs.robot_evals import RobotEvaluations
from runs.supervisor import CrashLoop, ProcessSupervisor, RestartPolicy

log = logging.getLogger(__name__)


@dataclass
class CloudContext:
    """What every run of one cloud shares."""

    settings: Any
    store: MetadataStore
    server: Any  # comms.cloud.server.CloudServer
    server_address: str
    sinks: dict[str, Any]
    python: str
    routes: dict[str, Any] = field(default_factory=dict)  # run id -> a sharded run's ShardRoutes
    learner_restarts: RestartPolicy = field(default_factory=RestartPolicy)
    eval_every_s: float | None = None


class RunDriver:
    """Drives one run; :meth:`start` runs it on a thread until it ends or is asked to stop.

    The parts it drives: the robots' leases (``hal.scheduler.RobotAllocation``), the learning
    side (:class:`~runs.learning.RunLearning`: buffer, batch server,
    learner process, weight feed), the robots' assignments
    (:class:`~runs.assignments.RobotAssignments`), the evaluations
    (:class:`~runs.eval_record.EvaluationRecorder`), the live figures
    (:class:`~runs.progress.RunProgress`), the run's clock and the
    robots' hold (pause).

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
        self._held_reported = False
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
                self._teardown(final=False)
                return
            self._teardown(final=True)
            set_state(
                store, self.run_id, self.final_state, self.stop_reason or "", **self._summary()
            )
        except (CrashLoop, LearnerRefused) as exc:  # restarting cannot help (any more)
            log.error("run %s crashed: %s", self.run_id, exc)
            self._quiet_teardown()
            set_state(store, self.run_id, RunState.CRASHED, str(exc))
        except Exception as exc:
            log.exception("run %s failed", self.run_id)
            self._quiet_teardown()
            set_state(store, self.run_id, RunState.CRASHED, f"{type(exc).__name__}: {exc}")
        finally:
            if self.on_end is not None:
                self.on_end(self)

    def _quiet_teardown(self) -> None:
        """Teardown on the way to ``crashed``: a second failure must not hide the first."""
        try:
            self._teardown(final=False)
        except Exception:
            log.exception("run %s: teardown after a failure failed too", self.run_id)

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
        self.evaluations = self._evaluations()
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
            self._snapshot_for_eval()  # the initial policy's success (version 1)
        # A pause or stop requested during setup stays; the loop acts on it.
        self._set_live_state(only_from={RunState.PENDING, RunState.RESUMING})

    def _evaluations(self) -> EvaluationRecorder:
        """The run's success curve: robots' evaluation episodes or a simulator (evaluation.on).

        Raises:
            ValueError: the leased robots described no common driver kind (simulator).
        """
        from runs.evaluator import simulator_kind

        source: RobotEvaluations | SimulatorEvaluations | NoEvaluations
        if self.spec.evaluation.on == "none":
            source = NoEvaluations()
        elif self.spec.evaluation.on == "robots":
            source = RobotEvaluations(
                self.ctx.store,
                self.run_id,
                self.spec.tasks,
                lambda: [] if self.agents is None else self.agents.names,
                self.run_dir,
            )
        else:
            o = self.orchestration
            source = SimulatorEvaluations(
                self.spec,
                simulator_kind(self._robot_specs()),
                (self.features.state_dim, self.features.action_dim),
                self.params.eval_max_steps,
                o.evaluator_nice,
                o.eval_backlog,
            )
        return EvaluationRecorder(self.ctx.store, self.run_id, self.run_dir, source, self._event)

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
        evaluation = self.spec.evaluation
        return Assignment(
            run_id=self.run_id,
            tasks=list(self.spec.tasks),
            max_episode_steps=self.params.max_episode_steps,
            hidden=self.spec.policy.hidden_sizes[0],
            terminate_on_success=self.plan.terminate_on_success,  # e.g. RECAP's
            needs_operator=self.plan.needs_operator,
            reward_source=self.spec.reward.source,
            help=self._help_assignment(),
            edge=run_edge_settings(
                self.ctx.settings.edge,
                self.params.control_hz,
                evaluate_every=evaluation.every_episodes if evaluation.on == "robots" else 0,
            ),
        )

    def _help_assignment(self) -> dict[str, Any]:
        """The robots' ``help:`` (none when they never ask); ``on_call`` when the run has
        fewer people than robots (``edge_agent.on_call``)."""
        h = self.spec.help
        if h.risk == "none":
            return {}
        cloud_only = {"probe_horizon", "probe_every_updates", "probe_episodes", "operators"}
        out = h.model_dump(exclude=cloud_only | {"simulated_operators"})
        out["on_call"] = h.operators is not None and h.operators < self.spec.robots.count
        return out

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
                    self._record_progress()
                if follow.due(now):  # a restarted robot is told to hold by _follow_hold
                    self.agents.follow()
                if not self.paused:  # robots hold still: nothing to evaluate, no robot to add
                    assert self.evaluations is not None
                    if now - self.evaluations.last_at >= every:
                        self._snapshot_for_eval()
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
        return {name: m.robot_id for name, m in self.allocation.members.items()}

    def _live_state(self) -> RunState:
        assert self.allocation is not None
        short = len(self.allocation.active) < self.spec.robots.count
        return RunState.DEGRADED if short else RunState.RUNNING

    def _set_live_state(self, reason: str = "", *, only_from: set[RunState]) -> None:
        assert self.allocation is not None
        state = self._live_state()
        robots = sorted(self.allocation.members)
        set_state(self.ctx.store, self.run_id, state, reason, only_from=only_from, robots=robots)
        self.progress["state"] = state.value

    def _follow_pause(self) -> None:
        """Pause: robots hold at their next step boundary; leases, placement, agents and the
        learner stay. Resume: the held robots go on with their episodes."""
        if self.want_pause and not self.paused:
            reached = self.hold.want(True, self._members(), "run paused")
            self.clock.pause()
            self._held_reported = False
            self.progress["state"] = RunState.PAUSED.value
            self._event("run.pause_sent", robots=sorted(self._members()), reached=reached)
        elif self.paused and not self.want_pause:
            reached = self.hold.want(False, self._members(), "run resumed")
            self.clock.resume()
            self._event("run.resume_sent", robots=sorted(self._members()), reached=reached)
            self._set_live_state("resumed after a pause", only_from={RunState.RESUMING})

    def _follow_hold(self) -> None:
        """Re-send pause/resume to robots whose heartbeat disagrees; note when all hold."""
        if self.allocation is None:
            return
        held = self.hold.follow(self._members())
        if not self.paused:
            self._held_reported = False
        elif not self._held_reported and held == sorted(self.allocation.active):
            self._held_reported = True
            self._event("run.robots_held", robots=held, leases_kept=sorted(self._members()))

    def _check_stop_conditions(self) -> None:
        reason = stop_conditions.reached(self.spec.stop, self.clock.elapsed(), self.progress)
        if reason is not None:
            self.request_stop(reason, RunState.FINISHED)

    def _reconcile(self) -> None:
        assert self.agents is not None
        result = self.allocation.reconcile(timeout_s=5.0)
        for name in set(self.agents.names) - set(self.allocation.members):
            self.agents.drop(name)  # retired: its lease is gone
        members = self._members()
        for name in result.added:
            self.agents.start(name, members[name], len(self.agents))
        state = RunState.DEGRADED if result.degraded else RunState.RUNNING
        if state.value != self.progress.get("state"):
            live = {RunState.RUNNING, RunState.DEGRADED}
            set_state(self.ctx.store, self.run_id, state, only_from=live, lost=result.lost)
            self.progress["state"] = state.value

    # -- evaluation and progress -----------------------------------------------------------

    def _snapshot_for_eval(self, final: bool = False) -> None:
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

    def _learner_restarts(self) -> int:
        learner = self.learner
        return self.learner_restarts_base + (learner.restarts if learner else 0)

    def _record_progress(self) -> None:
        assert self.learning is not None and self.agents is not None
        learner = self.learning.learner
        self.progress.update(
            self.figures.record(
                self.learning.buffer,
                self.clock,
                self.learning.stats,
                restarts=self._learner_restarts(),
                hangs=learner.hangs,
                robots=self.agents.names,
                version=self.learning.version,
                online_shares=self.learning.online_shares,
            )
        )
        self.progress["effort"] = self.effort.record(
            self.clock.elapsed(), self.agents.names, int(self.progress.get("env_steps", 0))
        )

    def _final_reports(self) -> dict[str, dict[str, float]]:
        """Robot id (the buffer's ``robot_id``) -> the final report its computer sent when
        released."""
        if self.agents is None:
            return {}
        ids = {name: rid for name, (rid, _a) in self.agents.robots.items()}
        return {str(ids[name]): r for name, r in self.agents.reports.items() if name in ids}

    # -- the end ---------------------------------------------------------------------------

    def _teardown(self, final: bool) -> None:
        """Stop everything; with ``final`` also the final evaluation, report and accounting."""
        self.progress["state"] = "stopping"
        if final:
            set_state(self.ctx.store, self.run_id, RunState.STOPPING, self.stop_reason or "")
        try:
            # A run that ends releases its robots; one the cloud detaches from (shutting down,
            # to be resumed) leaves them acting and spooling, as a crash of the cloud would.
            if self.agents is not None and final:
                self.agents.release(self.orchestration.release_timeout_s)
        except Exception:
            log.exception("releasing the robots")
        if self.learning is not None:
            self.learning.learner.stop()
            if final:
                self._final_report()
            self.learning.close()
        if self.evaluations is not None:
            self.evaluations.close()
            self.evaluations = None
        if self.allocation is not None:
            if self.paused and self.detach and not final:
                self.allocation.suspend()  # the cloud goes away: a paused run keeps its robots
            else:
                self.allocation.release()
        self.ctx.server.invalidate_auth()

    def _final_report(self) -> None:
        """The last version out, the last figures, the final evaluation, then the report with
        the acknowledged steps the buffer lost (``accounting``)."""
        from runs.accounting import reported_accounts
        from runs.report import write_report

        assert self.learning is not None and self.evaluations is not None
        self.learning.publish_new_weights()
        self._record_progress()
        if self.learning.version:
            self._snapshot_for_eval(final=True)
        for got in self.evaluations.drain():
            self.progress.update(got)
        promotion = promote_best(self.ctx.store, self.run_id, self.run_dir, self.spec)
        reports = self.agents.reports if self.agents is not None else {}
        if reports:  # the robots' final counts (their heartbeats stop with their release)
            self.effort.write(
                self.clock.elapsed(), len(reports), int(self.progress.get("env_steps", 0)), reports
            )
        self.result = write_report(
            self.run_dir,
            self.run_id,
            self.spec,
            learner_restarts=self._learner_restarts(),
            accounts=reported_accounts(self.learning.buffer, self._final_reports()),
            elapsed_s=self.clock.elapsed(),
            setup_s=self.progress.get("setup_s"),
            robot_reports=self.agents.reports if self.agents is not None else {},
            promotion=promotion,
        )
