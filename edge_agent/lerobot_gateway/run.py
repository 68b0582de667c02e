"""One run's cloud links on a gateway: durable spool, uplink, uploader, weight subscription.

Opened when the cloud assigns the gateway's robot to a run, closed at its release. The spool
is the run's own (``<root>/runs/<run_id>``, as ``edge_agent.host`` keeps it), so a gateway
restarted mid-run continues the run's episode numbering and sends what it had not sent.
Each new version the subscription applies is converted (:mod:`.parameters`) and offered to
the actor streams; a version that does not convert is logged, counted and skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buffer.table.schema import StepSchema
from comms.robot.grpc_subscription import GrpcWeightSubscription
from comms.robot.receiver import WeightReceiver
from comms.robot.uploader import Uploader
from edge_agent.build import shard_router
from edge_agent.config import EdgeSettings
from edge_agent.episodes import EpisodeLog
from edge_agent.host import run_spool
from edge_agent.lerobot_gateway.parameters import ParametersFn
from edge_agent.lerobot_gateway.replay import ReplayGuard
from edge_agent.lerobot_gateway.rewards import GatewayReward
from edge_agent.lerobot_gateway.transitions import TransitionIntake
from edge_agent.spool import Spool
from edge_agent.uplink import UplinkWorker

if TYPE_CHECKING:
    from comms.robot.client import EdgeClient

log = logging.getLogger(__name__)


class RunLink:
    """The gateway's part of run ``run_id`` (satisfies ``state.RunSink``).

    Args:
        run_id / task: the run and the task name its rows carry.
        root: the gateway's spool root. robot_id: the enrolled id.
        client: the robot's cloud client. edge: spool and batch settings.
        schema / fps: what transitions are checked against, steps per second.
        parameters: version -> LeRobot bytes. on_parameters(version, bytes): the offer.
        on_error(): called when a version does not convert.
        reward: the run's reward source (``rewards``; None: LeRobot's reward as sent).
        ingest: the assignment's route to the robot's buffer shard (a sharded run; empty or
            None: uploads go to the cloud).

    Raises:
        ValueError: ``ingest`` lacks a field or has one of the wrong type.
    """

    def __init__(
        self,
        run_id: str,
        task: str,
        root: Path,
        robot_id: int,
        client: EdgeClient,
        edge: EdgeSettings,
        schema: StepSchema,
        fps: float,
        parameters: ParametersFn,
        on_parameters: Callable[[int, bytes], None],
        on_error: Callable[[], None],
        reward: GatewayReward | None = None,
        ingest: Mapping[str, Any] | None = None,
    ) -> None:
        router = shard_router(client, run_id, robot_id, ingest or {})  # refused before a start
        self.run_id = run_id
        directory = run_spool(root, run_id)
        directory.mkdir(parents=True, exist_ok=True)
        self.spool = Spool(directory, edge.spool_max_bytes, edge.spool_full_policy)
        self.uplink = UplinkWorker(
            self.spool,
            schema,
            batch_max_steps=edge.batch_max_steps,
            batch_max_delay_s=edge.batch_max_delay_s,
            robot_id_on_wire="int64",
        ).start()
        self.uploader = Uploader(client, run_id, self.spool, router)
        ids = {"robot_id": str(robot_id), "run_id": run_id, "task": task}
        self.reward = reward or GatewayReward("robot")
        self.replaces_reward = self.reward.replaces
        self.intake = TransitionIntake(schema, EpisodeLog(directory), ids, fps, self.reward)
        self.replay_guard = ReplayGuard(directory)
        self._lock = threading.Lock()
        self._convert = parameters
        self._offer = on_parameters
        self._on_error = on_error
        self._stop = threading.Event()
        self.receiver = WeightReceiver(as_torch=True)
        self.subscription = GrpcWeightSubscription(client, run_id, self.receiver)
        self._watcher = threading.Thread(
            target=self._watch, name=f"lerobot-params-{run_id}", daemon=True
        )
        self._watcher.start()

    def store_transitions(self, data: bytes, policy_version: int) -> tuple[int, list[str]]:
        """Convert, submit and make durable (journal or spool) the message's transitions;
        (rows stored, refusal reasons). Raises TransitionRefused for an unreadable message."""
        with self._lock:
            rows, refused = self.intake.convert(data, policy_version)
            for row in rows:
                self.uplink.submit(row)
            if rows and not self.uplink.flush(timeout=60.0):
                raise OSError(f"run {self.run_id}: the spool did not take the steps in 60 s")
        return len(rows), refused

    def stats(self) -> dict[str, float]:
        s = self.uplink.stats
        return {
            "spooled": float(s.spooled),
            "invalid": float(s.invalid),
            "acked_seq": float(self.spool.acked_seq),
            "version_received": float(self.receiver.version),
        }

    def close(self, drain_s: float) -> bool:
        """Stop taking versions, wait up to ``drain_s`` for the cloud to acknowledge the
        spool, stop the uplink; returns whether everything was acknowledged (the rest stays
        in the spool for the next assignment)."""
        self._stop.set()
        self.subscription.close()
        self._watcher.join(5)
        with self._lock:
            drained = self.uplink.wait_acked(drain_s)
        self.uploader.close()
        self.uplink.close()
        if not drained:
            log.warning(
                "run %s: spool not fully acknowledged; kept in %s",
                self.run_id,
                self.spool.directory,
            )
        return drained

    def _watch(self) -> None:
        seen = -1
        while not self._stop.is_set():
            if not self.receiver.wait_for(seen + 1, 0.5):
                continue
            version, weights = self.receiver.current()
            seen = version
            self.reward.offer_weights(weights)  # the run's classifier travels in the version
            try:
                data = self._convert(weights)
            except (ValueError, TypeError, KeyError) as exc:  # NotALeRobotVersion included
                log.error(
                    "run %s: version %d not converted for LeRobot: %s", self.run_id, version, exc
                )
                self._on_error()
                continue
            self._offer(version, data)


def describe(link: RunLink | None) -> dict[str, Any]:
    """The run part of the gateway's heartbeat stats (empty while idle)."""
    return {} if link is None else {f"lerobot.{k}": v for k, v in link.stats().items()}
