"""``progress.jsonl`` stays bounded over a long run: past its cap it is thinned (its first row
and newest half kept whole, rows in order), not on every append, and a run's records keep
going to it as before."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from runs import progress_file
from runs.clock import RunClock
from runs.progress import RunProgress
from runs.progress_file import PROGRESS_FILE, PROGRESS_ROWS, ProgressFile, count_lines
from tests.fakes.cloud import migrated_store


def _ids(path: Path) -> list[int]:
    return [json.loads(x)["i"] for x in path.read_text().splitlines()]  # every line whole


def test_the_file_stays_bounded_with_its_first_and_newest_rows(tmp_path, monkeypatch) -> None:
    path = tmp_path / PROGRESS_FILE
    thinnings = []
    real = progress_file.thin_lines

    def counted(p: Path, cap: int) -> int:
        thinnings.append(cap)
        return real(p, cap)

    monkeypatch.setattr(progress_file, "thin_lines", counted)
    progress = ProgressFile(path, cap=64)
    for i in range(1000):
        progress.append({"i": i, "wall_s": 2.0 * i})
        assert count_lines(path) == progress.rows <= 64
    ids = _ids(path)
    assert ids[0] == 0 and ids[-32:] == list(range(968, 1000))  # the start, the newest half
    assert ids == sorted(set(ids)) and len(ids) >= 48
    assert len(thinnings) < 1000 // 10  # only when it passes the cap
    again = ProgressFile(path, cap=64)  # a resumed run counts the file once, and goes on
    for i in range(1000, 1100):
        again.append({"i": i})
    ids = _ids(path)
    assert ids[0] == 0 and ids[-32:] == list(range(1068, 1100)) and ids == sorted(ids)
    assert count_lines(path) == again.rows <= 64


def test_a_run_thins_its_progress_file_past_the_cap(tmp_path) -> None:
    from buffer import ReplayBuffer, StepSchema
    from tests.cloud_learner.helpers import ACTION, STATE, rows

    path = tmp_path / PROGRESS_FILE
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(PROGRESS_ROWS)))
    store = migrated_store(f"sqlite:///{tmp_path}/meta.db", "run-1", algorithm="hg-dagger")
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buffer = ReplayBuffer.open(tmp_path / "buffer", schema)
    buffer.append(schema.batch_from_records(rows(60, episode_steps=30)))
    try:
        figures = RunProgress(store, "run-1", tmp_path)
        figures.record(buffer, RunClock(), {}, restarts=0, hangs=0, robots=[], version=1)
    finally:
        buffer.close()
        store.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert 3 * PROGRESS_ROWS // 4 <= len(lines) <= PROGRESS_ROWS
    assert lines[0] == {"i": 0} and lines[-1]["env_steps"] == 60  # this record, last
    newest = PROGRESS_ROWS // 2 - 1
    assert [x["i"] for x in lines[-1 - newest : -1]] == list(
        range(PROGRESS_ROWS - newest, PROGRESS_ROWS)
    )
    ids = [x["i"] for x in lines[:-1]]
    assert ids == sorted(set(ids))


def test_the_reports_intervention_curve_spans_a_thinned_file(tmp_path) -> None:
    """The older rows of a thinned file are further apart than the report's 30 s window: its
    intervention-rate curve still starts at the run's start, over the gaps."""
    from runs.report import smoothed_rate

    path = tmp_path / PROGRESS_FILE
    progress = ProgressFile(path, cap=64)
    for i in range(2000):  # a row every 2 s, 1 intervention in 4 steps
        progress.append({"wall_s": 2.0 * i, "env_steps": 40 * i, "interventions": 10 * i})
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert max(b["wall_s"] - a["wall_s"] for a, b in itertools.pairwise(rows)) > 30
    xs, rates = smoothed_rate(rows, "wall_s")
    assert xs[0] <= rows[1]["wall_s"] and len(xs) == len(rows) - 1
    assert all(abs(r - 0.25) < 1e-9 for r in rates)
