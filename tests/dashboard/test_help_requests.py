"""Help requests in the cloud: robots' heartbeat reports stored idempotently, the queue by risk,
a person's answer (told to the robot), expiry of silent robots, figures; login required."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import select

from comms.cloud.liveness import record_heartbeat
from foundation.store.accounts import Role
from foundation.store.help_requests import HelpRequestError
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Run
from tests.dashboard.helpers import add_robot
from tests.dashboard.test_fleet import RecordingControl


def _report(key: str, risk: float, age_s: float = 1.0, **more: Any) -> dict[str, Any]:
    return {
        "key": key,
        "episode": 3,
        "step": 7,
        "risk": risk,
        "timeout_s": 60.0,
        "requested_at": time.time() - age_s,
        **more,
    }


def _app(settings: Any, store: MetadataStore, control: Any) -> Any:
    from dashboard.app import create_app
    from runs.manager import QueuedRunManager

    return create_app(settings, store, QueuedRunManager(store, settings.data_dir), control)


def test_queue_by_risk_answer_and_figures(settings: Any, store: MetadataStore) -> None:
    from tests.dashboard.conftest import login

    a, b = add_robot(store, "arm-1"), add_robot(store, "arm-2")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    # Heartbeats carry the robots' requests; a repeated report stores nothing new.
    for _ in range(2):
        record_heartbeat(store, a, "running", 1, {}, "run-a", {"help": [_report("a:3:7", 0.6)]})
    record_heartbeat(store, b, "running", 1, {}, "run-a", {"help": [_report("b:3:7", 0.9)]})
    record_heartbeat(
        store, b, "running", 1, {}, "run-a", {"help": [_report("b:0:1", 0.99, age_s=120)]}
    )
    control = RecordingControl({a, b})
    app = _app(settings, store, control)
    anon = login(app, Role.VIEWER.value)
    anon.cookies.clear()
    assert anon.get("/api/runs/run-a/help").status_code == 401
    assert anon.post("/api/runs/run-a/help/1/answer", json={}).status_code == 401

    viewer = login(app, Role.VIEWER.value)
    queue = viewer.get("/api/runs/run-a/help").json()
    # the 120 s old request outlived its 60 s timeout: expired, not queued
    assert [(q["key"], q["risk"], q["robot_name"]) for q in queue] == [
        ("b:3:7", 0.9, "arm-2"),
        ("a:3:7", 0.6, "arm-1"),
    ]
    assert viewer.post(f"/api/runs/run-a/help/{queue[0]['id']}/answer", json={}).status_code == 403

    op = login(app, Role.OPERATOR.value)
    r = op.post(f"/api/runs/run-a/help/{queue[0]['id']}/answer", json={"outcome": "dismissed"})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["outcome"] == "dismissed" and done["answered_by"] == "user:operator"
    assert done["wait_s"] >= 1.0 and done["robot_told"] is True
    rid, kind, run, reason = control.pushed[-1]
    assert (rid, kind, run) == (b, "help_answered", "run-a")
    assert json.loads(reason) == {"key": "b:3:7", "outcome": "dismissed", "by": "user:operator"}
    again = op.post(f"/api/runs/run-a/help/{queue[0]['id']}/answer", json={})
    assert again.status_code == 409
    assert op.post("/api/runs/run-a/help/999/answer", json={}).status_code == 404
    bad = op.post(f"/api/runs/run-a/help/{queue[1]['id']}/answer", json={"outcome": "x"})
    assert bad.status_code == 422

    # The robot then reports its takeover of the other one, with the steps and the verdict.
    took = _report("a:3:7", 0.6, outcome="took_over", ended_at=time.time(), by="Keyboard")
    took.update(takeover_steps=12, label="success")
    record_heartbeat(store, a, "running", 1, {}, "run-a", {"help": [took]})
    summary = viewer.get("/api/runs/run-a/help/summary").json()
    fig = summary["figures"]
    assert (fig["requests"], fig["open"], fig["answered"], fig["expired"]) == (3, 0, 2, 1)
    assert fig["took_over"] == 1 and fig["takeover_steps"] == 12
    waits = sorted(q["wait_s"] for q in summary["recent"] if q["outcome"] != "expired")
    assert fig["median_wait_s"] == pytest.approx(sum(waits) / 2) and waits[0] >= 1.0
    assert summary["recent"][0]["key"] in {"a:3:7", "b:3:7"}
    with store.session() as s:
        kinds = sorted(e.kind for e in s.scalars(select(Event)) if e.kind.startswith("help."))
    assert kinds == ["help.dismissed", "help.expired"] + ["help.requested"] * 3 + ["help.took_over"]


def test_bad_reports_are_refused_by_name(store: MetadataStore) -> None:
    rid = add_robot(store, "arm-1")
    with pytest.raises(HelpRequestError, match="list"):
        record_heartbeat(store, rid, "running", 1, {}, "run-a", {"help": {"key": "x"}})
    no_risk = {k: v for k, v in _report("x", 0.5).items() if k != "risk"}
    with pytest.raises(HelpRequestError, match="risk"):
        record_heartbeat(store, rid, "running", 1, {}, "run-a", {"help": [no_risk]})
    with pytest.raises(HelpRequestError, match="outcome"):
        bad = _report("x", 0.5, outcome="lost", ended_at=time.time())
        record_heartbeat(store, rid, "running", 1, {}, "run-a", {"help": [bad]})
