"""The dashboard's Ready button (a ``ready`` command to a robot holding for a reset by hand) and
a run's human cost table (live from heartbeats, then from the run's report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Robot, Run
from tests.dashboard.helpers import add_robot
from tests.dashboard.test_fleet import RecordingControl


def _app(settings: Any, store: MetadataStore, control: Any) -> Any:
    from dashboard.app import create_app
    from runs.manager import QueuedRunManager

    return create_app(settings, store, QueuedRunManager(store, settings.data_dir), control)


def test_ready_reaches_a_leased_connected_robot(settings: Any, store: MetadataStore) -> None:
    from tests.dashboard.conftest import login

    rid, other = add_robot(store, "arm-1"), add_robot(store, "arm-2")
    control = RecordingControl({rid})
    app = _app(settings, store, control)
    op = login(app, Role.OPERATOR.value)
    r = op.post(f"/api/robots/{rid}/ready")
    assert r.status_code == 409 and "not leased" in r.json()["detail"]
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    store.lease_robots("run-a", [rid, other])
    assert op.post(f"/api/robots/{rid}/ready").status_code == 200
    r = op.post(f"/api/robots/{other}/ready")
    assert r.status_code == 409 and "not connected" in r.json()["detail"]
    assert control.pushed == [(rid, "ready", "run-a", "dashboard: user:operator")]
    assert login(app, Role.VIEWER.value).post(f"/api/robots/{rid}/ready").status_code == 403
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.robot_id == rid))]
    assert "robot.ready" in kinds


def test_run_human_cost_live_then_from_the_report(
    settings: Any, store: MetadataStore, tmp_path: Path
) -> None:
    from tests.dashboard.conftest import login

    rid, gone = add_robot(store, "arm-1"), add_robot(store, "arm-2")
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger", run_dir=str(run_dir)))
        s.get_one(Robot, rid).stats = {
            "state": "resetting",
            "run_id": "run-a",
            "human/reach/episode_s": 1800.0,
            "human/reach/autonomous_reset_s": 1800.0,
            "human/reach/resets": 4.0,
            "autonomous/reach/successes": 5.0,
        }
        s.get_one(Robot, gone).stats = {"run_id": "run-b", "human/reach/labels": 9.0}
    viewer = login(_app(settings, store, None), Role.VIEWER.value)
    live = viewer.get("/api/runs/run-a/human-cost").json()
    assert live["source"] == "robots" and list(live["robots"]) == ["arm-1"]
    reach = live["robots"]["arm-1"]["reach"]
    assert reach["successes_per_hour_excl_resets"] == pytest.approx(10.0)
    assert reach["successes_per_hour_incl_resets"] == pytest.approx(5.0)
    report = {"human_cost": {"robots": {}, "tasks": {}, "total": {"labels": 3.0}}}
    (run_dir / "report.json").write_text(json.dumps(report))
    final = viewer.get("/api/runs/run-a/human-cost").json()
    assert final == {"source": "report", **report["human_cost"]}
