"""The learning side of a sharded run: a restarted shard that listens on another batch port
has the learner restarted with the shards' new addresses (its old sockets would wait on a
port nobody serves)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from runs.learning import RunLearning
from runs.supervisor import ProcessSupervisor
from tests.fakes.procs import alive


class _Batches:
    address = "tcp://127.0.0.1:1001,tcp://127.0.0.1:1002"


def test_the_learner_follows_a_shard_that_moved_its_batch_port(tmp_path: Path) -> None:
    learning = object.__new__(RunLearning)  # only the parts the check reads
    events: list[tuple[str, dict[str, Any]]] = []
    learning.on_event = lambda kind, **data: events.append((kind, data))
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    learning.learner = ProcessSupervisor(
        "learner", [*sleeper, "--batches", _Batches.address], tmp_path / "learner.log"
    )
    learning.batch_server = _Batches()
    learning.learner.start()
    try:
        first = learning.learner.pid
        assert first is not None
        learning._follow_batch_addresses()  # nothing moved: the learner runs on
        assert learning.learner.pid == first and events == []

        moved = "tcp://127.0.0.1:1001,tcp://127.0.0.1:2002"
        learning.batch_server.address = moved
        learning._follow_batch_addresses()
        assert not alive(first)
        second = learning.learner.pid
        assert second is not None and second != first
        assert learning.learner.argv[-2:] == ["--batches", moved]
        assert events == [("learner.batches_moved", {"batches": moved, "was": _Batches.address})]
    finally:
        learning.learner.stop(5)


def test_offline_data_is_checked_once_and_every_shard_gets_the_same_mounts(
    tmp_path: Path,
) -> None:
    from buffer import BufferSettings
    from foundation.rows import RowFilter
    from foundation.runspec import parse_run_spec
    from runs.sharded import SCRATCH, checked_mounts
    from tests.buffer.helpers import episodes, open_buffer, small_schema

    with open_buffer(tmp_path / "earlier", small_schema()) as buf:
        buf.append(episodes(5, [4, 6]))
    run_dir = tmp_path / "run"
    (run_dir / f"{SCRATCH}left").mkdir(parents=True)  # a cloud died while checking
    source = {"source": str(tmp_path / "earlier"), "robots": ["robot-5"]}
    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach"],
            "robots": {"robot_type": "arm", "count": 1},
            "buffer": {"shards": 2, "offline_data": [source]},
        }
    )
    provenance, mounts = checked_mounts(spec, small_schema(), BufferSettings(), run_dir, tmp_path)
    assert [p["rows"] for p in provenance] == [10]
    assert mounts == [
        (str(tmp_path / "earlier"), RowFilter(robot_ids=("robot-5",)), source["source"], None)
    ]
    assert (run_dir / "offline.json").exists()
    assert not list(run_dir.glob(f"{SCRATCH}*"))  # no scratch buffer left, old or new
