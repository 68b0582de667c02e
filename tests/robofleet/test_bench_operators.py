"""``robofleet bench operators`` in a tiny version: one risk run of two simulated blind robots
and one simulated operator, through a real cloud: requests are assigned over the robots'
Control streams, the on-call person takes over, the operator's busy time and the return on
human effort reach the JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robofleet.bench.operators import main, random_rate


def test_random_rate_follows_the_risk_runs_requests() -> None:
    assert random_rate({"help_requests": 30, "env_steps": 3000}) == pytest.approx(0.01)
    assert random_rate(None) > 0


def test_tiny_operators_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--configs", "risk", "--robots", "2", "--minutes", "0.5", "--threshold", "1e-5"]
    argv += ["--on-call-steps", "10", "--eval-every", "15", "--eval-episodes", "2"]
    figure = tmp_path / "operators.png"
    assert main(argv + ["--keep", str(tmp_path), "--figure", str(figure)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    risk = out["configs"]["risk"]
    assert risk["help_requests"] >= 1
    assert risk["operator_minutes"] > 0  # the simulated operator was assigned and busy
    assert risk["history"] and risk["late_success"] is not None
    assert out["figure"] == str(figure) and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if risk["autonomous_successes"]:
        assert risk["return_on_human_effort"] == pytest.approx(
            risk["autonomous_successes"] / risk["operator_minutes"], rel=1e-2
        )
