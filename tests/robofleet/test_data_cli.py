"""``robofleet data``: import into the catalog, ls, inspect, export, rm; user errors are one
line on stderr with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robofleet.cli import main
from tests.buffer.helpers import episodes, open_buffer, small_schema
from tests.lab_data.lerobot_data import hil_serl_dataset
from tests.robofleet.test_cli import run_cli

pytestmark = pytest.mark.slow
PENALTY = "complementary_info.discrete_penalty"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "data"
    monkeypatch.setenv("ROBOFLEET_DATA_DIR", str(d))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return d


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_refused_column_is_one_line_on_stderr(tmp_path: Path) -> None:
    hil_serl_dataset(tmp_path / "hil", lengths=(3, 2))
    env = {"ROBOFLEET_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}
    r = run_cli("data", "import", str(tmp_path / "hil"), "--into", "hil", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()  # no traceback, no torchcodec lines
    assert line.startswith("robofleet data import: ") and PENALTY in line


def test_import_ls_inspect_export_rm(tmp_path: Path, data_dir: Path, capsys) -> None:
    hil_serl_dataset(tmp_path / "hil")
    info = _json(
        capsys,
        "data",
        "import",
        str(tmp_path / "hil"),
        "--into",
        "hil",
        "--ignore-column",
        PENALTY,
        "--task",
        "pick-cube",
        "--json",
    )
    assert info["rows"] == 15 and info["intervention_rows"] == 5  # type: ignore[index]
    assert info["successful_episodes"] == 1 and info["format"] == "lerobot"  # type: ignore[index]
    run_buf = data_dir / "runs" / "run-7" / "buffer"  # an earlier run's buffer
    with open_buffer(run_buf, small_schema()) as buf:
        buf.append(episodes(0, [4, 3, 5], intervention=True, run="run-7"))
        buf.mark_episode("robot-0", "run-7", 1, "success")
    listed = _json(capsys, "data", "ls", "--json")
    assert [(r["kind"], r["name"], r["rows"]) for r in listed] == [  # type: ignore[union-attr]
        ("dataset", "hil", 15),
        ("run", "run-7", 12),
    ]
    shown = _json(capsys, "data", "inspect", "hil", "--json")
    assert shown["tasks"] == {"pick-cube": 15}  # type: ignore[index]
    assert shown["features"]["observation.images.front"]["shape"] == [8, 6, 3]  # type: ignore[index]
    assert shown["intervention_share"] == pytest.approx(5 / 15)  # type: ignore[index]
    assert shown["success_share"] == pytest.approx(1 / 3)  # type: ignore[index]
    assert shown["provenance"]["format"] == "lerobot"  # type: ignore[index]
    assert _json(capsys, "data", "inspect", str(run_buf), "--json")["kind"] == "path"  # type: ignore[index]
    assert main(["data", "inspect", "hil"]) == 0 and "pick-cube" in capsys.readouterr().out

    out = tmp_path / "export"
    done = _json(capsys, "data", "export", "run-7", "--out", str(out), "--success-only", "--json")
    assert done == {"out": str(out), "fps": 10, "frames": 3, "format": "lerobot"}
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/export", root=out, video_backend="pyav")
    assert len(ds) == 3 and ds.meta.total_episodes == 1 and not (out / "images").exists()

    assert main(["data", "rm", "hil"]) == 0
    assert main(["data", "inspect", "hil"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'hil' is no dataset (none)" in err and "run-7" in err
    assert main(["data", "export", "run-7", "--out", str(out)]) == 2
    assert "exists already" in capsys.readouterr().err


def test_ros2_bags_import_one_episode_each(tmp_path: Path, data_dir: Path, capsys) -> None:
    from tests.lab_data.test_ros2_bags import _write_bag

    _write_bag(tmp_path / "bags" / "a", 4)
    _write_bag(tmp_path / "bags" / "b", 3)
    info = _json(
        capsys,
        "data",
        "import",
        str(tmp_path / "bags"),
        "--into",
        "teleop",
        "--task",
        "pour",
        "--json",
    )
    assert info["format"] == "ros2" and info["rows"] == 7 and info["episodes"] == 2  # type: ignore[index]
    assert info["intervention_rows"] == 7 and info["tasks"] == {"pour": 7}  # type: ignore[index]
    # Joints default to the first message's names, in its order.
    assert info["features"]["observation.state"]["shape"] == [2]  # type: ignore[index]
    assert main(["data", "import", str(tmp_path / "nothing"), "--into", "x"]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert main(["data", "import", str(tmp_path / "plain"), "--into", "x"]) == 2
    assert "looked for meta/info.json" in capsys.readouterr().err
