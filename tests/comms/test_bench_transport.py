"""``robofleet bench transport --quick`` runs end to end on real servers (gRPC acks, the
ZeroMQ data plane, raw pyzmq, unary gRPC): a table, then one JSON line whose median ratio is
the median of the per-round ratios it lists."""

from __future__ import annotations

import json
import statistics

import pytest

from robofleet.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_transport_quick_prints_the_median_of_its_rounds(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "transport", "--quick", "--rounds", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "Median over 3 rounds" in "\n".join(lines[:-1])
    res = json.loads(lines[-1])
    for key in ("upload_ratio_rounds", "camera_upload_ratio_rounds"):
        rounds = res[key]
        assert len(rounds) == 3 and all(r > 0 for r in rounds), (key, rounds)
    assert res["upload_ratio_median"] == pytest.approx(
        statistics.median(res["upload_ratio_rounds"]), abs=1e-3
    )
    assert res["camera_upload_ratio_median"] == pytest.approx(
        statistics.median(res["camera_upload_ratio_rounds"]), abs=1e-3
    )
    assert res["upload_ratio_vs_zmq"] > 0 and res["upload_ratio_vs_unary_pickle"] > 1


def test_bench_transport_refuses_zero_rounds(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "transport", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
