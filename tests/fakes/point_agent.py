"""A real edge agent on the suite's fake robot, as its own process (for tests that SIGKILL it).

``python -m tests.fakes.point_agent SERVER SPOOL_DIR RUN_ID EPISODES MAX_STEPS HZ COUNT_FILE``
builds the agent with :func:`edge_agent.build.build_agent` (the CLI's and the Ray actor's path:
spool, uplink, uploader, episode marks, cloud control) on a :class:`CountingPointRobot`, with the
robot's credential already in ``SPOOL_DIR`` and the agent's default batching and spooling
settings (what such tests are about). ``EPISODES`` 0 runs until killed. It prints ``running``
when the agent is built and, after a normal end, waits until the cloud holds every spooled
step (exit 3 when it does not within a minute).

``COUNT_FILE`` gets one byte per action the robot executed (an unbuffered ``write`` after each
``send_action``: the kernel keeps it when the process is SIGKILLed), so a test knows how many
steps really happened, whatever the agent had made durable by then.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.fakes.cloud import Cloud
from tests.fakes.robot import PointRobot

if TYPE_CHECKING:
    from buffer.table.replay_buffer import ReplayBuffer
    from foundation.store.metadata_store import MetadataStore

KIND = "counting-point"


class CountingPointRobot(PointRobot):
    """:class:`PointRobot` whose executed actions are counted in a file (see the module).

    Args:
        name: the robot's name.
        count_file: where one byte per executed action is appended.
        episode_steps: actions per episode (None: never truncated by the robot).
    """

    def __init__(self, name: str, count_file: str, episode_steps: int | None = None) -> None:
        super().__init__(episode_steps=episode_steps, name=name)
        self._count = os.open(count_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def send_action(self, action: Any) -> Any:
        reply = super().send_action(action)
        os.write(self._count, b".")
        return reply


DRIVER = "tests.fakes.point_agent:CountingPointRobot"  # its hal.drivers.DRIVER_KINDS entry


def cloud_on_buffer(store: MetadataStore, directory: Path) -> tuple[ReplayBuffer, Cloud[Any]]:
    """A real replay buffer at ``directory`` for this robot's steps and a cloud in front of
    it (the caller closes both)."""
    from buffer.table.replay_buffer import ReplayBuffer
    from buffer.table.schema import StepSchema
    from comms.cloud.replay_buffer_sink import ReplayBufferSink

    probe = PointRobot()
    schema = StepSchema.from_features(probe.observation_features, probe.action_features)
    buf = ReplayBuffer.open(directory, schema)
    return buf, Cloud(store, ReplayBufferSink(buf))


def main(argv: list[str]) -> int:
    from edge_agent.build import AgentOptions, build_agent
    from edge_agent.config import EdgeSettings
    from hal.drivers import DRIVER_KINDS
    from tests.fakes.settings import fast_comms

    server, spool_dir, run_id, episodes, max_steps, hz, count_file = argv
    DRIVER_KINDS[KIND] = DRIVER
    edge = EdgeSettings(
        control_hz=float(hz), heartbeat_interval_s=0.2, wait_for_first_weights=False
    )
    opts = AgentOptions(
        robot_name="point-agent",
        tasks=["reach"],
        run_id=run_id,
        server=server,
        operator="none",
        max_episode_steps=int(max_steps),
        spool_dir=Path(spool_dir),
        driver=KIND,
        driver_options={"count_file": count_file},
    )
    built = build_agent(edge, fast_comms(), opts)
    agent = built.agent
    print("running", flush=True)
    agent.run(episodes=int(episodes) or None)
    drained = agent.uplink.wait_acked(60)
    built.close()
    return 0 if drained else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
