"""runs.offline: each offline source is checked through its format's importer before a lease."""

from __future__ import annotations

from pathlib import Path

from foundation.runspec import parse_run_spec
from runs.offline import check_sources, locate, source_schema
from tests.buffer.helpers import open_buffer, small_schema

BASE = {
    "algorithm": "hg-dagger",
    "tasks": ["reach"],
    "robots": {"robot_type": "arm", "count": 1},
    "stop": {"minutes": 1},
}


def _spec(*sources: dict[str, object]):  # type: ignore[no-untyped-def]
    return parse_run_spec({**BASE, "buffer": {"offline_data": list(sources)}})


def test_an_unknown_format_is_refused_by_name_whatever_the_source(tmp_path: Path) -> None:
    with open_buffer(tmp_path / "buf", small_schema()):
        pass
    errors = check_sources(
        _spec({"source": str(tmp_path / "buf"), "format": "hdf5"}), None, tmp_path
    )
    assert "unknown format 'hdf5'" in errors["buffer.offline_data[0]"]
    assert "lerobot, robofleet, ros2" in errors["buffer.offline_data[0]"]


def test_a_source_of_another_format_than_named_is_refused(tmp_path: Path) -> None:
    with open_buffer(tmp_path / "buf", small_schema()):
        pass
    errors = check_sources(
        _spec({"source": str(tmp_path / "buf"), "format": "lerobot"}), None, tmp_path
    )
    assert "is a robofleet source, not lerobot" in errors["buffer.offline_data[0]"]


def test_a_bag_needs_its_joints_and_gets_its_schema_from_the_importer(tmp_path: Path) -> None:
    (tmp_path / "bag").mkdir()
    (tmp_path / "bag" / "metadata.yaml").write_text("")
    errors = check_sources(_spec({"source": str(tmp_path / "bag")}), None, tmp_path)
    assert "needs options.joints" in errors["buffer.offline_data[0]"]
    spec = _spec(
        {"source": str(tmp_path / "bag"), "task": "reach", "options": {"joints": ["a", "b"]}}
    )
    source = spec.buffer.offline_data[0]
    located = locate(source, tmp_path)
    schema, tasks = source_schema(located, source)
    assert located.format == "ros2" and tasks == ["reach"]
    assert schema.action.shape == (2,) and schema.observations["observation.state"].shape == (2,)
    assert check_sources(spec, None, tmp_path) == {}


def test_an_earlier_run_with_a_sharded_buffer_is_refused_by_name(tmp_path: Path) -> None:
    from buffer.service.shards import ShardedBuffer

    with ShardedBuffer.open(tmp_path / "runs" / "run-s" / "buffer", small_schema(), shards=2):
        pass
    errors = check_sources(_spec({"source": "run-s"}), None, tmp_path)
    assert "run run-s keeps its buffer in shards" in errors["buffer.offline_data[0]"]
