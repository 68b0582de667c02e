"""A short ``robofleet demo``: success of the policy alone rises, nothing acknowledged is lost,
and a SIGKILLed learner comes back by itself."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.fakes.cloud import ROBOFLEET
from tests.fakes.settings import cloud_env as env_for


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_short_demo_improves_and_loses_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *ROBOFLEET,
            "demo",
            "--minutes",
            "1.5",
            "--robots",
            "2",
            "--kill-learner-at",
            "45",
            "--no-dashboard",
            "--json",
        ],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(summary) == {
        "initial_success",
        "final_success",
        "minutes",
        "env_steps",
        "interventions",
        "versions_published",
        "acked_lost",
        "learner_restarts",
    }
    assert summary["acked_lost"] == 0
    # Off a terminal (here: a pipe) a progress line comes every 30 s, and the last table and
    # the end line say how the run ended.
    assert re.search(r"\d+\.\d min: version \d+, \d+ env steps", out.stderr), out.stderr[-3000:]
    assert re.search(r"state\W+finished\W", out.stderr), out.stderr[-3000:]
    assert "run ended: finished (" in out.stderr
    assert "WARNING" not in out.stderr, out.stderr[-3000:]  # nothing that reads like trouble
    assert summary["learner_restarts"] == 1
    assert summary["initial_success"] <= 0.5
    assert summary["final_success"] > summary["initial_success"]
    assert summary["env_steps"] > 800 and summary["interventions"] > 0
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    report = json.loads((runs[0] / "report.json").read_text())
    assert report["final_success"] == summary["final_success"]
    for plot in report["plots"]:
        assert Path(plot).stat().st_size > 1000
