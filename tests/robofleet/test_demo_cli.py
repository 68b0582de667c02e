"""``robofleet demo``'s command line refuses what it cannot run before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from robofleet.commands import demo


def test_an_unknown_task_is_named_before_a_cloud_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    monkeypatch.chdir(tmp_path)
    argv = ["--tasks", "reach-v3,no-such-task,pick-plce-v3", "--minutes", "1", "--no-dashboard"]
    assert demo.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "robofleet demo: --tasks: no Meta-World task 'no-such-task', 'pick-plce-v3' "
        "(did you mean 'pick-place-v3'"
    )
    assert err[0].endswith(" and 42 more")  # a sample of the 50 tasks, not all of them
    assert not ray.is_initialized()
    assert list(tmp_path.iterdir()) == []  # no data directory made
