"""``robofleet lerobot-gateway`` against a real robofleet cloud (comms' server, metadata store,
weight distributor) and LeRobot's own actor-side transport code: Ready waits for an assignment
and a first version, LeRobot's policy loads the parameters, transitions land with intervention
flags and indices, bad ones are refused by name and counted, a code-running interactions pickle
runs nothing, and an actor that replaces a SIGKILLed one is served."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from lerobot.transport.utils import python_object_to_bytes

from edge_agent.assignment import Assignment
from edge_agent.lerobot_gateway.features import actor_config
from edge_agent.lerobot_gateway.gateway import GatewayOptions, LeRobotGateway
from foundation.store.models import Robot
from tests.edge_agent.lerobot_actor import (
    Actor,
    loads_into_lerobot,
    sac_version,
    shifted,
    transition,
)
from tests.fakes.cloud import RUN, Cloud, free_port
from tests.fakes.procs import Child, wait_until
from tests.fakes.settings import fast_comms, fast_edge

pytestmark = pytest.mark.timeout(300)

CONFIG = {
    "env": {"fps": 10},
    "policy": {
        "input_features": {"observation.state": {"type": "STATE", "shape": [4]}},
        "output_features": {"action": {"type": "ACTION", "shape": [2]}},
    },
}


@dataclass
class Lab:
    cloud: Cloud  # type: ignore[type-arg]
    gateway: LeRobotGateway
    port: int


def start_gateway(cloud: Cloud, root: Path, name: str) -> tuple[LeRobotGateway, threading.Thread]:  # type: ignore[type-arg]
    """A gateway (enrolled with a fresh token) serving on a free loopback port, running."""
    opts = GatewayOptions(
        robot_name=name,
        server=cloud.address,
        root=root / name,
        actor=actor_config(CONFIG),
        token=cloud.store.create_enrollment_token(timedelta(minutes=5)),
        listen=f"127.0.0.1:{free_port()}",
        drain_s=5.0,
        poll_s=0.1,
    )
    gateway = LeRobotGateway(fast_edge(heartbeat_interval_s=0.2), fast_comms(), opts)
    gateway.start()
    runner = threading.Thread(target=gateway.run, daemon=True)
    runner.start()
    return gateway, runner


@pytest.fixture
def lab(tmp_path: Path, db) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    _url, store = db
    cloud: Cloud = Cloud(store, settings=fast_comms())  # type: ignore[type-arg]
    gateway, runner = start_gateway(cloud, tmp_path, "so101-a")
    try:
        yield Lab(cloud, gateway, gateway.port)
    finally:
        gateway.stop()
        runner.join(20)
        cloud.close()


def assign(lab: Lab) -> None:
    """Lease the gateway's robot to the run and push the assignment, as the run driver does."""
    rid = lab.gateway.robot_id
    lab.cloud.store.lease_robots(RUN, [rid])
    text = Assignment(run_id=RUN, tasks=["pick_cube"], max_episode_steps=100).to_json()
    wait_until(
        lambda: lab.cloud.server.push_control(rid, "assign", run_id=RUN, assignment=text),
        20,
        "the gateway's Control stream",
    )


def stored(lab: Lab) -> pa.Table:
    batches = [b for _rid, b in lab.cloud.sink.batches]
    return pa.Table.from_batches(batches) if batches else pa.table({})


def robot_stats(lab: Lab) -> dict[str, float]:
    with lab.cloud.store.session() as s:
        robot = s.get(Robot, lab.gateway.robot_id)
        assert robot is not None
        return dict(robot.stats or {})


def test_ready_waits_for_assignment_and_version_then_policy_loads_parameters(lab: Lab) -> None:
    actor = Actor(lab.port)
    answered = threading.Event()
    threading.Thread(target=lambda: actor.ready() and answered.set(), daemon=True).start()
    assert not answered.wait(1.5), "Ready answered before any assignment"
    assign(lab)
    wait_until(lambda: lab.gateway.state.run is not None, 20, "the assignment")
    assert not answered.wait(1.0), "Ready answered before the run had a version"

    dist = lab.cloud.server.distributor(RUN)
    # Another algorithm's version (no lerobot-sac card) is refused, never handed out.
    dist.publish({"mean_layer.weight": torch.zeros(2, 16)}, version=2)
    wait_until(lambda: lab.gateway.state.counters.parameter_errors == 1, 20, "the refusal")
    assert not answered.wait(0.5), "Ready answered with a version LeRobot cannot load"

    version = shifted(sac_version(), 0.5)
    dist.publish(version, version=3)
    assert answered.wait(20), "Ready did not answer once assigned with a version"

    actor.start_streams()
    try:
        loads_into_lerobot(actor.parameters.get(timeout=20), version)
        wait_until(lambda: lab.gateway.state.handed_version == 3, 10, "the handed version")
    finally:
        actor.close()


