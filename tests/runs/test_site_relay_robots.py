"""Robot computers behind a site relay (``robofleet edge --relay``): real ``robofleet relay``
and ``robofleet edge`` processes beside a cloud. Weights reach the robots through the relay's
fan-out, their uploads go through it with end-to-end acks, and when the relay is SIGKILLed the
robots keep acting and spooling; once it is back they upload again and get new versions, and
nothing acknowledged is lost or stored twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundation.store.models import Robot
from tests.fakes.cloud import ROBOFLEET, free_port
from tests.fakes.procs import Child
from tests.fakes.settings import cloud_env
from tests.runs.helpers import run_dir, run_state, wait_until
from tests.runs.test_robot_computers import LIVE, Lab, _acting_in, _idle, _sac_on_pendulum
from tests.runs.test_robot_computers import _stop as stop_run
from tests.runs.test_robot_computers import _stored_once as stored_once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PENDULUMS = ["pend-1", "pend-2"]


class Relay:
    """A ``robofleet relay`` process for the cloud's gRPC, on fixed ports (a restart keeps
    them, as a site's relay does)."""

    def __init__(self, data_dir: Path, cloud: str) -> None:
        self.data_dir, self.cloud = data_dir, cloud
        self.port, self.zmq_port = free_port(), free_port()
        self.child: Child | None = None

    def start(self) -> None:
        argv = [*ROBOFLEET, "relay", "--cloud", self.cloud]
        argv += ["--port", str(self.port), "--zmq-port", str(self.zmq_port)]
        log = self.data_dir / f"relay-{time.time_ns()}.log"
        self.child = Child(argv, log=log, lines=False, env=cloud_env(self.data_dir))
        child = self.child
        wait_until(lambda: "relay serving robots" in child.output(), 60, child.output)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Lab, Relay]]:
    """A cloud with its REST API, and a site relay for it."""
    lab = Lab(tmp_path)
    relay = Relay(lab.data_dir, lab.grpc)
    try:
        relay.start()
        yield lab, relay
    finally:
        if relay.child is not None:
            relay.child.stop(30)
        lab.close()


def _stats(lab: Lab, name: str) -> dict[str, Any]:
    return lab.robots().get(name, {})


def _applied(lab: Lab) -> dict[str, int]:
    with lab.store.session() as s:
        rows = s.query(Robot).filter(Robot.name.in_(PENDULUMS))
        return {r.name: int(r.applied_policy_version or 0) for r in rows}


def test_robots_behind_a_site_relay_learn_through_it_and_outlive_it(
    site: tuple[Lab, Relay],
) -> None:
    lab, relay = site
    for name in PENDULUMS:
        lab.enroll(
            name, "--driver", "gymnasium", "--driver-option", "env_id=Pendulum-v1",
            "--operator", "none", "--relay", relay.address,
        )  # fmt: skip
    wait_until(lambda: _idle(lab, PENDULUMS), 180, lab.fail_text)
    got = lab.launch({**_sac_on_pendulum(), "robots": {"robot_type": "pendulum-v1", "count": 2}})
    assert got.status_code == 201, got.text
    run_id = got.json()["id"]
    wait_until(lambda: run_state(lab.store, run_id) in LIVE, 240, lab.fail_text)
    wait_until(lambda: _acting_in(lab, run_id, PENDULUMS), 120, lab.fail_text)

    # Weights come through the relay's fan-out: the robots count its bytes and apply versions.
    def relayed(after: dict[str, int], weight_bytes: dict[str, float]) -> bool:
        applied = _applied(lab)
        return all(
            applied.get(n, 0) > after.get(n, 0)
            and _stats(lab, n).get("relay_weight_bytes", 0.0) > weight_bytes.get(n, 0.0)
            for n in PENDULUMS
        )

    wait_until(lambda: relayed({n: 1 for n in PENDULUMS}, {}), 240, lab.fail_text)
    assert all(_stats(lab, n).get("relay_weight_refused") == 0.0 for n in PENDULUMS)
    assert all(_stats(lab, n).get("acked_seq", 0.0) > 0 for n in PENDULUMS)

    # SIGKILL the relay: the robots keep acting and spooling, and nothing more is acknowledged
    # (their uploads went through the relay).
    assert relay.child is not None
    relay.child.kill()
    time.sleep(3.0)  # the acks in flight at the kill land in the robots' heartbeats
    acked = {n: _stats(lab, n)["acked_seq"] for n in PENDULUMS}
    spooled = {n: _stats(lab, n)["next_seq"] for n in PENDULUMS}
    wait_until(
        lambda: all(_stats(lab, n)["next_seq"] > spooled[n] + 50 for n in PENDULUMS),
        120,
        lab.fail_text,
    )
    assert {n: _stats(lab, n)["acked_seq"] for n in PENDULUMS} == acked
    assert all(_stats(lab, n).get("run_id") == run_id for n in PENDULUMS)

    # The relay back on its ports: uploads resume, and new versions come through it again.
    relay.start()
    wait_until(
        lambda: all(_stats(lab, n)["acked_seq"] > spooled[n] for n in PENDULUMS),
        180,
        lab.fail_text,
    )
    applied = _applied(lab)
    weight_bytes = {n: _stats(lab, n)["relay_weight_bytes"] for n in PENDULUMS}
    wait_until(lambda: relayed(applied, weight_bytes), 240, lab.fail_text)

    report = stop_run(lab, run_id)
    assert report["acked_lost"] == 0
    wait_until(lambda: _idle(lab, PENDULUMS), 120, lab.fail_text)
    with lab.store.session() as s:
        ids = [int(r.id) for r in s.query(Robot).filter(Robot.name.in_(PENDULUMS))]
    rows = stored_once(run_dir(lab.store, run_id) / "buffer", ids)
    assert all(n > 0 for n in rows.values()), rows
