"""The run manager: launch, stop, pause, resume and checkpoint runs; pick runs up after a restart.

The metadata store is the source of truth. ``robofleet run launch`` (another process) writes a
``pending`` run; ``robofleet run stop`` marks it ``stopping``, ``robofleet run pause`` marks it
``paused``; ``robofleet resume`` marks it ``resuming``. :meth:`RunManager.poll`, called every
second by the cloud, turns those requests into :class:`~runs.run.RunDriver`
threads and requests to them. The dashboard calls the same methods directly
(``foundation.contracts.RunManager``); a dashboard without a cloud in its process records the
requests with :class:`QueuedRunManager`.

Pause keeps the run's leases: the driver stops the edge agents (robots hold still, spools
drain) and keeps its robots, Ray placement and learner; resume restarts the agents on the same
robots. Only a run without a driver (its cloud went away) is leased afresh when it resumes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cloud_learner.run_plan import RunPlan, parse_spec
from foundation.naming import unknown_names
from foundation.runspec import RunSpec, RunSpecError, parse_run_spec
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot, RobotStatus, Run, RunState
from foundation.store.runs import (
    ACTIVE_STATES,
    RunNotFound,
    RunStateError,
    end_run,
    record_run,
    request,
    set_state,
)
from runs.offline import check_sources, offline_sources
from runs.pidfile import cloud_running
from runs.run import CloudContext, RunDriver
from runs.starting import check_start

log = logging.getLogger(__name__)


def validate_launch(store: MetadataStore, spec: RunSpec, data_dir: Path | None = None) -> RunSpec:
    """Refuse a spec the fleet cannot serve; nothing is written (and nothing leased). Returns
    the spec as the run records it: its policy kind filled in (the algorithm's own).

    Raises:
        RunSpecError: an algorithm or policy kind the learner does not have (the known ones
            named, ``cloud_learner.run_plan``); an unsupported knob; fewer robots in the fleet (of any status but
            retired) than the spec's minimum; matching robots whose enrolled specs one policy
            cannot take (the feature named, ``hal.compat``); a policy that cannot see what the
            robots offer (cameras named) or take their features (``RunPlan.feature_errors``); a robot without an operator for an algorithm that
            learns from interventions or for demonstrations; robots that give no signal the
            run learns or measures success from (``reward.source``, ``evaluation.on``,
            ``runs.signals``: the robots named); a task no matching robot runs;
            offline data that is missing
            or does not fit the robots' features and the run's tasks (each feature named,
            ``buffer.offline_data[k]``); starting weights that are missing or do not fit.
            Each is named by field.
    """
    errors: dict[str, str] = {}
    plan: RunPlan | None = None
    try:
        plan = RunPlan.from_spec(spec)
    except RunSpecError as exc:
        errors.update(exc.errors)
    errors.update(_unapplied_buffer_fields(spec))
    robots = _matching_robots(store, spec)
    demand = spec.robots
    fleet = _fleet_errors(spec, plan, robots) if robots else {}
    features = _shared_features(robots) if robots and "robots" not in fleet else None
    if plan is not None and features is not None:
        try:
            plan.cameras(features)
            action = (_with_action(robots, features) or {}).get("action", {})
            errors.update(plan.feature_errors(features, int((action.get("shape") or [1])[0])))
        except RunSpecError as exc:
            errors.update(exc.errors)
    if data_dir is not None:
        errors.update(check_sources(spec, _with_action(robots, features), data_dir))
        errors.update(check_start(spec, plan, features, data_dir, store))
    if len(robots) < demand.minimum:
        what = ", ".join(
            [f"robot_type={demand.robot_type}"] * (demand.robot_type is not None)
            + [f"{k}={v}" for k, v in demand.tags.items()]
        )
        too_few = (
            f"asks for at least {demand.minimum} robot(s) matching {what}; "
            f"the fleet has {len(robots)}"
        )
        fleet["robots"] = "; ".join(m for m in (too_few, fleet.get("robots")) if m)
    errors.update(fleet)
    errors.update(_signal_errors(spec, plan, robots))
    if spec.evaluation.on == "simulator" and robots and plan is not None:
        why = _simulator_refusal(spec, plan, robots)
        if why:
            errors["evaluation.on"] = (
                f"the cloud's simulator evaluation cannot run: {why}; use evaluation.on: "
                "robots (policy-only episodes on the run's robots)"
            )
    if errors:
        raise RunSpecError(errors)
    assert plan is not None
    return plan.spec


def _signal_errors(spec: RunSpec, plan: RunPlan | None, robots: list[Robot]) -> dict[str, str]:
    """What the robots' declared signals refuse (``runs.signals``); robots whose enrolled
    specs do not parse are refused by :func:`_fleet_errors` already."""
    from hal.compat import SpecMismatch
    from runs.signals import signal_errors

    try:
        learns_from = None if plan is None else plan.learns_from
        return signal_errors(spec, learns_from, {r.name: r.spec for r in robots})
    except SpecMismatch:
        return {}


def _simulator_refusal(spec: RunSpec, plan: RunPlan, robots: list[Robot]) -> str | None:
    """Why a simulated robot of the robots' driver kind cannot evaluate the run (None: it
    can; ``runs.evaluator.simulated_robot``)."""
    from runs.evaluator import simulated_robot, simulator_kind

    try:
        simulated_robot(
            simulator_kind({r.name: r.spec for r in robots}),
            spec.tasks,
            plan.params.eval_max_steps,
        )
    except ValueError as exc:
        return str(exc)
    return None


def _shared_features(robots: list[Robot]) -> dict[str, Any] | None:
    """The observation features the robots share (None: they share none: refused above)."""
    from hal.compat import SpecMismatch, run_features

    try:
        return dict(run_features({r.name: r.spec for r in robots}).observation_features)
    except SpecMismatch:
        return None


def _with_action(robots: list[Robot], features: dict[str, Any] | None) -> dict[str, Any] | None:
    """``features`` plus the robots' ``action`` feature: what offline data must match."""
    from hal.compat import run_features

    if features is None:
        return None
    action = run_features({r.name: r.spec for r in robots}).action_features
    return {**features, **action}


