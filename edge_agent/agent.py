"""The edge agent: one robot's control loop, composed of one collaborator per job.

See :mod:`edge_agent.core` for the step, in full, and ``docs/edge_agent.md`` for timing,
cloud control (e-stop, pause), weights at safe boundaries, demonstrations, rerecord /
discard marks, resets by people (:mod:`edge_agent.resets`) and the human cost counted per
task (:mod:`edge_agent.human_cost`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from comms.wire.marks import EpisodeMark
from edge_agent.config import EdgeSettings
from edge_agent.control import CloudControl
from edge_agent.core import (
    DEMONSTRATION,
    ControlledRobot,
    EpisodeView,
    Heartbeat,
    InterventionSource,
    OperatorInput,
    PolicyRunner,
    WeightSource,
)
from edge_agent.episode_state import Episode
from edge_agent.episodes import EpisodeLog, MarkOutbox
from edge_agent.evaluation import is_evaluation, scored_by
from edge_agent.heartbeat import HeartbeatLoop
from edge_agent.help import HelpDesk, send_heartbeat
from edge_agent.help_risk import RiskSource
from edge_agent.holds import Holds
from edge_agent.operators import NoOperator
from edge_agent.pacing import StepClock, set_realtime
from edge_agent.recording import EpisodeRecorder
from edge_agent.resets import ResetHold, needs_person
from edge_agent.rewards import RewardSource, RobotReward, Scored
from edge_agent.run_counts import RunCounts
from edge_agent.stats import LoopStats
from edge_agent.uplink import UplinkWorker
from edge_agent.weights import WeightApplier

log = logging.getLogger(__name__)


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
        demonstrations: task -> demonstration episodes to record first (module docstring).
        rewards: where each stored step's reward comes from (the run's ``reward.source``,
            :mod:`edge_agent.rewards`; default: the driver's).
        helpdesk / risk: the run's help requests (:mod:`edge_agent.help`) and the risk they
            come from (:mod:`edge_agent.help_risk`); None: the robot never asks.
    """

    def __init__(
        self,
        driver: ControlledRobot,
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
        demonstrations: Mapping[str, int] | None = None,
        rewards: RewardSource | None = None,
        helpdesk: HelpDesk | None = None,
        risk: RiskSource | None = None,
    ) -> None:
        if not tasks:
            raise ValueError("an edge agent needs at least one task")
        unknown = sorted(set(demonstrations or {}) - set(tasks))
        if unknown:
            raise ValueError(f"demonstrations of tasks {unknown} this robot does not run")
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
        self.rewards: RewardSource = rewards or RobotReward()
        self.stats = LoopStats()
        self._heartbeats = HeartbeatLoop(self._send_heartbeat, settings.heartbeat_interval_s)
        spool_dir = Path(uplink.spool.directory)
        self.control = CloudControl(
            driver,
            spool_dir / "control.jsonl",
            on_change=self._heartbeats.beat if heartbeat is not None else None,
        )
        self.state = "idle"
        self._stop = threading.Event()
        self.helpdesk = helpdesk
        self.risk = risk
        if helpdesk is not None:
            helpdesk.on_change = self._heartbeats.soon
            self.control.on_help = helpdesk.answered
        offers = [risk.offer_weights] if risk is not None else []
        self._applier = WeightApplier(
            weights, runner, settings, self.stats, self.rewards, also=offers
        )
        self._holds = Holds(self.control, uplink, self._stop, self.stats)
        self._episodes = EpisodeLog(spool_dir)
        self.marks = MarkOutbox(spool_dir)
        self._redo: str | None = None  # the task of a rerecorded episode, recorded next
        self._help_hold_s = 0.0
        done = self._episodes.demonstrations()
        self._demos_left = {
            t: n - done.get(t, 0) for t, n in (demonstrations or {}).items() if n > done.get(t, 0)
        }
        hz = settings.control_hz or float(driver.control_hz)
        self.period = 1.0 / hz
        self.counts = RunCounts(spool_dir, self.period)  # kept across this run's agents
        self._resets = ResetHold(
            needs_person(driver), self.control, self.operator, self._stop, settings.reset_timeout_s
        )

    # -- public ----------------------------------------------------------------------------

    @property
    def applied_version(self) -> int:
        return self.runner.policy_version

    @property
    def next_episode_index(self) -> int:
        """The ``episode_index`` the next episode gets (kept across restarts)."""
        return self._episodes.next_index

    def stop(self) -> None:
        """Finish the current step, close the episode as truncated, return from ``run``."""
        self._stop.set()
        self.control.changed.set()  # wake a held loop

    def rerecord(self, reason: str = "local") -> None:
        """End the running episode at its next step, never train on it, record its task
        again (as the operator's ``r``)."""
        self.control.handle("rerecord", reason)

    def discard(self, reason: str = "local") -> None:
        """End the running episode at its next step and never train on it (``x``)."""
        self.control.handle("discard", reason)

    def ready(self, reason: str = "local") -> None:
        """The operator set the cell up again: a robot holding for a reset goes on
        (:mod:`edge_agent.resets`; the dashboard's Ready button sends the same)."""
        self.control.handle("ready", reason)

    def clear_estop(self, reason: str = "local") -> None:
        """Release a cloud e-stop here at the robot (a human decision); the loop goes on."""
        self.control.handle("clear_estop", reason)

    @property
    def heartbeat_state(self) -> str:
        """``estopped`` / ``paused`` while the cloud holds the robot, ``resetting`` while it
        waits for a person's reset (``paused`` once that wait timed out), else the loop's."""
        if self.control.estopped or self.state == "estopped":
            return "estopped"
        if self.state == "resetting":
            return "paused" if self._resets.timed_out else "resetting"
        if self.control.paused and self.state == "running":
            return "paused"
        return self.state

    def report(self) -> dict[str, float]:
        """Heartbeat statistics: loop timing, interventions, spool and uplink counters."""
        spool = self.uplink.spool
        out = self.stats.percentiles_ms()
        out.update(self.stats.counters())
        out.update(
            marks_pending=float(len(self.marks)),
            spool_bytes=float(spool.nbytes),
            spool_batches=float(len(spool)),
            dropped_steps=float(spool.dropped_steps),
            seq_gaps=float(spool.gap_steps),
            invalid_steps=float(self.uplink.stats.invalid),
            acked_seq=float(spool.acked_seq),
            next_seq=float(spool.next_seq),
            holds=float(getattr(self.runner, "holds", 0)),
        )
        out.update(self.control.report())
        out.update(self.counts.report())
        operator_report = getattr(self.operator, "report", None)  # a source's own counters
        if callable(operator_report):
            out.update(operator_report())
        out["reset_paused"] = float(self._resets.timed_out)
        out["reset_timeouts"] = float(self._resets.timeouts)
        if self.helpdesk is not None:
            out.update(self.helpdesk.report())
            out["help_hold_s"] = self._help_hold_s
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
            set_realtime(self.settings.realtime_priority)
        self.driver.connect()
        beating: AbstractContextManager[None] = (
            self._heartbeats.running() if self.heartbeat is not None else nullcontext()
        )
        with beating:  # the last beat, after the loop's end, carries the run's final numbers
            self.state = "running"
            try:
                done = 0
                while (episodes is None or done < episodes) and not self._stop.is_set():
                    if self.control.holding:
                        self._holds.cloud_hold()
                        continue
                    if self._resets.needed and not self._reset_by_person():
                        continue
                    demo = self._next_demonstration()
                    if demo is not None:  # needs no weights: the operator drives
                        if self._episode(demo, demonstrating=True):
                            done += 1
                        continue
                    if self._applier.awaiting_first():
                        self._holds.first_weights(self._applier.awaiting_first)
                        continue
                    if self._episode(task or self._next_task()):
                        done += 1
            finally:
                self.state = "estopped" if self.heartbeat_state == "estopped" else "stopped"
                self.uplink.flush()
        return self.report()

    def _reset_by_person(self) -> bool:
        """Hold until the operator signals ready (:mod:`edge_agent.resets`); False when a
        cloud hold or a stop interrupted the wait."""
        self.state = "resetting"  # the next regular heartbeat says so
        beat = self._heartbeats.beat if self.heartbeat is not None else (lambda: None)
        try:
            done = self._resets.wait(self.counts.reset_time, beat)  # beats at once on timeout
        finally:
            self.state = "running"
        if done:
            self.counts.human.reset_done()
        return done

    # -- one episode -------------------------------------------------------------------------

    def _next_task(self) -> str:
        """A rerecorded episode's task, else the next in turn by episode index."""
        redo, self._redo = self._redo, None
        return redo or self.tasks[self._episodes.next_index % len(self.tasks)]

    def _next_demonstration(self) -> str | None:
        """The task of the next demonstration still to record, None when none is left."""
        if self._redo is not None and self._demos_left.get(self._redo):
            redo, self._redo = self._redo, None
            return redo
        return next((t for t in self.tasks if self._demos_left.get(t)), None)

    def _episode(self, task: str, demonstrating: bool = False) -> bool:
        """Run one episode; False when it does not count (a cloud e-stop came before its
        first step, or the operator discarded it)."""
        ep = self._begin(task)
        if ep is None:
            return False
        if demonstrating:
            ep.demonstrating, ep.evaluating = True, False
        while self._step(ep):
            pass
        counted = self._finish(ep)
        self.counts.save()
        return counted

    def _begin(self, task: str) -> Episode | None:
        """Start an episode of ``task``; None when an e-stop refused the driver's reset."""
        self._applier.apply()  # an episode start is always a safe boundary
        index = self._episodes.begin()
        task_index = self.tasks.index(task)
        try:
            obs = self.driver.reset(task=task)
        except Exception:
            if not self.control.estopped:
                raise
            self._episodes.forget()  # e-stopped before it began: it never existed
            return None
        self.runner.reset()
        self.operator.reset()
        self.rewards.reset()
        if self.helpdesk is not None:
            self.helpdesk.begin_episode()
        ids = {
            "robot_id": self.robot_id,
            "run_id": self.run_id,
            "task": task,
            "episode_index": index,
        }
        hold_all = self.settings.episode_commit == "episode_end"
        recorder = EpisodeRecorder(self.uplink, hold_all, ids)
        ep = Episode(task, task_index, index, recorder, StepClock(self.period, self.stats), obs)
        ep.evaluating = is_evaluation(index, self.settings.evaluate_every_episodes)
        return ep

    def _step(self, ep: Episode) -> bool:
        """One control step (see :mod:`edge_agent.core`); False once the episode has ended."""
        if not self._step_boundary(ep):
            return False
        start = ep.clock.start(first=ep.frame == 0)
        if ep.demonstrating:
            proposed, version, op = self._demonstration_step(ep)
        else:
            if self._applier.due(ep.frame):
                self._applier.apply()
            fresh = self.runner.at_chunk_boundary
            proposed, version = self.runner.act(ep.obs, ep.task_index)
            self._applier.account(version)
            op = self.operator.step(ep.obs, proposed)
            if self.helpdesk is not None:
                op, held = self._ask_for_help(ep, proposed, op, fresh)
                if held and (self.control.holding or self._stop.is_set()):
                    # A stop or a cloud hold ended the wait: this step sends nothing; the
                    # next boundary honours the hold (or the episode closes here on a stop).
                    if self._stop.is_set() and not self.control.holding:
                        ep.recorder.close(ep.obs)
                        return False
                    return True
                if held:  # the step starts after the hold; timestamps skip it, as a pause's
                    ep.clock.skip(held)
                    start = time.monotonic()
        if ep.evaluating:  # the policy alone acts; the operator may only end the episode
            op = replace(op, is_intervention=False, action=None)
        command = op.action if (op.is_intervention and op.action is not None) else proposed
        try:
            reply = self.driver.send_action({"action": command})
        except Exception:
            if not self.control.estopped:
                raise
            # Latched between our check and the send: the robot refused, the step never
            # happened; the episode ends at the last executed step.
            ep.recorder.close(ep.obs)
            return False
        executed = np.asarray(reply["action"], np.float32)
        self._resets.moved()
        intervening = self._claimed_by_operator(op)
        self.counts.step(ep.task, intervening)
        if self.helpdesk is not None:
            self.helpdesk.operator_step(intervening, type(self.operator).__name__)
        if hasattr(self.runner, "last_executed"):
            self.runner.last_executed = executed
        next_obs = self.driver.get_observation()
        view = self.driver.episode
        labelled = ep.label
        terminated, truncated = self._outcome(ep, view, op)
        verdict = ep.label if ep.label != labelled and ep.label in ("success", "failure") else None
        scored = self.rewards.score(next_obs, view, verdict)
        if scored.proposed_success and ep.label is None and not ep.demonstrating:
            scored = self._proposed_success(ep, scored)
            # Confirmed, the task is done (terminal); overruled, the attempt stops (truncated).
            terminated = terminated or ep.label == "success"
            truncated = truncated or ep.label == "failure"
        ep.recorder.record(
            frame=ep.frame,
            timestamp=ep.clock.timestamp(start),
            reward=scored.reward,
            terminated=terminated,
            truncated=truncated,
            is_intervention=intervening,
            policy_version=int(version),
            observation=ep.obs,
            proposed=proposed,
            executed=executed,
            op=op,
        )
        if intervening:
            self.stats.interventions += 1
            ep.intervened = True
            # The person moved the robot: the rest of the chunk was planned for a state that
            # is gone. The next step (a proposal during the takeover, or the first autonomous
            # action after it) is a fresh inference on the observation it acts on.
            self.runner.reset()
        ep.succeeded = ep.succeeded or bool(getattr(view, "success", False))
        ep.frame += 1
        end_episode = terminated or truncated or self._stop.is_set()
        if end_episode:
            ep.recorder.close(next_obs)
        now = ep.clock.done(start)
        if end_episode:
            return False
        ep.obs = next_obs
        # A cloud e-stop or pause wakes the loop at once; anything else sleeps on.
        ep.clock.wait_next(now, self.control.wait, self._interrupted)
        return True

    def _ask_for_help(
        self, ep: Episode, proposed: np.ndarray, op: OperatorInput, fresh: bool
    ) -> tuple[OperatorInput, float]:
        """The step's risk to the help desk; while a request waits and the run says ``hold``,
        the robot sends nothing and polls its operator every control period until a person
        takes over (that input acts at this step), the request is answered or expires (the
        policy's action goes on), or a stop or cloud hold comes. Returns the step's operator
        input and the seconds held. A person's episode command (a verdict, a discard) while
        the robot waits answers the request."""
        assert self.helpdesk is not None
        desk = self.helpdesk
        risk = None
        if self.risk is not None and ep.demonstrating is False:
            risk = self.risk.risk(ep.obs, ep.task_index, proposed, fresh)
        eligible = not ep.evaluating and not op.is_intervention
        desk.observe(risk, ep.index, ep.frame, eligible)
        if not desk.holds or op.is_intervention:
            return op, 0.0
        polled, held = self._holds.for_help(
            lambda: desk.holds and not self._interrupted(),
            desk.expire_due,
            lambda: self.operator.step(ep.obs, proposed),
            self.period,
        )
        self._help_hold_s += held
        if polled is not None and polled.command and not polled.is_intervention:
            desk.person_answered(type(self.operator).__name__, polled.command)
        return polled or op, held

    def _proposed_success(self, ep: Episode, scored: Scored) -> Scored:
        """The reward source proposed success at this step: the episode ends here, labelled
        by the source, unless the operator overrules it (``review``: a person's opposite
        verdict), which makes it the operator's ``failure`` with no reward on this step (a
        label for the classifier's next training) and ends the episode as truncated, as any
        failure verdict (:meth:`_outcome`). A keyboard or gamepad operator overrules
        with its ``n`` at the same step: that verdict reaches the source first, which then
        proposes nothing."""
        self.stats.proposals += 1
        review = getattr(self.operator, "review", None)
        word = review("success") if callable(review) else None
        if word == "failure":
            self.stats.overrules += 1
            self.counts.human.label(ep.task)  # an overrule is a label a person gave
            ep.label, ep.label_by = "failure", type(self.operator).__name__
            return Scored(0.0)
        ep.label, ep.label_by = "success", self.rewards.name
        return scored

    def _demonstration_step(self, ep: Episode) -> tuple[np.ndarray, int, OperatorInput]:
        """(proposed, version, operator input) of a demonstration step: the robot would hold
        still (zeros); the operator's demonstration (an expert) or input (a person) acts."""
        shape = self.driver.action_features["action"]["shape"]
        hold = np.zeros(int(shape[0]) if shape else 1, np.float32)
        demonstrate = getattr(self.operator, "demonstrate", None)
        op = demonstrate(ep.obs) if callable(demonstrate) else self.operator.step(ep.obs, hold)
        return hold, DEMONSTRATION, op

    def _step_boundary(self, ep: Episode) -> bool:
        """Honour a pause (held here, the clock skips it) or an e-stop before the next step;
        False when the episode must end now (closed at its last executed step)."""
        if self.control.paused and not self.control.estopped:
            ep.clock.skip(self._holds.cloud_hold(in_episode=True))
            if self._stop.is_set() and not self.control.estopped:
                ep.recorder.close(ep.obs)
                return False
            if not self.control.estopped:
                ep.obs = self.driver.get_observation()  # the world may have moved meanwhile
                self.runner.reset()  # so the old chunk's plan no longer applies
        if self.control.estopped:
            ep.recorder.close(ep.obs)
            return False
        return True

    def _claimed_by_operator(self, op: OperatorInput) -> bool:
        """The step's ``is_intervention`` flag."""
        if not isinstance(self.operator, NoOperator):
            return bool(op.is_intervention)
        # Only with no source attached may the robot's own device (a leader arm that
        # overrode this step) claim it; an attached source's flag is never overridden.
        info = getattr(self.driver.episode, "info", None) or {}
        return bool(info.get("is_intervention", False))

    def _outcome(self, ep: Episode, view: EpisodeView, op: OperatorInput) -> tuple[bool, bool]:
        """``(terminated, truncated)`` of the step just sent: the driver's, the step limit's,
        and the operator's episode command (the source's, else the cloud's; it also sets
        ``ep.label``). A success verdict ends the episode as terminated (the task is done); a
        failure verdict as truncated: a failed attempt is not an absorbing state, so a critic
        keeps bootstrapping from it (Pardo et al. 2018, "Time Limits in Reinforcement
        Learning"); a terminal 0 there would teach that the states where people stop an
        attempt, often near the goal, are worth nothing."""
        terminated, truncated = bool(view.terminated), bool(view.truncated)
        limit = self.settings.max_episode_steps
        if limit is not None and ep.frame + 1 >= limit:
            truncated = True
        command, by = op.command, type(self.operator).__name__
        cloud = None if command else self.control.take_command()
        if cloud is not None:
            command, by = cloud[0], f"cloud: {cloud[1]}"
        if command == "estop":
            self.driver.estop()
            self.state = "estopped"
            self._stop.set()
        elif command in ("success", "failure"):
            ep.label, ep.label_by = command, by
            terminated = terminated or command == "success"
            truncated = truncated or command == "failure"
            if cloud is None:  # a person's verdict, not the cloud's
                self.counts.human.label(ep.task)
        elif command in ("rerecord", "discard"):
            ep.label, ep.label_by = command, by
            truncated = True
        return terminated, truncated

    def _finish(self, ep: Episode) -> bool:
        """Count and keep (or discard) the ended episode; False when it does not count: it
        never had a step, or the operator discarded it."""
        if ep.frame == 0:  # e-stopped before the first step: the episode never happened
            self._episodes.forget()
            return False
        self.stats.episodes += 1
        if self.helpdesk is not None:
            self.helpdesk.end_episode(ep.label)
        kept = ep.label not in ("rerecord", "discard")
        self.counts.human.episode(ep.task, ep.frame, kept and self._autonomous(ep))
        if ep.label in ("success", "failure"):
            self.stats.labels[ep.label] += 1
        kind = "demonstration" if ep.demonstrating else "episode"
        if ep.label not in ("rerecord", "discard"):
            ep.recorder.commit()
            self._episodes.log(ep.index, ep.task, ep.frame, ep.label, kind)
            if ep.demonstrating:
                self._demos_left[ep.task] -= 1
                self.stats.demonstrations += 1
            success = self._count_outcome(ep)
            # The buffer keeps each kept episode's outcome (runs mount successful episodes).
            by = ep.label_by if ep.label in ("success", "failure") else "driver"
            outcome = "success" if success else "failure"
            self.marks.add(EpisodeMark(self.run_id, ep.index, outcome, by))
            return True
        self.stats.discarded_episodes += 1
        if ep.label == "rerecord":
            self._redo = ep.task
        if ep.recorder.hold_all and ep.label == "rerecord":
            self._episodes.forget()  # nothing of it left the robot: its redo takes its index
            return False
        if not ep.recorder.hold_all:  # its rows are on their way: the cloud must know
            self.marks.add(EpisodeMark(self.run_id, ep.index, ep.label, ep.label_by))
        self._episodes.log(ep.index, ep.task, ep.frame, ep.label, kind)
        if ep.evaluating:  # an operator's abort of an evaluation episode is a failure
            self.counts.tally.add("eval", ep.task, False, self.applied_version, "operator")
        return False

    def _count_outcome(self, ep: Episode) -> bool:
        """Count an evaluation or autonomous episode's success (``edge_agent.evaluation``);
        returns whether the kept episode succeeded (the operator's label, else the
        driver's success signal)."""
        if ep.label in ("failure", "rerecord"):
            success = False
        else:
            success = ep.label == "success" or ep.succeeded
        if ep.evaluating and not ep.demonstrating:
            spec = getattr(self.driver, "spec", None)  # hal drivers declare it; fakes may not
            detects = bool(spec is not None and spec.capabilities.detects_success)
            scorer = scored_by(ep.label, ep.label_by, ep.succeeded, detects)
            self.counts.tally.add("eval", ep.task, success, self.applied_version, scorer)
        elif self._autonomous(ep):
            self.counts.tally.add("autonomous", ep.task, success)
        return success

    @staticmethod
    def _autonomous(ep: Episode) -> bool:
        """A training episode the policy ran alone (no demonstration, evaluation, takeover)."""
        return not (ep.demonstrating or ep.evaluating or ep.intervened)

    def _interrupted(self) -> bool:
        return self.control.holding or self._stop.is_set()

    def _send_heartbeat(self) -> None:
        assert self.heartbeat is not None
        state, version, report = self.heartbeat_state, self.applied_version, self.report()
        send_heartbeat(self.heartbeat, self.helpdesk, state, version, report)
