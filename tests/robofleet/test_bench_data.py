"""``robofleet bench data --quick`` runs end to end: a table, then one JSON line of ratios."""

from __future__ import annotations

import json

import pytest

from robofleet.cli import main

pytestmark = pytest.mark.slow  # about 30 s here: LeRobot's import, writer and reader


def test_bench_data_quick_prints_ratios_last(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["bench", "data", "--quick", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-1])
    assert "LeRobot read" in "\n".join(lines[:-1])
    assert res["frames"] == 160
    for key in (
        "import_ratio_vs_lerobot_read",
        "export_ratio_vs_lerobot_read",
        "export_ratio_vs_lerobot_write",
        "sample_ratio_vs_gather",
    ):
        assert res[key] > 0, key
    assert res["import_mb_per_s"] > 0 and res["sample_ms"] > 0
    assert not any(tmp_path.iterdir())  # the scratch directory is cleaned up
