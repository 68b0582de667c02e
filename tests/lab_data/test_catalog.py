"""The dataset catalog: complete datasets only, provenance in dataset.json, names checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation.rows import RowFilter
from lab_data.catalog import DatasetCatalog, DatasetExists, UnknownDataset
from tests.buffer.helpers import episodes, open_buffer, small_schema


def _fill(path: Path) -> None:
    with open_buffer(path, small_schema()) as buf:
        buf.append(episodes(0, [4, 3], intervention=True) + episodes(1, [5], task="push"))
        buf.mark_episode("robot-0", "run-a", 0, "success")


def test_a_created_dataset_is_listed_with_its_provenance(tmp_path) -> None:
    cat = DatasetCatalog(tmp_path / "datasets")
    assert cat.names() == []
    buf_dir = cat.create("demo-1", _fill, format="lerobot", source="/data/demo")
    assert buf_dir == tmp_path / "datasets" / "demo-1" / "buffer"
    assert cat.names() == ["demo-1"] and cat.buffer_dir("demo-1") == buf_dir
    info = cat.info("demo-1")
    assert info["name"] == "demo-1" and info["format"] == "lerobot"
    assert info["source"] == "/data/demo" and info["imported_at"] > 0
    assert info["rows"] == 12 and info["episodes"] == 3
    assert info["tasks"] == {"reach": 7, "push": 5}
    assert info["intervention_rows"] == 7 and info["successful_episodes"] == 1
    assert info["features"]["observation.images.front"] == {"dtype": "image", "shape": [6, 5, 3]}
    assert info["features"]["action"] == {"dtype": "float32", "shape": [2]}
    assert info["bytes_on_disk"] > 0
    with open_buffer(tmp_path / "run", small_schema()) as run:  # a run mounts it, no copy
        view = run.mount(buf_dir, RowFilter(success_only=True))
        assert len(view) == 4


def test_names_are_checked_and_failed_imports_leave_nothing(tmp_path) -> None:
    root = tmp_path / "datasets"
    cat = DatasetCatalog(root)
    cat.create("a", _fill)
    with pytest.raises(DatasetExists, match="'a' exists"):
        cat.create("a", _fill)
    with pytest.raises(ValueError, match="dataset name '../x'"):
        cat.create("../x", _fill)

    def broken(path: Path) -> None:
        _fill(path)
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError, match="went away"):
        cat.create("b", broken)
    assert sorted(p.name for p in root.iterdir()) == ["a"]  # no half dataset, no temp dir
    with pytest.raises(UnknownDataset, match=r"no dataset 'b' .*known: a\)"):
        cat.buffer_dir("b")
    with pytest.raises(UnknownDataset):
        cat.info("../a")
    cat.remove("a")
    assert cat.names() == [] and not any(root.iterdir())
    with pytest.raises(UnknownDataset, match="known: none"):
        cat.remove("a")


def test_schema_differences_name_each_feature() -> None:
    from buffer.table.schema import StepSchema

    run = small_schema()
    assert run.differences(small_schema()) == []
    data = StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (4,)},
            "observation.images.wrist": {"dtype": "image", "shape": (6, 5, 3)},
        },
        {"action": {"dtype": "float64", "shape": (2,)}},
    )
    assert run.differences(data) == [
        "action: the run has float32 (2,), the data float64 (2,)",
        "observation.images.front: missing from the data",
        "observation.images.wrist: not in the run",
        "observation.state: the run has float32 (3,), the data float32 (4,)",
    ]
