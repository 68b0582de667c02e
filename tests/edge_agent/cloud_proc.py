"""A cloud process for end-to-end tests: comms' CloudServer in front of a real ReplayBuffer.

Run as ``python -m tests.edge_agent.cloud_proc DB_URL BUFFER_DIR PORT``; prints ``ready`` once
serving, then serves until killed (tests SIGKILL it mid-episode and start it again). Uploads
go into the buffer through the cloud's own sink, ``comms.buffer_sink.BufferSink``.
"""

from __future__ import annotations

import sys
import time

from buffer.replay_buffer import ReplayBuffer
from buffer.schema import StepSchema
from comms.buffer_sink import BufferSink
from comms.server import CloudServer
from robofleet.store.store import MetadataStore


def metaworld_schema() -> StepSchema:
    from hal.drivers.metaworld import MetaWorldDriver

    d = MetaWorldDriver("schema-probe", task="reach-v3")
    return StepSchema.from_features(d.observation_features, d.action_features)


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
