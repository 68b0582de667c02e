"""``robofleet robots enroll NAME``: a one-time token for the named robot (its type and tags
on it) and the exact ``robofleet edge`` command its computer runs, which ``robofleet edge``
itself parses back to the same robot, driver, driver options and operator with no run id."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from comms.cloud.enrollment_tokens import edge_command
from foundation.store.metadata_store import MetadataStore
from robofleet.cli import main
from robofleet.commands.edge import build_parser, driver_options


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in [k for k in os.environ if k.startswith("ROBOFLEET_")]:
        monkeypatch.delenv(key)
    path = tmp_path / "robofleet.yaml"
    path.write_text(f"data_dir: {tmp_path / 'data'}\ncomms: {{cloud_address: cloud.lab:50051}}\n")
    return path


def _edge_args(command: str) -> argparse.Namespace:
    argv = shlex.split(command)
    assert argv[:2] == ["robofleet", "edge"]
    return build_parser().parse_args(argv[2:])


def test_enroll_prints_the_edge_command_and_the_token_enrolls_that_robot(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "--config", str(config), "robots", "enroll", "arm-7", "--type", "so101",
            "--tag", "site=lab-a", "--tag", "cell=3", "--driver", "lerobot",
            "--driver-option", "type=so101_follower",
            "--driver-option", 'config={"port": "/dev/ttyACM0", "id": "arm 7"}',
            "--operator", "gamepad", "--ttl-minutes", "30", "--json",
        ]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["robot_name"] == "arm-7" and out["tags"] == {"site": "lab-a", "cell": "3"}
    remaining = datetime.fromisoformat(out["expires_at"]) - datetime.now().astimezone()
    assert timedelta(minutes=29) < remaining <= timedelta(minutes=30)
    args = _edge_args(out["command"])
    assert (args.server, args.token, args.robot) == ("cloud.lab:50051", out["token"], "arm-7")
    assert (args.driver, args.operator, args.run) == ("lerobot", "gamepad", None)
    assert driver_options(args.driver_option) == {
        "type": "so101_follower",
        "config": {"port": "/dev/ttyACM0", "id": "arm 7"},
    }
    store = MetadataStore(f"sqlite:///{config.parent / 'data' / 'robofleet.db'}")
    try:
        robot, _ = store.consume_enrollment_token(
            out["token"], robot_name="other", robot_type="other", spec={}
        )
    finally:
        store.close()
    assert (robot.name, robot.robot_type) == ("arm-7", "so101")
    assert robot.tags == {"site": "lab-a", "cell": "3"}


def test_enroll_without_json_prints_the_command_on_its_own_line(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(config), "robots", "enroll", "sim-1", "--server", "h:1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    args = _edge_args(last)
    assert (args.server, args.robot, args.run) == ("h:1", "sim-1", None)
    assert "--driver" not in last and "--operator" not in last  # the computer's defaults


def test_enroll_takes_a_labs_own_driver_by_reference(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lab's package lives on its robot computer: the cloud checks only the form."""
    argv = ["--config", str(config), "robots", "enroll", "arm-9", "--driver", "my_pkg.arms:MyArm"]
    assert main(argv) == 0
    args = _edge_args(capsys.readouterr().out.strip().splitlines()[-1])
    assert (args.robot, args.driver) == ("arm-9", "my_pkg.arms:MyArm")


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--tag", "site"], "--tag 'site'"),
        (["--tag", "bad key=1"], "--tag"),
        (["--driver-option", "noequals"], "--driver-option"),
        (["--ttl-minutes", "0"], "--ttl-minutes"),
        (["--type", "a b"], "robot type"),
        (["--driver", "my pkg:Arm"], "--driver 'my pkg:Arm'"),
    ],
)
def test_a_bad_option_is_exit_2_naming_it(
    config: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    assert main(["--config", str(config), "robots", "enroll", "arm-1", *extra]) == 2
    assert named in capsys.readouterr().err
    assert not (config.parent / "data" / "robofleet.db").exists()  # nothing was created


def test_edge_command_round_trips_through_the_edge_parser() -> None:
    options = {"env_id": "gym_hil/PandaPickCubeBase-v0", "n": 5, "joints": ["j 1", "j2"]}
    command = edge_command(
        "cloud:50051", "t$ok'en", "arm-1", driver="gymnasium", driver_options=options
    )
    args = _edge_args(command)
    assert args.token == "t$ok'en" and args.driver == "gymnasium"
    assert driver_options(args.driver_option) == options
    with pytest.raises(ValueError, match="driver option 'a=b'"):
        edge_command("cloud:50051", "t", "arm-1", driver_options={"a=b": 1})


def test_operator_options_reach_the_edge_command_from_the_cli(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(config), "robots", "enroll", "arm-1", "--operator", "spacemouse"]
    argv += ["--operator-option", "deadzone=0.1", "--operator-option", "path=/dev/hidraw3"]
    assert main([*argv, "--json"]) == 0
    args = _edge_args(json.loads(capsys.readouterr().out)["command"])
    assert args.operator == "spacemouse"
    assert driver_options(args.operator_option) == {"deadzone": 0.1, "path": "/dev/hidraw3"}
    # Options with no operator to take them are refused, and no token is made.
    with pytest.raises(ValueError, match="operator options need an operator"):
        edge_command("cloud:50051", "t", "arm-1", operator_options={"type": "so101_leader"})
    with pytest.raises(ValueError, match="operator option 'a b'"):
        edge_command("c:1", "t", "arm-1", operator="lerobot", operator_options={"a b": 1})
