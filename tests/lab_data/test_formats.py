"""lab_data.formats: format detection, a buffer copied into place, describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_data.formats import describe, detect_format, import_data
from tests.buffer.helpers import episodes, open_buffer, small_schema


def test_detects_formats_and_names_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "lr" / "meta").mkdir(parents=True)
    (tmp_path / "lr" / "meta" / "info.json").write_text("{}")
    (tmp_path / "bag").mkdir()
    (tmp_path / "bag" / "metadata.yaml").write_text("")
    (tmp_path / "mcap").mkdir()
    (tmp_path / "mcap" / "x.mcap").write_bytes(b"")
    with open_buffer(tmp_path / "buf", small_schema()):
        pass
    assert detect_format(tmp_path / "lr") == "lerobot"
    assert detect_format(tmp_path / "buf") == "robofleet"
    assert detect_format(tmp_path / "bag") == "ros2"
    assert detect_format(tmp_path / "mcap") == "ros2"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="looked for meta/info.json.*schema.json.*metadata.yaml"):
        detect_format(tmp_path / "empty")


def test_a_buffer_is_copied_and_described(tmp_path: Path) -> None:
    with open_buffer(tmp_path / "src", small_schema()) as buf:
        buf.append(episodes(0, [4, 4], intervention=True) + episodes(1, [2], task="push"))
        buf.mark_episode("robot-0", "run-a", 1, "success")
        buf.mark_episode("robot-1", "run-a", 0, "failure")
    seen: list[tuple[int, int]] = []
    dest = import_data(
        tmp_path / "src", tmp_path / "dst", progress=lambda d, t: seen.append((d, t))
    )
    assert seen and seen[-1][0] == seen[-1][1]
    assert not (dest / "LOCK").exists()
    info = describe(dest)
    assert info["rows"] == 10 and info["episodes"] == 3
    assert info["tasks"] == {"reach": 8, "push": 2}
    assert info["intervention_share"] == pytest.approx(0.8)
    assert info["successful_episodes"] == 1 and info["success_share"] == pytest.approx(1 / 3)
    assert info["features"]["observation.state"] == {"dtype": "float32", "shape": [3]}
    with pytest.raises(FileExistsError):
        import_data(tmp_path / "src", dest)
    with pytest.raises(ValueError, match=r"options \['joints'\] do not apply to robofleet"):
        import_data(tmp_path / "src", tmp_path / "d2", joints=["a"])
    with pytest.raises(ValueError, match="not a robofleet buffer"):
        describe(tmp_path)
