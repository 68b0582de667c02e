"""``robofleet lerobot-gateway`` as a process: SIGKILLed while the cloud is away with steps it
had taken from the actor, then restarted (its stored credential, no token): every step reaches
the cloud once, and the run's episode numbering continues."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from sqlalchemy import select

from edge_agent.assignment import Assignment
from foundation.store.models import Robot
from tests.edge_agent.lerobot_actor import Actor, sac_version, transition
from tests.fakes.cloud import ROBOFLEET, RUN, Cloud, free_port
from tests.fakes.procs import Child, wait_until
from tests.fakes.settings import cloud_env, fast_comms

pytestmark = pytest.mark.timeout(300)


def gateway(tmp: Path, server: str, config: Path, token: str | None) -> Child:
    argv = [*ROBOFLEET, "lerobot-gateway", "--server", server, "--robot", "so101-c"]
    argv += ["--lerobot-config", str(config), "--spool-dir", str(tmp / "spool")]
    argv += ["--drain-s", "2"] + (["--token", token] if token else [])
    env = cloud_env(tmp, edge={"heartbeat_interval_s": 0.2}, comms={"reconnect_max_s": 0.5})
    child = Child(argv, env=env, log=tmp / f"gateway-{len(list(tmp.glob('gateway-*')))}.log")
    line = child.line(120)
    assert line.startswith("robofleet lerobot-gateway: ready on port"), line
    return child


def episode(actor: Actor, start: float) -> None:
    s = torch.full((4,), start)
    a = torch.tensor([0.5, 0.5])
    actor.send_transitions(
        [transition(s, a), transition(s + 1, a, intervention=True), transition(s + 2, a, done=True)]
    )


def test_killed_gateway_restarts_and_loses_or_repeats_nothing(tmp_path: Path, db) -> None:  # type: ignore[no-untyped-def]
    _url, store = db
    port = free_port()
    config = tmp_path / "train_config.json"
    config.write_text(
        json.dumps(
            {
                "env": {"fps": 10},
                "policy": {
                    "input_features": {"observation.state": {"type": "STATE", "shape": [4]}},
                    "output_features": {"action": {"type": "ACTION", "shape": [2]}},
                    "actor_learner_config": {"learner_host": "127.0.0.1", "learner_port": port},
                },
            }
        )
    )
    cloud: Cloud = Cloud(store, settings=fast_comms())  # type: ignore[type-arg]
    token = store.create_enrollment_token(timedelta(minutes=5))
    first = gateway(tmp_path, cloud.address, config, token)
    with store.session() as s:
        rid = s.scalars(select(Robot.id).where(Robot.name == "so101-c")).one()
    store.lease_robots(RUN, [rid])
    text = Assignment(run_id=RUN, max_episode_steps=100).to_json()

    def assign() -> None:
        wait_until(
            lambda: cloud.server.push_control(rid, "assign", run_id=RUN, assignment=text),
            30,
            "the gateway's Control stream",
        )

    assign()
    cloud.server.distributor(RUN).publish(sac_version(), version=1)

    def rows() -> pa.Table:
        return pa.Table.from_batches([b for _r, b in cloud.sink.batches])

    actor = Actor(port)
    try:
        assert actor.ready(attempts=3)
        actor.start_streams()
        actor.parameters.get(timeout=30)  # version 1 handed before the episode
        episode(actor, 0.0)
        wait_until(lambda: cloud.sink.batches and rows().num_rows == 3, 30, "episode 0 stored")
        cloud.stop()  # the cloud goes away: the next episode can only reach the spool
        episode(actor, 10.0)
        spool_state = tmp_path / "spool" / "runs" / RUN / "state.json"
        wait_until(
            lambda: json.loads(spool_state.read_text())["next_seq"] == 6, 30, "episode 1 spooled"
        )
        first.kill()  # SIGKILL, with episode 1 unacknowledged
    finally:
        actor.close()

    cloud.start()  # a fresh server: its distributor has no version until the learner's next
    cloud.server.distributor(RUN).publish(sac_version(), version=2)
    second = gateway(tmp_path, cloud.address, config, None)  # the stored credential
    try:
        assign()
        wait_until(lambda: rows().num_rows == 6, 60, lambda: f"{rows().num_rows} rows")
        replacement = Actor(port)
        try:
            assert replacement.ready(attempts=3)
            replacement.start_streams()
            replacement.parameters.get(timeout=30)
            episode(replacement, 20.0)
            wait_until(lambda: rows().num_rows == 9, 30, lambda: f"{rows().num_rows} rows")
        finally:
            replacement.close()
    finally:
        second.stop(30)
        cloud.close()
    table = rows().sort_by("seq")
    assert len(set(table.column("seq").to_pylist())) == 9  # none stored twice
    keys = list(
        zip(
            table.column("episode_index").to_pylist(),
            table.column("frame_index").to_pylist(),
            strict=True,
        )
    )
    assert sorted(keys) == [(e, f) for e in range(3) for f in range(3)]
    assert table.column("is_intervention").to_pylist() == [False, True, False] * 3
    first_states = [r[0] for r in table.column("observation.state").to_pylist()[::3]]
    assert first_states == [0.0, 10.0, 20.0]
    assert table.column("policy_version").to_pylist() == [1] * 6 + [2] * 3
