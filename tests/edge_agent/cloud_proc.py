"""A cloud process for end-to-end tests: comms' CloudServer in front of a real ReplayBuffer.

Run as ``python -m tests.edge_agent.cloud_proc DB_URL BUFFER_DIR PORT``; prints ``ready`` once
serving, then serves until killed (tests SIGKILL it mid-episode and start it again).

comms checks an integer ``robot_id`` on the wire while the buffer schema stores a string; the
sink below converts, as the cloud's real adapter will have to (see the issue 6 report).
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa

from buffer.replay_buffer import ReplayBuffer
from buffer.schema import StepSchema
from comms.server import CloudServer
from robofleet.store.store import MetadataStore


def metaworld_schema() -> StepSchema:
    from hal.drivers.metaworld import MetaWorldDriver

    d = MetaWorldDriver("schema-probe", task="reach-v3")
    return StepSchema.from_features(d.observation_features, d.action_features)


class BufferSink:
    """comms ``StepSink`` over a ``ReplayBuffer`` (durable = fdatasynced by the buffer)."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self.buf = buf

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        i = batch.schema.get_field_index("robot_id")
        field = pa.field("robot_id", pa.string(), nullable=False)
        batch = batch.set_column(i, field, batch.column(i).cast(pa.string()))
        return int(self.buf.append(batch).acked[str(robot_id)])

    def durable_seq(self, robot_id: int) -> int:
        last = self.buf.index.last_seq(str(robot_id))
        return -1 if last is None else int(last)


def main(argv: list[str]) -> int:
    db_url, buffer_dir, port = argv[0], argv[1], int(argv[2])
    from tests.comms.helpers import fast_settings

    store = MetadataStore(db_url)
    buf = ReplayBuffer.open(buffer_dir, metaworld_schema())
    server = CloudServer(fast_settings(), store, BufferSink(buf), port=port)
    server.start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
