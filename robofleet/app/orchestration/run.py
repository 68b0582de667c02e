"""One run from lease to report: :class:`RunDriver` (a thread in the cloud process).

Life of a run (every state change is an event in the metadata store)::

    pending/resuming -> lease robots (hal scheduler) -> open the buffer (+ demonstrations on a
    fresh run) -> learner process (supervised) and edge agents (Ray actors placed on the
    robots' bundles) start side by side -> robots ready and first version out: the run's clock
    starts -> running/degraded
        loop: supervise learner and agents, hand new weight versions to comms, snapshot the policy
              for evaluation, metrics, reconcile robots, stop conditions
        pause: robots hold at a step boundary (a Control command to each edge agent, re-sent
               until its heartbeat says ``paused``; spools keep draining); the leases, the Ray
               placement, the agents and the learner are KEPT; resume continues the episodes
    -> stopping: agents stop and drain their spools, learner's final checkpoint, final
       evaluation, report -> leases released -> finished / stopped (or crashed with a reason)

Durable state of a run lives in its directory: ``spec.json``, ``buffer/`` (every acknowledged
step), ``checkpoints/``, ``weights/``, ``robots/<name>/`` (edge spools), ``evals.jsonl`` and
``progress.jsonl`` (the curves), ``progress.json`` (elapsed time and robot-hours), and the
final ``report.json`` with its plots. A resumed run picks all of these up.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from cloud_learner.run_plan import RunPlan
from comms.weight_file import WeightFileFeed
from robofleet.app.orchestration.evalqueue import EvalSnapshot, EvaluationQueue
from robofleet.app.orchestration.hold import RobotHold
from robofleet.app.orchestration.supervisor import (
    CrashLoop,
    CrashWindow,
    ProcessSupervisor,
    RestartPolicy,
)
from robofleet.app.sim.fleet import (
    DEMO_ROBOT,
    SimFleetHost,
    SimRobotWorker,
    demonstration_records,
)
from robofleet.durable import atomic_write_json
from robofleet.runspec import RunSpec
from robofleet.store.models import Robot, RunState
from robofleet.store.runs import set_state
from robofleet.store.store import MetadataStore

log = logging.getLogger(__name__)


@dataclass
class CloudContext:
    """What every run of one cloud shares."""

    settings: Any
    store: MetadataStore
    server: Any  # comms.server.CloudServer
    server_address: str
    sinks: dict[str, Any]
    host: SimFleetHost | None
    python: str
    learner_restarts: RestartPolicy = field(default_factory=RestartPolicy)
    agent_restarts: RestartPolicy = field(default_factory=RestartPolicy)
    eval_every_s: float | None = None


class RunDriver:
    """Drives one run; :meth:`start` runs it on a thread until it ends or is asked to stop.

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
        self.spec = spec
        self.run_dir = run_dir
        self.plan = RunPlan.from_spec(spec)
        self.params = self.plan.params
        self.on_end = on_end
        self.stop_reason: str | None = None  # set: end the run (requested or condition)
        self.detach = False  # set: cloud shutting down, leave the run to be resumed
        self.final_state = RunState.FINISHED
        self.result: dict[str, Any] = {}
        self.progress: dict[str, Any] = {"state": "pending"}
        self._thread = threading.Thread(target=self._main, name=f"run-{run_id}", daemon=True)
        self._agents: dict[str, Any] = {}  # robot name -> (actor, run ref)
        # Robot name -> its edge agent's final report (EdgeAgent.report(): steps, episodes,
        # interventions, staleness...), returned by the agent's run when it stops; heartbeats
        # carry the same figures only while it runs.
        self.robot_reports: dict[str, dict[str, float]] = {}
        self._agent_crashes: dict[str, CrashWindow] = {}  # robot name -> its agent's crashes
        self._agent_backoff = ctx.agent_restarts.backoff()
        self._checkpoint_requested = False
        self.want_pause = False  # set/cleared by the run manager; the loop follows it
        self.paused = False  # robots told to hold; leases kept
        self._paused_at = 0.0
        self._paused_total = 0.0
        self._held_reported = False
        self.hold = RobotHold(ctx.store, ctx.server, run_id)
        self.orchestration = ctx.settings.orchestration
        self.allocation: Any = None
        self.buffer: Any = None
        self.learner: ProcessSupervisor | None = None
        self.batch_server: Any = None
        self.evaluator: Any = None
        self._evals: EvaluationQueue | None = None  # policy snapshots for the evaluator
        self._weights: WeightFileFeed | None = None  # the learner's versions -> comms
        self._published_version = 0
        self._last_eval_at = -1e9
        self._last_snapshot_version = -1
        self._demo_rows = 0
        self._elapsed_base = 0.0
        self._t0 = time.monotonic()
        self._rate_prev: tuple[float, int, int] | None = None
        self._latest_bytes = b""
        self._robot_s_base = 0.0
        self.learner_restarts_base = 0

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

    # -- the run ---------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> None:
        self.ctx.store.record_event(kind, run_id=self.run_id, **data)

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
        except CrashLoop as exc:
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
        from buffer import InterventionSampler, ReplayBuffer, StepSchema
        from buffer.service import BatchServer
        from comms.buffer_sink import BufferSink
        from hal.drivers.metaworld import MetaWorldDriver
        from hal.scheduler import LearnerRequest, RobotAllocation, RobotRequest
        from robofleet.app.orchestration.evaluator import remote_evaluator

        ctx, spec = self.ctx, self.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "spec.json").write_text(spec.model_dump_json(indent=2))
        if resumed:
            p = json.loads((self.run_dir / "progress.json").read_text())
            self._elapsed_base = float(p.get("elapsed_s", 0.0))
            self._robot_s_base = float(p.get("robot_seconds", 0.0))
            self.learner_restarts_base = int(p.get("learner_restarts", 0))
        # Leases left by a cloud that died are stale: give them back, then lease afresh.
        ctx.store.release_leases(self.run_id, actor="run-manager")
        request = RobotRequest(
            count=spec.robots.count,
            robot_type=spec.robots.robot_type,
            tags=dict(spec.robots.tags),
            min_count=spec.robots.min_count,
        )
        self.allocation = RobotAllocation(
            ctx.store,
            self.run_id,
            request,
            LearnerRequest(spec.learner.num_cpus, spec.learner.num_gpus),
            edge_cpus=ctx.settings.hal.edge_cpus,
            actor="run-manager",
        )
        self._acquire(patient=resumed)
        ctx.server.invalidate_auth()

        driver = MetaWorldDriver("schema", tasks=list(spec.tasks))
        schema = StepSchema.from_features(driver.observation_features, driver.action_features)
        buffer_config = ctx.settings.buffer
        if spec.buffer.memory_budget_bytes is not None:  # the run's own hot-tier budget
            buffer_config = buffer_config.model_copy(
                update={"memory_budget_bytes": spec.buffer.memory_budget_bytes}
            )
        self.buffer = ReplayBuffer.open(self.run_dir / "buffer", schema, buffer_config)
        self._demo_rows = len(self.buffer.select(robot_ids=[DEMO_ROBOT]))
        if self._demo_rows == 0:
            records = demonstration_records(
                spec.tasks, self.params.demos_per_task, self.params.max_episode_steps, self.run_id
            )
            self.buffer.append(schema.batch_from_records(records))
            self._demo_rows = len(records)
            self._event("run.demonstrations", steps=len(records))
        ctx.sinks[self.run_id] = BufferSink(self.buffer)
        self.batch_server = BatchServer(
            self.buffer,
            spec.tasks,
            InterventionSampler(),
            offline_rows=self._demo_rows,
            demonstration_robots=[DEMO_ROBOT],
        )
        self.learner = ProcessSupervisor(
            "learner",
            [
                ctx.python,
                "-m",
                "cloud_learner.process",
                "--run-dir",
                str(self.run_dir),
                "--run-id",
                self.run_id,
                "--batches",
                self.batch_server.address,
                "--database-url",
                ctx.settings.database_url,
            ],
            self.run_dir / "learner.log",
            ctx.learner_restarts,
            on_event=lambda kind, data: self._event(kind, **data),
        )
        self.learner.start()
        self.evaluator = remote_evaluator().remote(
            list(spec.tasks),
            spec.policy.hidden_sizes[0],
            spec.evaluation.episodes_per_task,
            self.params.eval_max_steps,
            self.orchestration.evaluator_nice,
        )
        self._evals = EvaluationQueue(
            self.evaluator.evaluate.remote, self.orchestration.eval_backlog
        )
        setup_t0 = time.monotonic()
        # Edge agents boot (connect, subscribe, wait for the first version) while the learner
        # starts and warm-starts: on a real fleet each robot's computer does this on its own.
        for i, name in enumerate(sorted(self.allocation.members)):
            self._start_agent(name, i)
        self._wait_agents_ready(self.orchestration.robots_ready_timeout_s)
        self._wait_first_version()
        # The run's clock (stop.minutes, wall_s of every evaluation) starts when the robots are
        # up and the first version is out, so robots act from its first second; the learner's
        # start-up, the BC warm start and the agents' start-up before it are reported apart as
        # ``setup_s``, so a loaded machine cannot eat the budget.
        self._t0 = time.monotonic()
        self.progress.setdefault("setup_s", round(self._t0 - setup_t0, 2))
        if not (self.run_dir / "evals.jsonl").exists():
            self._snapshot_for_eval()  # the initial policy's success (version 1)
        state = (
            RunState.DEGRADED
            if len(self.allocation.active) < spec.robots.count
            else RunState.RUNNING
        )
        # A pause or stop requested during setup stays; the loop acts on it.
        set_state(
            ctx.store,
            self.run_id,
            state,
            only_from={RunState.PENDING, RunState.RESUMING},
            robots=sorted(self.allocation.members),
        )
        self.progress["state"] = state.value

    def _acquire(self, patient: bool) -> None:
        from hal.scheduler import SchedulingError

        # After a cloud restart robots may be offline until their next heartbeat.
        deadline = time.monotonic() + (3 * self.ctx.settings.hal.offline_after_s if patient else 0)
        while True:
            try:
                self.allocation.acquire(timeout_s=self.ctx.settings.hal.placement_timeout_s)
                return
            except SchedulingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _wait_agents_ready(self, timeout_s: float) -> None:
        """Wait until every started edge agent runs its loop (robot connected, policy built,
        uplink and weight subscription up, waiting for the first version); one still starting
        after ``timeout_s`` is noted (event ``edge_agent.slow_start``) and joins late."""
        import ray

        deadline = time.monotonic() + timeout_s
        waiting = set(self._agents)
        while waiting and self.stop_reason is None and not self.detach:
            calls = {name: self._agents[name][0].is_running.remote() for name in waiting}
            try:
                answers = ray.get(list(calls.values()), timeout=5.0)
            except ray.exceptions.GetTimeoutError:
                answers = [False] * len(calls)
            except ray.exceptions.RayError:  # an agent died starting: supervision restarts it
                break
            waiting = {name for name, up in zip(calls, answers, strict=True) if not up}
            if not waiting or time.monotonic() > deadline:
                break
            self._poll_learner()
            time.sleep(0.25)
        if waiting:
            self._event("edge_agent.slow_start", robots=sorted(waiting), waited_s=timeout_s)

    def _wait_first_version(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._publish_new_weights():
            self._poll_learner()
            if self.stop_reason is not None or self.detach:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no policy version within {timeout_s:.0f}s; see learner.log")
            time.sleep(0.2)

    def _agent_seed(self, index: int, spool: Path) -> int:
        state = spool / "agent_state.json"
        episode = json.loads(state.read_text())["next_episode_index"] if state.exists() else 0
        # Meta-World's goal variation is seed % 50 and 100_000 is a multiple of 50: without the
        # 13 * index offset every robot would replay the same variation at the same time (a
        # quarter of the variety per env step with 4 robots, measured in bench efficiency).
        return 100_000 * (index + 1) + 13 * index + int(episode)

    def _start_agent(self, name: str, index: int) -> None:
        import ray

        from edge_agent.build import AgentOptions
        from robofleet.app.sim.fleet import spool_dir

        ctx = self.ctx
        spool = self.run_dir / "robots" / name
        spool.mkdir(parents=True, exist_ok=True)
        cred = spool_dir(ctx.settings.data_dir, name) / "credential.json"
        if not (spool / "credential.json").exists():
            shutil.copy2(cred, spool / "credential.json")
        edge = ctx.settings.edge.model_copy(
            update={
                "control_hz": self.params.control_hz,
                "heartbeat_interval_s": ctx.settings.hal.heartbeat_interval_s,
            }
        ).model_dump(mode="json")
        opts = AgentOptions(
            robot_name=name,
            tasks=list(self.spec.tasks),
            run_id=self.run_id,
            server=ctx.server_address,
            operator="scripted",
            max_episode_steps=self.params.max_episode_steps,
            spool_dir=spool,
            hidden=self.spec.policy.hidden_sizes[0],
            terminate_on_success=self.plan.terminate_on_success,  # e.g. RECAP's
        )
        actor_options: dict[str, Any] = {"max_concurrency": 4, "num_cpus": 0}
        Worker: Any = ray.remote(**actor_options)(SimRobotWorker)
        actor = Worker.options(scheduling_strategy=self.allocation.edge_strategy(name)).remote(
            edge, ctx.settings.comms.model_dump(mode="json"), opts, self._agent_seed(index, spool)
        )
        self._agents[name] = (actor, actor.run.remote(None), index)
        if ctx.host is not None:
            ctx.host.busy[name] = time.monotonic() + 60.0
        self._event("edge_agent.started", robot=name)

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        spec = self.spec
        assert self.learner is not None
        last_metrics = 0.0
        last_reconcile = time.monotonic()
        last_tick = last_hold = time.monotonic()
        while self.stop_reason is None and not self.detach:
            now = time.monotonic()
            if not self.paused:  # robot-hours count robots acting
                self._robot_s_base += len(self._agents) * (now - last_tick)
            last_tick = now
            self._poll_learner()  # CrashLoop ends the run as crashed
            if self._checkpoint_requested:
                self._checkpoint_requested = False
                self.learner.signal(signal.SIGUSR1)
            self._publish_new_weights()
            if self.want_pause and not self.paused:
                self._enter_pause()
            elif self.paused and not self.want_pause:
                self._leave_pause()
            if now - last_hold >= 1.0:
                last_hold = now
                self._follow_hold()
            self._collect_eval()
            if now - last_metrics >= 2.0:
                last_metrics = now
                self._record_progress()
            self._supervise_agents()  # a restarted agent is told to hold by _follow_hold
            if not self.paused:  # robots hold still: nothing to evaluate, no robot to add
                every = self.ctx.eval_every_s or spec.evaluation.every_seconds
                if now - self._last_eval_at >= every:
                    self._snapshot_for_eval()
                if now - last_reconcile >= self.ctx.settings.hal.heartbeat_interval_s * 5:
                    last_reconcile = now
                    self._reconcile()
            self._check_stop_conditions()
            time.sleep(0.25)

    def _poll_learner(self) -> None:
        """Supervise the learner: crashes, and hangs (alive, but no batch taken, no update).

        Progress is the batch server's request count (a learner waiting for data at its
        update-to-data ratio still polls it) and the learner's reported step; the limit is
        longer until the run's first policy version (start-up and BC warm start).
        """
        assert self.learner is not None and self.batch_server is not None
        self.learner.note_progress(
            (self.batch_server.requests, self.batch_server.learner_stats.get("learner_step"))
        )
        o = self.orchestration
        self.learner.hang_after_s = (
            o.learner_hang_s if self._published_version else o.learner_warmup_hang_s
        )
        self.learner.poll()

    def _members(self) -> dict[str, int]:
        assert self.allocation is not None
        return {name: m.robot_id for name, m in self.allocation.members.items()}

    def _enter_pause(self) -> None:
        """Robots hold at their next step boundary; leases, placement, agents, learner stay."""
        reached = self.hold.want(True, self._members(), "run paused")
        self.paused, self._held_reported = True, False
        self._paused_at = time.monotonic()
        self.progress["state"] = RunState.PAUSED.value
        self._event("run.pause_sent", robots=sorted(self._members()), reached=reached)

    def _leave_pause(self) -> None:
        """The held robots go on with their episodes (no new lease, no new agent)."""
        assert self.allocation is not None
        reached = self.hold.want(False, self._members(), "run resumed")
        self._paused_total += time.monotonic() - self._paused_at
        self.paused = False
        self._event("run.resume_sent", robots=sorted(self._members()), reached=reached)
        state = (
            RunState.DEGRADED
            if len(self.allocation.active) < self.spec.robots.count
            else RunState.RUNNING
        )
        set_state(
            self.ctx.store,
            self.run_id,
            state,
            "resumed after a pause",
            only_from={RunState.RESUMING},
            robots=sorted(self.allocation.members),
        )
        self.progress["state"] = state.value

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

    def _elapsed(self) -> float:
        """Run time in seconds since the first version, without the time spent paused."""
        paused = self._paused_total + (time.monotonic() - self._paused_at if self.paused else 0)
        return self._elapsed_base + (time.monotonic() - self._t0) - paused

    def _check_stop_conditions(self) -> None:
        stop = self.spec.stop
        if stop.minutes is not None and self._elapsed() >= stop.minutes * 60:
            self.request_stop(f"reached {stop.minutes} minutes", RunState.FINISHED)
        elif stop.env_steps is not None and self.progress.get("env_steps", 0) >= stop.env_steps:
            self.request_stop(f"reached {stop.env_steps} env steps", RunState.FINISHED)
        elif (
            stop.target_success is not None
            and self.progress.get("success_mean", 0.0) >= stop.target_success
        ):
            self.request_stop(f"reached success {stop.target_success}", RunState.FINISHED)

    def _reconcile(self) -> None:
        result = self.allocation.reconcile(timeout_s=5.0)
        for name in result.added:
            self._start_agent(name, len(self._agents) + len(result.added))
        state = RunState.DEGRADED if result.degraded else RunState.RUNNING
        if state.value != self.progress.get("state"):
            live = {RunState.RUNNING, RunState.DEGRADED}
            set_state(self.ctx.store, self.run_id, state, only_from=live, lost=result.lost)
            self.progress["state"] = state.value

    def _supervise_agents(self) -> None:
        import ray

        for name, (actor, ref, index) in list(self._agents.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                continue
            try:
                ray.get(ref)
                why = "returned"
            except Exception as exc:
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
            crashes = self._agent_crashes.setdefault(name, CrashWindow(self.ctx.agent_restarts))
            n = crashes.record(time.monotonic())
            self._event("edge_agent.died", robot=name, why=why)
            del self._agents[name]
            try:
                ray.kill(actor)
            except Exception:
                pass
            if crashes.looping:
                raise CrashLoop(f"edge agent of {name} crashed {n} times: {why}")
            # The delay grows with the crashes in the window (n - 1 before this one).
            time.sleep(self._agent_backoff.delay(n - 1))
            self._start_agent(name, index)
            self._event("edge_agent.restarted", robot=name)

    # -- weights and evaluation ------------------------------------------------------------

    def _publish_new_weights(self) -> bool:
        """Hand a newer version of the learner's weight directory to comms' distributor
        (``comms.weight_file``); True when there was one."""
        if self._weights is None:
            self._weights = WeightFileFeed(
                self.ctx.server.distributor(self.run_id), self.run_dir / "weights"
            )
        # The learner's safetensors file as it is: no tensor decode and re-snapshot; a
        # distributor kept across restarts that is ahead already is left as it is.
        got = self._weights.poll()
        if got is None:
            return False
        self._published_version, blob = got
        self._latest_bytes = bytes(blob)  # the distributor owns ``blob``
        return True

    def _snapshot_for_eval(self, final: bool = False) -> None:
        """Queue the published policy for evaluation, stamped with the run's clock and counts
        now (:mod:`robofleet.app.orchestration.evalqueue`). A version already queued is not queued
        again, except for the ``final`` evaluation."""
        self._last_eval_at = time.monotonic()
        if self._published_version == 0 or self._evals is None:
            return
        if self._published_version == self._last_snapshot_version and not final:
            return
        steps, interventions = self._counts()
        dropped = self._evals.add(
            EvalSnapshot(
                self._published_version,
                self._latest_bytes,
                self._elapsed(),
                self._robot_s_base / 3600,
                steps,
                interventions,
            )
        )
        self._last_snapshot_version = self._published_version
        if dropped is not None:
            self._event(
                "run.evaluation_dropped", policy_version=dropped.version, backlog=len(self._evals)
            )

    def _drain_evals(self) -> None:
        """Evaluate every queued snapshot (at the end of a run)."""
        while self._evals is not None and len(self._evals):
            self._collect_eval(wait=True)

    def _collect_eval(self, wait: bool = False) -> None:
        if self._evals is None:
            return
        got = self._evals.poll(wait)
        if got is None:
            return
        snap, success = got
        version = snap.version
        mean = float(np.mean(list(success.values())))
        row = {
            "wall_s": snap.wall_s,
            "robot_hours": snap.robot_hours,
            "env_steps": snap.env_steps,
            "interventions": snap.interventions,
            "policy_version": version,
            "success": success,
            "success_mean": mean,
        }
        with open(self.run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.progress.update(success=success, success_mean=mean, eval_version=version)
        from robofleet.store.metrics import insert_metrics

        insert_metrics(
            self.ctx.store,
            self.run_id,
            [
                {"name": "success_rate", "step": version, "value": v, "task": t}
                for t, v in success.items()
            ],
        )
        self._event("run.evaluated", policy_version=version, success_mean=mean)

    # -- progress --------------------------------------------------------------------------

    def _counts(self) -> tuple[int, int]:
        """(env steps, operator interventions) stored in the buffer from robots (not demos)."""
        total = len(self.buffer)
        interventions = len(self.buffer.select(interventions_only=True))
        return total - self._demo_rows, interventions - self._demo_rows

    def _record_progress(self) -> None:
        from robofleet.store.metrics import insert_metrics

        steps, interventions = self._counts()
        now, elapsed = time.monotonic(), self._elapsed()
        rate = steps_per_s = 0.0
        if self._rate_prev is not None:
            t, s, i = self._rate_prev
            if steps > s:
                rate = (interventions - i) / (steps - s)
            steps_per_s = (steps - s) / max(now - t, 1e-6)
        self._rate_prev = (now, steps, interventions)
        lstats = self.batch_server.learner_stats
        assert self.learner is not None
        restarts = self.learner_restarts_base + self.learner.restarts
        self.progress.update(
            elapsed_s=elapsed,
            env_steps=steps,
            interventions=interventions,
            intervention_rate=rate,
            env_steps_per_s=steps_per_s,
            learner_updates_per_s=lstats.get("updates_per_s", 0.0),
            learner_step=int(lstats.get("learner_step", 0)),
            loss=lstats.get("loss", float("nan")),
            policy_version=self._published_version,
            learner_restarts=restarts,
            learner_hangs=self.learner.hangs,
            robots=len(self._agents),
            robot_hours=self._robot_s_base / 3600,
        )
        row = {
            "wall_s": elapsed,
            "robot_hours": self._robot_s_base / 3600,
            "env_steps": steps,
            "interventions": interventions,
            "intervention_rate": rate,
            "policy_version": self._published_version,
        }
        with open(self.run_dir / "progress.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        atomic_write_json(
            self.run_dir / "progress.json",
            {
                "elapsed_s": elapsed,
                "robot_seconds": self._robot_s_base,
                "learner_restarts": restarts,
            },
        )
        step = int(lstats.get("learner_step", 0))
        points: list[dict[str, Any]] = [
            {"name": "intervention_rate", "step": steps, "value": rate},
            {"name": "env_steps_per_s", "step": steps, "value": steps_per_s},
            {
                "name": "learner_updates_per_s",
                "step": step,
                "value": lstats.get("updates_per_s", 0.0),
            },
            {"name": "buffer_size", "step": steps, "value": float(len(self.buffer))},
        ]
        hit = self.buffer.stats().get("cache_hit_rate")
        if hit is not None:
            points.append({"name": "cache_hit_rate", "step": steps, "value": float(hit)})
        if np.isfinite(lstats.get("loss", float("nan"))):
            points.append({"name": "loss", "step": step, "value": lstats["loss"]})
        with self.ctx.store.session() as sess:
            for robot in sess.scalars(select(Robot).where(Robot.name.in_(list(self._agents)))):
                if robot.applied_policy_version is not None:
                    points.append(
                        {
                            "name": "policy_version",
                            "step": steps,
                            "value": float(robot.applied_policy_version),
                            "robot_id": robot.id,
                        }
                    )
        insert_metrics(self.ctx.store, self.run_id, points)

    # -- the end ---------------------------------------------------------------------------

    def _stop_agents(self) -> None:
        import ray

        refs = []
        for _name, (actor, ref, _i) in self._agents.items():
            actor.stop.remote()
            refs.append(ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        for name, (_actor, ref, _i) in self._agents.items():
            try:
                self.robot_reports[name] = dict(ray.get(ref, timeout=1))
            except Exception as exc:  # an agent that died has no report; its heartbeats stay
                log.info("no final report from the edge agent of %s: %s", name, exc)
        for name, (actor, _ref, _i) in list(self._agents.items()):
            try:
                ray.get(actor.drain.remote(30.0), timeout=40)
                ray.get(actor.close.remote(), timeout=30)
            except Exception as exc:
                log.warning("closing the edge agent of %s: %s", name, exc)
            ray.kill(actor)
            if self.ctx.host is not None:
                self.ctx.host.busy.pop(name, None)
        self._agents.clear()

    def _teardown(self, final: bool) -> None:
        """Stop everything; with ``final`` also the final evaluation, report and accounting."""
        import ray

        self.progress["state"] = "stopping"
        if final:
            set_state(self.ctx.store, self.run_id, RunState.STOPPING, self.stop_reason or "")
        try:
            self._stop_agents()
        except Exception:
            log.exception("stopping edge agents")
        if self.learner is not None:
            self.learner.stop()
        if final and self.buffer is not None:
            self._publish_new_weights()
            self._record_progress()
            if self._published_version:
                self._snapshot_for_eval(final=True)
            self._drain_evals()
            from robofleet.app.orchestration.accounting import acked_lost
            from robofleet.app.orchestration.report import write_report

            self.result = write_report(
                self.run_dir,
                self.run_id,
                self.spec,
                learner_restarts=self.learner_restarts_base
                + (self.learner.restarts if self.learner else 0),
                acked_lost=acked_lost(self.buffer, self.run_dir / "robots"),
                elapsed_s=self._elapsed(),
                setup_s=self.progress.get("setup_s"),
            )
        if self.batch_server is not None:
            self.batch_server.close()
        self.ctx.sinks.pop(self.run_id, None)
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
        if self.evaluator is not None:
            ray.kill(self.evaluator)
            self.evaluator = None
        if self.allocation is not None:
            if self.paused and self.detach and not final:
                self.allocation.suspend()  # the cloud goes away: a paused run keeps its robots
            else:
                self.allocation.release()
        self.ctx.server.invalidate_auth()