def _matching_robots(store: MetadataStore, spec: RunSpec) -> list[Robot]:
    """The fleet's robots (any status but retired) that match the spec's robot request."""
    demand = spec.robots
    with store.session() as s:
        q = select(Robot).where(Robot.status != RobotStatus.RETIRED).order_by(Robot.name)
        if demand.robot_type is not None:
            q = q.where(Robot.robot_type == demand.robot_type)
        return [r for r in s.scalars(q) if all(r.tags.get(k) == v for k, v in demand.tags.items())]


def _fleet_errors(spec: RunSpec, plan: RunPlan | None, robots: list[Robot]) -> dict[str, str]:
    """What the matching robots' enrolled specs refuse: features one policy cannot take,
    no operator for an algorithm that needs one, tasks none of them runs."""
    from hal.compat import SpecMismatch, robot_spec, run_features

    errors: dict[str, str] = {}
    try:
        run_features({r.name: r.spec for r in robots})
    except SpecMismatch as exc:
        errors["robots"] = f"the matching robots cannot share one policy: {exc}"
        return errors
    lacking = [r.name for r in robots if (r.spec.get("computer") or {}).get("operator") == "none"]
    if plan is not None and plan.needs_operator and lacking:
        errors["robots"] = (
            f"{spec.algorithm} learns from operator interventions and {lacking} have no "
            "operator (their robot computers run --operator none); select other robots "
            "with robots.tags or give them an operator"
        )
    if spec.demonstrations.episodes_per_task and lacking:
        errors["demonstrations.episodes_per_task"] = (
            f"operators demonstrate on the robots and {lacking} have none (--operator none); "
            "set it to 0 or select robots with an operator"
        )
    offered: set[str] = set()
    open_ended = False
    for r in robots:
        tasks = robot_spec(r.name, r.spec).tasks
        offered.update(tasks)
        open_ended = open_ended or not tasks
    unknown = unknown_names(spec.tasks, offered)
    if unknown and not open_ended:
        errors["tasks"] = f"no matching robot runs {unknown}"
    return errors