def test_transitions_stored_flagged_indexed_and_bad_ones_refused_by_name(lab: Lab) -> None:
    assign(lab)
    lab.cloud.server.distributor(RUN).publish(sac_version(), version=1)
    actor = Actor(lab.port)
    assert actor.ready(attempts=3)
    actor.start_streams()
    try:
        actor.parameters.get(timeout=20)
        wait_until(lambda: lab.gateway.state.handed_version == 1, 10, "the handed version")
        s = torch.arange(4, dtype=torch.float32)
        a = torch.tensor([0.1, -0.2])
        actor.send_transitions(
            [
                transition(s, a),
                transition(s + 1, a, intervention=True),
                transition(s + 2, a, intervention=True),
                transition(s + 3, a, done=True, reward=1.0),
            ]
        )
        nan_state = s.clone()
        nan_state[2] = float("nan")
        actor.send_transitions(
            [
                transition(s, a),
                transition(nan_state, a),  # NaN in the state
                transition(s, torch.zeros(3)),  # the run's action has 2 dims
                transition(s, a, truncated=True),
            ]
        )
        wait_until(lambda: stored(lab).num_rows == 6, 30, lambda: f"{stored(lab).num_rows} rows")
    finally:
        actor.close()

    rows = stored(lab).sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])
    got = rows.select(
        ["robot_id", "episode_index", "frame_index", "is_intervention", "policy_version"]
    ).to_pylist()
    rid = lab.gateway.robot_id
    assert [(r["episode_index"], r["frame_index"]) for r in got] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
    ]
    assert [r["is_intervention"] for r in got] == [False, True, True, False, False, False]
    assert {int(r["robot_id"]) for r in got} == {rid}
    assert {r["policy_version"] for r in got} == {1}
    assert rows.column("terminated").to_pylist() == [False, False, False, True, False, False]
    assert rows.column("truncated").to_pylist()[-1] is True
    assert rows.column("reward").to_pylist()[3] == 1.0

    reasons = list(lab.gateway.state.refusals)
    assert any("transition 5" in r and "observation.state" in r and "NaN" in r for r in reasons)
    assert any("transition 6" in r and "action" in r and "(2,)" in r for r in reasons)
    wait_until(
        lambda: robot_stats(lab).get("lerobot.transitions_refused") == 2.0,
        10,
        lambda: str(robot_stats(lab)),
    )
    assert robot_stats(lab)["lerobot.transitions_stored"] == 6.0


class RunsCode:
    """A pickle that runs a shell command when plain ``pickle`` loads it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_interactions_become_metrics_and_a_code_running_pickle_runs_nothing(
    lab: Lab, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    actor = Actor(lab.port)
    actor.start_streams()
    try:
        actor.interactions.put(pickle.dumps(RunsCode(marker)))
        actor.interactions.put(pickle.dumps({"Episodic reward": {1, 2}}))  # a set
        actor.interactions.put(
            python_object_to_bytes(
                {"Episodic reward": 2.5, "Interaction step": 40, "Intervention rate": 0.25}
            )
        )
        wait_until(
            lambda: robot_stats(lab).get("lerobot.episodic_reward") == 2.5,
            20,
            lambda: str(robot_stats(lab)),
        )
    finally:
        actor.close()
    stats = robot_stats(lab)
    assert stats["lerobot.intervention_rate"] == 0.25
    assert stats["lerobot.interactions"] == 1.0
    assert stats["lerobot.interactions_refused"] == 2.0
    reasons = list(lab.gateway.state.refusals)
    assert any("system" in r for r in reasons), reasons
    assert any("set" in r for r in reasons), reasons
    assert not marker.exists()


STREAMER = """
import sys, grpc
from lerobot.transport import services_pb2, services_pb2_grpc
from lerobot.transport.utils import grpc_channel_options
ch = grpc.insecure_channel(sys.argv[1], grpc_channel_options())
stub = services_pb2_grpc.LearnerServiceStub(ch)
stub.Ready(services_pb2.Empty())
for msg in stub.StreamParameters(services_pb2.Empty()):
    print("chunk", flush=True)
