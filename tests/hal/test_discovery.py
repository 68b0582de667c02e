"""Node probe: declared sim robots, serial LeRobot arms, ROS 2 JointState publishers; CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tests.fakes.lerobot  # noqa: F401  (registers the fake_follower LeRobot type)
from hal.config import RobotDeclaration
from hal.discovery import probe
from robofleet.commands.hal import main as hal_main
from tests.fakes.ros2_robot import Ros2Robot
from tests.fakes.settings import fast_hal


def test_probe_finds_declared_serial_and_dds(tmp_path: Path, ros2_echo: Ros2Robot) -> None:
    (tmp_path / "ttyACM0").touch()
    (tmp_path / "ttyACM1").touch()
    settings = fast_hal(
        robots=[
            RobotDeclaration(name="sim-1", driver="metaworld", options={"task": "reach-v3"}),
            RobotDeclaration(
                name="arm-declared",
                driver="lerobot",
                options={
                    "type": "fake_follower",
                    "config": {"port": str(tmp_path / "ttyACM1"), "calibration_dir": str(tmp_path)},
                },
            ),
        ],
        serial_globs=[str(tmp_path / "ttyACM*")],
        serial_robot_type="fake_follower",
        dds_domains=[ros2_echo.domain_id],
        dds_probe_s=3.0,
    )
    reports = {r.name: r for r in probe(settings, host="node7")}
    assert reports["sim-1"].robot_type == "metaworld-sawyer" and reports["sim-1"].source == "config"
    assert reports["sim-1"].spec["observation_features"]["observation.state"]["shape"] == [39]
    serial = [r for r in reports.values() if r.source == "serial"]
    assert [r.name for r in serial] == ["node7-ttyACM0"]  # ttyACM1 is claimed by the declaration
    dds = [r for r in reports.values() if r.source == "dds"]
    assert len(dds) == 1 and dds[0].options["joints"] == ros2_echo.joints
    assert dds[0].spec["action_features"]["action"]["shape"] == [3]


def test_probe_rejects_duplicate_declarations() -> None:
    dup = RobotDeclaration(name="x", driver="metaworld")
    with pytest.raises(ValueError, match=r"declared twice.*\['x'\]"):
        probe(fast_hal(robots=[dup, dup]))


def test_cli_probe_report_list_and_node_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "robofleet.yaml"
    cfg.write_text(
        f"data_dir: {tmp_path}\n"
        "hal:\n  serial_globs: []\n  robots:\n"
        "    - {name: sim-a, driver: metaworld, options: {task: reach-v3}}\n"
        "    - {name: sim-b, driver: metaworld, options: {task: reach-v3}}\n"
    )
    assert hal_main(["--config", str(cfg), "probe", "--json", "--report"]) == 0
    out = capsys.readouterr().out
    assert [r["name"] for r in json.loads(out[: out.rindex("]") + 1])] == ["sim-a", "sim-b"]
    assert hal_main(["--config", str(cfg), "list"]) == 0
    listed = capsys.readouterr().out
    assert "sim-a" in listed and "idle" in listed
    assert hal_main(["--config", str(cfg), "node-command", "--address", "10.0.0.1:6379"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ray start --address=10.0.0.1:6379")
    res = json.loads(line.split("--resources=", 1)[1].strip("'"))
    assert res == {"robot/metaworld-sawyer": 2.0, "robot/sim-a": 1.0, "robot/sim-b": 1.0}
