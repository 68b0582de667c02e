"""The remote operator: a station person's commands drive the robot; losing them holds it.

Unit tests drive :class:`RemoteOperator` through a real :class:`CloudControl` with a fake
clock; the end-to-end test sends station commands through comms' real gRPC server
(``CloudServer.push_teleop``) to an agent on a simulated Meta-World robot with a camera, and
reads back the stored steps, the frame and the echo the robot reports (``station_view``).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from comms.cloud.step_sink import MemorySink
from edge_agent.build import AgentOptions, build_agent
from edge_agent.control import CloudControl
from edge_agent.remote import RemoteOperator, axis_dims, parse_command
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.procs import wait_until
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_comms, fast_edge

ACTION = {"dtype": "float32", "shape": [4]}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def cmd(i: int, axes: list[float], deadman: bool = True, label: str = "") -> str:
    return json.dumps({"id": i, "axes": axes, "deadman": deadman, "label": label})


def remote(clock: Clock) -> tuple[RemoteOperator, CloudControl]:
    op = RemoteOperator(ACTION, step_size=0.5, timeout_s=0.5, clock=clock)
    control = CloudControl(PointRobot())
    op.attach(control)
    return op, control


OBS: dict[str, Any] = {"observation.state": np.zeros(3, np.float32)}
PROPOSED = np.full(4, 0.3, np.float32)


def test_commands_over_the_control_stream_drive_the_robot_while_the_deadman_is_held() -> None:
    clock = Clock()
    op, control = remote(clock)
    assert not op.step(OBS, PROPOSED).is_intervention  # nobody at the station: policy acts
    control.handle("teleop", teleop=cmd(1, [1.0, -1.0, 0.0, 1.0]))
    out = op.step(OBS, PROPOSED)
    assert out.is_intervention and out.reason == "browser"
    assert out.action is not None and out.action.tolist() == [0.5, -0.5, 0.0, 1.0]
    control.handle("teleop", teleop=cmd(3, [0.0, 0.0, 1.0]))
    control.handle("teleop", teleop=cmd(2, [1.0, 1.0, 1.0]))  # older than the last: dropped
    out = op.step(OBS, PROPOSED)  # no gripper sent: it stays as the person last set it
    assert out.action is not None and out.action.tolist() == [0.0, 0.0, 0.5, 1.0]
    assert op.update(with_frame=False).echo_id == 3
    assert control.counts["teleop"] == 3 and not control.paused


def test_a_takeover_keeps_the_gripper_where_the_policy_left_it_until_the_person_sets_it() -> None:
    op, control = remote(Clock())
    op.step(OBS, np.array([0.1, 0.1, 0.1, 0.25], np.float32))  # the policy closes to 0.25
    control.handle("teleop", teleop=cmd(1, [1.0, 0.0, 0.0]))
    out = op.step(OBS, np.array([0.0, 0.0, 0.0, -1.0], np.float32))
    assert out.action is not None and out.action.tolist() == [0.5, 0.0, 0.0, 0.25]
    control.handle("teleop", teleop=cmd(2, [0.0, 0.0, 0.0, -1.0]))
    out = op.step(OBS, PROPOSED)
    assert out.action is not None and out.action.tolist() == [0.0, 0.0, 0.0, -1.0]


def test_releasing_the_deadman_ends_the_takeover_and_holds_the_robot() -> None:
    clock = Clock()
    op, control = remote(clock)
    control.handle("teleop", teleop=cmd(1, [1.0, 0.0, 0.0, 1.0]))
    op.step(OBS, PROPOSED)
    control.handle("teleop", teleop=cmd(2, [1.0, 0.0, 0.0, 1.0], deadman=False))
    assert control.paused and not op.taken_over and op.note == "deadman released"
    hold = op.step(OBS, PROPOSED)  # the step that was under way sends the safe hold
    assert hold.action is not None and hold.action.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert not op.step(OBS, PROPOSED).is_intervention


def test_a_takeover_whose_heartbeat_stops_holds_the_robot() -> None:
    clock = Clock()
    op, control = remote(clock)
    control.handle("teleop", teleop=cmd(1, [0.0, 1.0]))
    clock.t += 0.4
    op.check()
    assert op.taken_over and not control.paused  # within the timeout
    control.handle("teleop", teleop=cmd(2, [0.0, 1.0]))  # a heartbeat renews it
    clock.t += 0.4
    op.check()
    assert op.taken_over
    clock.t += 0.2  # 0.6 s since the last command
    op.step(OBS, PROPOSED)
    assert control.paused and not op.taken_over and op.note == "heartbeat lost"
    assert op.holds == 1


def test_a_station_label_ends_the_episode_as_the_operators_command() -> None:
    op, control = remote(Clock())
    control.handle("teleop", teleop=cmd(1, [], deadman=False, label="success"))
    out = op.step(OBS, PROPOSED)
    assert out.command == "success" and not out.is_intervention


def test_malformed_station_commands_are_refused_by_name() -> None:
    for text, word in [
        ("nope", "not JSON"),
        ("[1]", "JSON object"),
        ('{"id": 0}', "positive int"),
        ('{"id": 1, "axes": [2.0]}', "axes"),
        ('{"id": 1, "deadman": 1}', "deadman"),
        ('{"id": 1, "label": "maybe"}', "label"),
    ]:
        with pytest.raises(ValueError, match=word):
            parse_command(text)
    op, control = remote(Clock())
    control.handle("teleop", teleop="{bad")
    assert op.rejected == 1 and not op.taken_over


def test_axes_map_onto_the_action_by_name_else_by_position() -> None:
    named = {"shape": [5], "names": ["gripper", "delta_z", "roll", "delta_y", "delta_x"]}
    assert axis_dims(named) == [4, 3, 1, 0]
    assert axis_dims({"shape": [3]}) == [0, 1, 2, None]
    with pytest.raises(ValueError, match="at least 3 dims"):
        axis_dims({"shape": [2]})


@pytest.mark.slow
def test_station_commands_through_the_cloud_drive_a_camera_robot_and_loss_holds_it(
    tmp_path: Path, db: Any
) -> None:
    _url, store = db
    sink = MemorySink()
    cloud = Cloud(store, sink)
    built = None
    try:
        opts = AgentOptions(
            robot_name="sawyer-station",
            tasks=["reach-v3"],
            driver="metaworld",
            driver_options={"cameras": ["corner"], "image_size": [48, 48]},
            run_id=RUN,
            server=cloud.address,
            token=store.create_enrollment_token(timedelta(minutes=5)),
            operator="remote",
            max_episode_steps=400,
            spool_dir=tmp_path / "spool",
        )
        edge = fast_edge(control_hz=20.0, batch_max_steps=4, wait_for_first_weights=False)
        built = build_agent(edge, fast_comms(), opts)
        agent = built.agent
        robot_id = json.loads((tmp_path / "spool" / "credential.json").read_text())["robot_id"]
        store.lease_robots(RUN, [robot_id])
        runner = threading.Thread(target=agent.run, name="agent")
        runner.start()
        server = cloud.server

        def frame_shown() -> bool:
            view = server.station_view(robot_id)
            return view is not None and view.frame[:2] == b"\xff\xd8"  # a JPEG

        wait_until(frame_shown, 30, "a camera frame on the station")
        probe = cmd(1, [0.0], deadman=False)
        wait_until(lambda: server.push_teleop(robot_id, probe, RUN), 10, "control stream")
        # drive +x at 20 Hz for a second, timing each command's echo
        rtts: list[float] = []
        for i in range(2, 22):
            sent = time.monotonic()
            assert server.push_teleop(robot_id, cmd(i, [1.0, 0.0, 0.0, -1.0]), RUN)
            while time.monotonic() - sent < 1.0:
                view = server.station_view(robot_id)
                if view is not None and view.echo_id >= i:
                    rtts.append(time.monotonic() - sent)
                    break
                time.sleep(0.002)
            time.sleep(max(0.0, 0.05 - (time.monotonic() - sent)))
        assert len(rtts) >= 15, f"echoes of {len(rtts)} of 20 commands"
        view = server.station_view(robot_id)
        assert view is not None and view.taken_over
        # the page goes away: no command for the timeout -> the robot holds
        wait_until(lambda: agent.heartbeat_state == "paused", 5, "the hold after loss")
        time.sleep(0.1)  # a step under way when the hold came ends (with the safe hold)
        steps = agent.stats.steps
        time.sleep(0.3)
        assert agent.stats.steps == steps  # held: no step
        wait_until(lambda: not server.station_view(robot_id).taken_over, 5, "takeover over")  # type: ignore[union-attr]
        assert server.station_view(robot_id).note == "heartbeat lost"  # type: ignore[union-attr]
        agent.stop()
        runner.join(30)
        assert not runner.is_alive()
        assert agent.uplink.wait_acked(30)
        report = agent.report()
    finally:
        if built is not None:
            built.close()
        cloud.close()
    rows = [b for rid, b in sink.batches if rid == robot_id]
    flags = np.concatenate(
        [b.column("is_intervention").to_numpy(zero_copy_only=False) for b in rows]
    )
    actions = np.concatenate(
        [np.stack(b.column("action").to_numpy(zero_copy_only=False)) for b in rows]
    )
    driven = actions[flags]
    assert len(driven) >= 15  # the takeover's steps are stored as interventions
    assert len(driven) == report["station/steps"]  # ... and they are the station's steps
    assert report["station/takeovers"] == 1 and report["station/holds"] == 1
    assert (driven[:-1, 0] > 0.9).all()  # +x as the station commanded (the last: the hold)
    print(f"station echo round trip p50 {1000 * float(np.median(rtts)):.1f} ms")


def test_a_robot_computer_forwards_station_commands_to_its_running_agent() -> None:
    """``robofleet edge`` without ``--run`` listens on the Control stream itself
    (``edge_agent.host``) and hands the agent of its run each command, the payload included."""
    from types import SimpleNamespace

    from comms.proto import robofleet_pb2 as pb
    from edge_agent.host import RobotComputer

    op, control = remote(Clock())
    host = SimpleNamespace(
        _lock=threading.Lock(),
        _current=(RUN, SimpleNamespace(agent=SimpleNamespace(control=control))),
    )
    teleop = pb.ControlCommand(kind=pb.ControlCommand.TELEOP, run_id=RUN, teleop=cmd(4, [1.0]))
    RobotComputer._forward(host, "teleop", teleop)  # type: ignore[arg-type]
    assert op.taken_over and op.step(OBS, PROPOSED).action.tolist()[0] == 0.5  # type: ignore[union-attr]
