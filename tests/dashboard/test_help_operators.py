"""Fewer people than robots, in the cloud: requests assigned to free operators by risk, a
request waits while all are busy and goes to the first one freed (a person's "done" or the
robot's hand-back report), the simulated operators' dispatcher, operator time and return on
human effort from stored figures, and the API (login required)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from comms.cloud.liveness import record_heartbeat
from foundation.store import help_assignments as assign
from foundation.store.accounts import Role
from foundation.store.base import utcnow
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import metrics_after
from foundation.store.models import Run
from runs.help_dispatch import SimulatedOperators
from runs.operator_effort import OperatorEffort
from tests.dashboard.helpers import add_robot
from tests.dashboard.test_fleet import RecordingControl
from tests.dashboard.test_help_requests import _app, _report


def _requests(store: MetadataStore, run: str, risks: dict[str, float]) -> dict[str, int]:
    """One robot per request (name -> risk); returns name -> robot id."""
    with store.session() as s:
        s.add(Run(id=run, algorithm="hg-dagger", spec={"help": {"operators": 1}}))
    ids = {}
    for name, risk in risks.items():
        rid = ids[name] = add_robot(store, f"{run}-{name}")
        report = _report(f"{name}:0:1", risk)
        record_heartbeat(store, rid, "running", 1, {}, run, {"help": [report]})
    return ids


def _risk(row: dict[str, Any] | None) -> float:
    assert row is not None
    return float(row["risk"])


def test_one_operator_takes_by_risk_and_the_others_wait(store: MetadataStore) -> None:
    _requests(store, "run-1", {"a": 0.5, "b": 0.9, "c": 0.7})
    assert _risk(assign.take_next(store, "run-1", "alice", operators=1)) == 0.9
    with pytest.raises(assign.OperatorsBusy, match="all 1 operators"):
        assign.take_next(store, "run-1", "bob", operators=1)
    with pytest.raises(assign.OperatorsBusy, match="alice is busy"):
        assign.take_next(store, "run-1", "alice", operators=1)
    queue = assign.queue(store, "run-1")
    assert [(q["risk"], q["assigned_to"]) for q in queue] == [
        (0.9, "alice"),
        (0.7, ""),
        (0.5, ""),
    ]
    ended = assign.done(store, "run-1", "alice")
    assert (ended["outcome"], ended["answered_by"]) == ("dismissed", "alice")
    assert ended["released_at"] is not None
    assert _risk(assign.take_next(store, "run-1", "bob", operators=1)) == 0.7


def test_two_busy_operators_and_the_robots_hand_back_frees_one(store: MetadataStore) -> None:
    ids = _requests(store, "run-2", {"a": 0.5, "b": 0.9, "c": 0.7})
    assert _risk(assign.take_next(store, "run-2", "alice", operators=2)) == 0.9
    assert _risk(assign.take_next(store, "run-2", "bob", operators=2)) == 0.7
    with pytest.raises(assign.OperatorsBusy):
        assign.take_next(store, "run-2", "carol", operators=2)  # 0.5 waits in the queue
    assert assign.busy_operators(store, "run-2").keys() == {"alice", "bob"}
    # Robot b's person took over and handed back: its report frees alice.
    now = time.time()
    back = _report("b:0:1", 0.9, outcome="took_over", ended_at=now, by="alice", closed_at=now)
    record_heartbeat(store, ids["b"], "running", 1, {}, "run-2", {"help": [back]})
    assert assign.busy_operators(store, "run-2").keys() == {"bob"}
    assert _risk(assign.take_next(store, "run-2", "carol", operators=2)) == 0.5
    assert assign.take_next(store, "run-2", "alice", operators=None) is None  # none waits


def test_operator_time_and_return_on_effort_from_stored_figures(
    store: MetadataStore, tmp_path: Path
) -> None:
    _requests(store, "run-3", {"a": 0.9, "b": 0.8})
    t0 = utcnow() - timedelta(minutes=10)
    assign.take_next(store, "run-3", "alice", at=t0)
    assign.done(store, "run-3", "alice", at=t0 + timedelta(seconds=90))
    assign.take_next(store, "run-3", "alice", at=t0 + timedelta(seconds=100))
    assign.done(store, "run-3", "alice", at=t0 + timedelta(seconds=130))
    assert assign.operator_seconds(store, "run-3") == pytest.approx(120.0)
    effort = OperatorEffort(store, "run-3", tmp_path, operators=1)
    stats = {"r1": {"autonomous/reach-v3/successes": 3}, "r2": {"autonomous/reach-v3/successes": 1}}
    row = effort.write(600.0, 2, 1000, stats)
    assert (row["operator_minutes"], row["autonomous_successes"]) == (2.0, 4.0)
    assert row["return_on_human_effort"] == pytest.approx(2.0)  # 4 successes / 2 minutes
    [point] = metrics_after(store, "run-3", name="return_on_human_effort")
    assert point["value"] == pytest.approx(2.0)
    assert json.loads((tmp_path / "effort.jsonl").read_text())["operator_minutes"] == 2.0
    report = _report_of(tmp_path)
    assert report["return_on_human_effort"] == pytest.approx(2.0)
    assert report["operators"] == 1 and report["effort_over_time"][-1]["operator_minutes"] == 2.0
    assert (tmp_path / "report_effort.png").stat().st_size > 0
    # One dedicated person per robot: busy for the whole run (2 robots x 10 minutes).
    dedicated = OperatorEffort(store, "run-3", tmp_path / "d", operators=None)
    (tmp_path / "d").mkdir()
    assert dedicated.write(600.0, 2, 1000, stats)["return_on_human_effort"] == pytest.approx(0.2)


def _report_of(run_dir: Path) -> dict[str, Any]:
    """The run report written from ``run_dir`` (a one-operator run of two robots)."""
    from foundation.runspec import parse_run_spec
    from runs.report import write_report

    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "x", "count": 2},
            "help": {"risk": "ensemble", "operators": 1},
        }
    )
    write_report(run_dir, "run-3", spec, learner_restarts=0, accounts={}, elapsed_s=600.0)
    return dict(json.loads((run_dir / "report.json").read_text()))


def test_the_simulated_operator_takes_over_and_is_freed_by_the_hand_back(
    store: MetadataStore,
) -> None:
    ids = _requests(store, "run-4", {"a": 0.6, "b": 0.8})
    control = RecordingControl(set(ids.values()))
    people = SimulatedOperators(store, control, "run-4", 1)
    [first] = people.turn()
    assert (first["risk"], first["outcome"]) == (0.8, "took_over")
    rid, kind, run, reason = control.pushed[-1]
    assert (rid, kind, run) == (ids["b"], "help_answered", "run-4")
    assert json.loads(reason) == {
        "key": "b:0:1",
        "outcome": "took_over",
        "by": "simulated-operator-1",
    }
    assert people.turn() == []  # the one person is busy: a waits
    now = time.time()
    back = _report("b:0:1", 0.8, outcome="took_over", ended_at=now, closed_at=now)
    record_heartbeat(store, ids["b"], "running", 1, {}, "run-4", {"help": [back]})
    assert [r["risk"] for r in people.turn()] == [0.6]


def test_queue_take_and_done_api(settings: Any, store: MetadataStore) -> None:
    from tests.dashboard.conftest import login

    ids = _requests(store, "run-5", {"a": 0.4, "b": 0.9})
    control = RecordingControl(set(ids.values()))
    app = _app(settings, store, control)
    anon = login(app, Role.VIEWER.value)
    anon.cookies.clear()
    for method, path in (
        ("get", "/queue"),
        ("post", "/take"),
        ("post", "/done"),
        ("get", "/summary"),
    ):
        assert getattr(anon, method)(f"/api/runs/run-5/help{path}").status_code == 401
    viewer = login(app, Role.VIEWER.value)
    assert viewer.post("/api/runs/run-5/help/take").status_code == 403

    op = login(app, Role.OPERATOR.value)
    took = op.post("/api/runs/run-5/help/take")
    assert took.status_code == 200, took.text
    assert (took.json()["request"]["risk"], took.json()["request"]["assigned_to"]) == (
        0.9,
        "user:operator",
    )
    assert op.post("/api/runs/run-5/help/take").status_code == 409  # busy with one
    queue = viewer.get("/api/runs/run-5/help/queue").json()
    assert queue["operators"] == 1 and queue["busy"] == {
        "user:operator": took.json()["request"]["id"]
    }
    assert [(q["risk"], q["assigned_to"]) for q in queue["queue"]] == [
        (0.9, "user:operator"),
        (0.4, ""),
    ]
    done = op.post("/api/runs/run-5/help/done")
    assert done.status_code == 200, done.text
    assert done.json()["outcome"] == "dismissed" and done.json()["robot_told"] is True
    assert control.pushed[-1][:2] == (ids["b"], "help_answered")
    assert op.post("/api/runs/run-5/help/done").status_code == 409  # free already
    effort = viewer.get("/api/runs/run-5/help/summary").json()["effort"]
    assert effort["operators"] == 1 and effort["busy"] == {}
