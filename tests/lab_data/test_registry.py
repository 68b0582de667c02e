"""lab_data.registry: format detection, the registry, a buffer copied into place, describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_data.catalog import describe
from lab_data.importing import ImportJob
from lab_data.registry import detect_format, formats, import_data, importer, register
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


class _CsvImporter:
    """A lab's own format, registered beside the built-in ones."""

    format = "csv-steps"
    recognised_by = "steps.csv"
    options: tuple[str, ...] = ("delimiter",)
    keeps_robot_ids = False

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def detect(self, path: Path) -> bool:
        return (path / "steps.csv").is_file()

    def schema(self, path, options, task):  # type: ignore[no-untyped-def]
        return small_schema(), [task or "reach"]

    def import_into(self, job: ImportJob) -> Path:
        self.calls.append({"robot_id": job.robot_id, "task": job.task, **job.options})
        with open_buffer(job.dest, small_schema()) as buf:
            buf.append(episodes(0, [3]))
        return job.dest


def test_a_registered_importer_is_detected_and_called_with_its_options(tmp_path: Path) -> None:
    imp = _CsvImporter()
    register(imp)
    assert importer("csv-steps") is imp and formats()[-1] == "csv-steps"
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "steps.csv").write_text("a,b\n")
    assert detect_format(tmp_path / "rec") == "csv-steps"
    dest = import_data(tmp_path / "rec", tmp_path / "out", task="reach", delimiter=";")
    assert imp.calls == [{"robot_id": None, "task": "reach", "delimiter": ";"}]
    assert describe(dest)["rows"] == 3
    with pytest.raises(ValueError, match=r"options \['joints'\] do not apply to csv-steps"):
        import_data(tmp_path / "rec", tmp_path / "o2", joints=["a"])
    with pytest.raises(ValueError, match="already"):
        register(_CsvImporter())
    with pytest.raises(ValueError, match="unknown format 'nope'.*lerobot, robofleet, ros2"):
        importer("nope")