def _unapplied_buffer_fields(spec: RunSpec) -> dict[str, str]:
    """``buffer`` fields a run would accept and then ignore (or never reach): refused by name.

    The algorithm picks its sampler (HG-DAgger: operator steps; RECAP: uniform; SAC: RLPD's
    symmetric halves, ``buffer.online_fraction``); a ``buffer.min_size`` beyond
    ``stop.env_steps`` would end the run before its first online update (both count robot
    steps); an adaptive mix needs offline data to mix.
    """
    default = type(spec.buffer)()
    errors: dict[str, str] = {}
    if spec.buffer.sampler != default.sampler:
        errors["buffer.sampler"] = (
            f"runs use their algorithm's sampler ({spec.algorithm}); leave it out"
        )
    env_steps = spec.stop.env_steps
    if env_steps is not None and spec.buffer.min_size > env_steps:
        errors["buffer.min_size"] = (
            f"{spec.buffer.min_size} robot transitions before online updates, but"
            f" stop.env_steps ends the run at {env_steps}: it would never train online"
        )
    if spec.buffer.mix == "adaptive" and not spec.buffer.offline_data:
        errors["buffer.mix"] = "adaptive mixes online and offline data: add buffer.offline_data"
    return errors


def submit_run(store: MetadataStore, spec: RunSpec, runs_dir: Path, *, actor: str) -> str:
    """Validate and record a ``pending`` run (a running cloud starts it); returns its id.

    Raises:
        RunSpecError: :func:`validate_launch` refused the spec; nothing was recorded.
    """
    return record_run(store, validate_launch(store, spec, runs_dir.parent), runs_dir, actor=actor)