"""


def test_an_actor_replacing_a_killed_one_is_served(lab: Lab) -> None:
    assign(lab)
    version = sac_version()
    dist = lab.cloud.server.distributor(RUN)
    dist.publish(version, version=1)
    first = Child([sys.executable, "-c", STREAMER, f"127.0.0.1:{lab.port}"])
    assert first.line(60) == "chunk"
    wait_until(lambda: lab.gateway.state.counters.parameter_streams == 1, 10, "one stream")
    first.kill()  # SIGKILL: the actor's process is gone mid-stream
    wait_until(lambda: lab.gateway.state.counters.streams_freed == 1, 20, "the dead stream freed")
    assert lab.gateway.state.counters.parameter_streams == 0

    second = Actor(lab.port)
    try:
        started = time.monotonic()
        assert second.ready()
        assert time.monotonic() - started < 5
        second.start_streams()
        second.parameters.get(timeout=20)  # the latest version at once
        newer = shifted(version, 1.0)
        dist.publish(newer, version=2)
        loads_into_lerobot(second.parameters.get(timeout=20), newer)
    finally:
        second.close()


def test_a_call_replayed_after_a_dropped_connection_is_not_stored_twice(lab: Lab) -> None:
    """LeRobot's channel retries a failed transitions call by replaying it from its start."""
    from concurrent import futures

    import grpc
    from lerobot.transport import services_pb2_grpc

    from edge_agent.lerobot_gateway.service import GatewayService

    assign(lab)
    lab.cloud.server.distributor(RUN).publish(sac_version(), version=1)
    actor = Actor(lab.port)
    assert actor.ready(attempts=3)
    actor.start_streams()
    s, a = torch.zeros(4), torch.zeros(2)
    try:
        actor.parameters.get(timeout=20)
        actor.send_transitions([transition(s, a), transition(s, a, done=True)])
        wait_until(lambda: stored(lab).num_rows == 2, 30, "episode 0 stored")
        # The connection drops (the gateway's server goes and comes back on its port).
        old = lab.gateway._server
        assert old is not None
        old.stop(0).wait()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        services_pb2_grpc.add_LearnerServiceServicer_to_server(
            GatewayService(lab.gateway.state, 0.1), server
        )
        assert server.add_insecure_port(f"127.0.0.1:{lab.port}") == lab.port
        server.start()
        lab.gateway._server = server
        actor.send_transitions([transition(s + 1, a), transition(s + 1, a, truncated=True)])
        wait_until(lambda: stored(lab).num_rows >= 4, 30, lambda: f"{stored(lab).num_rows} rows")
        time.sleep(1.0)  # room for a duplicate to show
    finally:
        actor.close()
    assert stored(lab).num_rows == 4
    assert lab.gateway.state.counters.messages_replayed == 1
    assert sorted(stored(lab).column("episode_index").to_pylist()) == [0, 0, 1, 1]


def test_two_actors_one_run_each_its_own_robot(lab: Lab, tmp_path: Path) -> None:
    """The thing LeRobot's learner cannot do: several actors, one run, each its own robot."""
    other, runner = start_gateway(lab.cloud, tmp_path, "so101-b")
    second = Lab(lab.cloud, other, other.port)
    actors: list[Actor] = []
    try:
        for each in (lab, second):
            assign(each)
        lab.cloud.server.distributor(RUN).publish(sac_version(), version=1)
        for n, each in enumerate((lab, second)):
            actor = Actor(each.port)
            actors.append(actor)
            assert actor.ready(attempts=3)
            actor.start_streams()
            actor.parameters.get(timeout=20)
            s = torch.full((4,), float(n))
            actor.send_transitions([transition(s, torch.zeros(2), done=True)])
        wait_until(lambda: stored(lab).num_rows == 2, 30, lambda: f"{stored(lab).num_rows} rows")
    finally:
        for actor in actors:
            actor.close()
        other.stop()
        runner.join(20)
    by_robot = {
        int(r["robot_id"]): r["observation.state"][0]
        for r in stored(lab).select(["robot_id", "observation.state"]).to_pylist()
    }
    assert by_robot == {lab.gateway.robot_id: 0.0, other.robot_id: 1.0}


def test_a_run_whose_reward_source_the_gateway_cannot_apply_is_refused_by_name(
    lab: Lab,
) -> None:
    rid = lab.gateway.robot_id
    lab.cloud.store.lease_robots(RUN, [rid])
    text = Assignment(
        run_id=RUN, tasks=["pick_cube"], max_episode_steps=100, reward_source="labels"
    ).to_json()
    wait_until(
        lambda: lab.cloud.server.push_control(rid, "assign", run_id=RUN, assignment=text),
        20,
        "the gateway's Control stream",
    )
    wait_until(
        lambda: robot_stats(lab).get("state") == "refused", 20, lambda: str(robot_stats(lab))
    )
    stats = robot_stats(lab)
    assert stats.get("run_id") == RUN
    assert "reward.source 'labels'" in str(stats.get("refused"))
    assert lab.gateway.state.run is None
