"""Processes of the WAN test (tests/comms/test_wan.py), one per network namespace.

``python -m tests.comms.wan_driver cloud HOST DBURL N`` serves the cloud on HOST and prints
``{"port", "robots": [[id, credential], ...]}``; ``site CLOUD ROBOTS_JSON`` runs a site relay
behind a latency/drop proxy with 4 robots (ZeroMQ weights, uploads) and prints ``{"ready"}``.
Then both answer one JSON line per command line on stdin (see ``_cloud`` and ``_site``).
Timestamps are ``time.monotonic()``, one clock for every process of the machine.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import time
from typing import Any

import numpy as np

RUN = "run-wan"


def _say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _cloud(host: str, db_url: str, n: int, version_floats: int) -> None:
    from tests.fakes.cloud import Cloud, migrated_store
    from tests.fakes.settings import wan_comms

    store = migrated_store(db_url, RUN, algorithm="wan-test")
    cloud = Cloud(store, settings=wan_comms(bind_host=host, grpc_port=0))
    server, sink, port = cloud.server, cloud.sink, cloud.port
    enrolled = [cloud.robot(f"wan-arm-{i}", lease=RUN) for i in range(n)]
    robots = [(r.robot_id, r.credential) for r in enrolled]
    pub = server.distributor(RUN)
    rng = np.random.default_rng(0)
    _say({"port": port, "robots": robots})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "publish":  # a version where every weight changed: no delta helps
            state = {"w": rng.standard_normal(version_floats).astype(np.float32)}
            t0 = time.monotonic()
            v = pub.publish(state)
            _say({"version": v, "published_at": t0, "payload_bytes": 4 * version_floats})
        elif cmd[0] == "stats":
            _say(
                {
                    "seqs": {str(r): sink.seqs(r) for r, _ in robots},
                    "weight_bytes_sent": server.stats()["weight_bytes_sent"],
                    # chunks sent on the data plane: they cross the shaped link, not the proxy
                    "data_plane_bytes": (
                        server.state.dataplane.weight_bytes_sent if server.state.dataplane else 0
                    ),
                }
            )
    cloud.close()
    store.close()


def _site(cloud: str, robots: list[list[Any]], latency_s: float) -> None:
    from comms.relay.site_relay import SiteRelay
    from comms.robot.client import EdgeClient, make_channel
    from comms.robot.receiver import WeightReceiver
    from comms.robot.uploader import MemorySpool, Uploader
    from comms.robot.zmq_subscription import ZmqWeightSubscription
    from tests.comms.helpers import steps
    from tests.comms.netproxy import TcpProxy
    from tests.fakes.settings import wan_comms

    settings = wan_comms(call_timeout_s=30.0)
    link = TcpProxy(cloud, latency_s=latency_s)  # the site's end of the WAN link
    relay = SiteRelay(settings, cloud_address=link.address, port=0, zmq_port=0)
    relay.start()
    applied_at: dict[int, dict[int, float]] = {}
    lock = threading.Lock()

    def on_applied(robot: int, version: int) -> None:
        with lock:
            applied_at.setdefault(version, {})[robot] = time.monotonic()

    clients, sources, spools, uploaders = [], [], [], []
    for i, (_rid, cred) in enumerate(robots):
        c = EdgeClient(make_channel(relay.address, settings), cred, settings)
        rx = WeightReceiver(on_applied=functools.partial(on_applied, i))
        sources.append(ZmqWeightSubscription(c, relay.zmq_address, RUN, rx))
        spool = MemorySpool()
        uploaders.append(Uploader(c, RUN, spool))
        clients.append(c)
        spools.append(spool)
    next_seq = [0] * len(robots)
    producing = threading.Event()
    producing.set()

    def produce() -> None:  # 4 robots x 50 steps/s of 1 KiB observations
        while producing.is_set():
            for i, (rid, _c) in enumerate(robots):
                first = next_seq[i]
                spools[i].put(steps(rid, first, 5, payload_bytes=1024))
                next_seq[i] = first + 5
            time.sleep(0.1)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    _say({"ready": True})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "applied":  # {"at": {robot: t}} once every robot applied the version
            version = int(cmd[1])
            deadline = time.monotonic() + float(cmd[2])
            while time.monotonic() < deadline:
                with lock:
                    got = dict(applied_at.get(version, {}))
                if len(got) == len(robots):
                    break
                time.sleep(0.01)
            _say({"at": got, "link_bytes_down": link.bytes_down})
        elif cmd[0] == "drop":
            link.drop_connections()
            _say({"dropped": True, "connections": link.connections})
        elif cmd[0] == "stop_producing":
            producing.clear()
            producer.join()
            last = [n - 1 for n in next_seq]
            ok = [up.wait_durable(s, float(cmd[1])) for up, s in zip(uploaders, last, strict=True)]
            _say(
                {
                    "last_seq": last,
                    "durable": ok,
                    "reconnects": [up.reconnects for up in uploaders],
                    "link_connections": link.connections,
                }
            )
    for up in uploaders:
        up.close()
    for src in sources:
        src.close()
    for c in clients:
        c.close()
    relay.stop()
    link.close()


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if argv[0] == "cloud":
        _cloud(argv[1], argv[2], int(argv[3]), int(argv[4]))
    else:
        _site(argv[1], json.loads(argv[2]), float(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