class QueuedRunManager:
    """Runs through the metadata store alone, for a process without a cloud in it
    (``robofleet dashboard``, ``robofleet run``): every request is recorded for the cloud
    that drives the run to act on within a second (:meth:`RunManager.poll`). With no cloud
    running on ``data_dir``, ``stop`` ends the run at once and releases its robots.
    """

    def __init__(self, store: MetadataStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir

    def parse_spec(self, data: Any) -> RunSpec:
        return parse_spec(data)

    def launch(self, spec: RunSpec, *, actor: str) -> str:
        return submit_run(self.store, spec, self.data_dir / "runs", actor=actor)

    def stop(self, run_id: str, *, actor: str) -> None:
        request(self.store, run_id, "stop", actor=actor)
        if cloud_running(self.data_dir) is None:
            end_run(
                self.store, run_id, RunState.STOPPED, "stopped with no cloud running", actor=actor
            )

    def pause(self, run_id: str, *, actor: str) -> None:
        request(self.store, run_id, "pause", actor=actor)

    def resume(self, run_id: str, *, actor: str) -> None:
        request(self.store, run_id, "resume", actor=actor)

    def offline_sources(self) -> list[dict[str, Any]]:
        return offline_sources(self.data_dir, self.store)

    def checkpoint_now(self, run_id: str, *, actor: str) -> None:
        """Recorded as an event; only a cloud with the run's learner can act on it."""
        run = self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.state not in ACTIVE_STATES | {RunState.PAUSED}:
            raise RunStateError(f"run {run_id} has no running learner ({run.state.value})")
        self.store.record_event("run.checkpoint_requested", actor=actor, run_id=run_id)


class RunManager:
    """Runs of one cloud (a ``foundation.contracts.RunManager``).

    Args:
        ctx: the cloud's shared services.
        runs_dir: where run directories go.
        auto_resume: on start, resume runs the previous cloud left running; otherwise mark
            them ``crashed`` ("cloud restarted") for a one-click resume.
    """

    def __init__(self, ctx: CloudContext, runs_dir: Path, auto_resume: bool = True) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.runs_dir = runs_dir
        self.auto_resume = auto_resume
        self.drivers: dict[str, RunDriver] = {}
        self._lock = threading.RLock()

    # -- foundation.contracts.RunManager ----------------------------------------------------

    def parse_spec(self, data: Any) -> RunSpec:
        return parse_spec(data)

    def launch(self, spec: RunSpec, *, actor: str) -> str:
        run_id = submit_run(self.store, spec, self.runs_dir, actor=actor)
        self._start(run_id)
        return run_id

    def _request(self, run_id: str, action: str, actor: str) -> RunDriver | None:
        """Record ``action`` in the store (raises when refused); the run's driver, if any."""
        with self._lock:
            driver = self.drivers.get(run_id)
        request(self.store, run_id, action, actor=actor)
        return driver

    def stop(self, run_id: str, *, actor: str) -> None:
        driver = self._request(run_id, "stop", actor)
        if driver is not None:
            driver.request_stop(f"stopped by {actor}")
        else:
            self._finish_without_driver(run_id, RunState.STOPPED)

    def pause(self, run_id: str, *, actor: str) -> None:
        """Agents stop and drain; the run keeps its leases, placement and learner."""
        driver = self._request(run_id, "pause", actor)
        if driver is not None:
            driver.request_pause()

    def resume(self, run_id: str, *, actor: str) -> None:
        """A paused run's agents start again on its robots; any other run starts afresh."""
        driver = self._request(run_id, "resume", actor)
        if driver is not None:
            driver.request_resume()
        else:
            self._start(run_id)

    def offline_sources(self) -> list[dict[str, Any]]:
        return offline_sources(self.runs_dir.parent, self.store)

    def checkpoint_now(self, run_id: str, *, actor: str) -> None:
        with self._lock:
            driver = self.drivers.get(run_id)
        if driver is None:
            if self.store.get_run(run_id) is None:
                raise RunNotFound(run_id)
            raise RunStateError(f"run {run_id} has no running learner")
        driver.request_checkpoint()
        self.store.record_event("run.checkpoint_requested", actor=actor, run_id=run_id)

    # -- cloud side ------------------------------------------------------------------------

    def _start(self, run_id: str) -> RunDriver | None:
        with self._lock:
            if run_id in self.drivers:
                return self.drivers[run_id]
            run = self.store.get_run(run_id)
            if run is None:
                raise RunNotFound(run_id)
            spec = parse_run_spec(run.spec)
            driver = RunDriver(self.ctx, run_id, spec, Path(run.run_dir), on_end=self._ended)
            self.drivers[run_id] = driver
        return driver.start()

    def _ended(self, driver: RunDriver) -> None:
        with self._lock:
            if self.drivers.get(driver.run_id) is driver:
                del self.drivers[driver.run_id]

    def _finish_without_driver(self, run_id: str, state: RunState) -> None:
        end_run(self.store, run_id, state, "no cloud process was running it", actor="run-manager")

    def resume_interrupted(self) -> list[str]:
        """At cloud start: runs left active by a cloud that died; resumed or marked crashed."""
        with self.store.session() as s:
            runs = list(
                s.scalars(
                    select(Run.id).where(
                        Run.state.in_([*ACTIVE_STATES - {RunState.PENDING}, RunState.STOPPING])
                    )
                )
            )
        for run_id in runs:
            if self.auto_resume:
                set_state(self.store, run_id, RunState.RESUMING, "cloud restarted")
                self._start(run_id)
            else:
                end_run(
                    self.store, run_id, RunState.CRASHED, "cloud restarted", actor="run-manager"
                )
        return runs

    def poll(self) -> None:
        """Act on requests other processes wrote into the store (module docstring)."""
        with self.store.session() as s:
            rows = list(s.execute(select(Run.id, Run.state)))
        for run_id, state in rows:
            with self._lock:
                driver = self.drivers.get(run_id)
            if driver is None and state in (RunState.PENDING, RunState.RESUMING):
                self._start(run_id)
            elif driver is not None and state == RunState.STOPPING and driver.stop_reason is None:
                driver.request_stop("stop requested")
            elif driver is not None and state == RunState.PAUSED and not driver.want_pause:
                driver.request_pause()
            elif driver is not None and state == RunState.RESUMING and driver.want_pause:
                driver.request_resume()

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Cloud going down: every run checkpoints and lets go, to be resumed at next start."""
        with self._lock:
            drivers = list(self.drivers.values())
        for d in drivers:
            d.detach = True
        for d in drivers:
            d.join(timeout_s)
