"""Launching and controlling runs through the dashboard with no cloud in its process
(``QueuedRunManager``: requests recorded for a cloud to act on); 422s and 404s."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Lease, Robot, RobotStatus, Run
from tests.dashboard.helpers import VALID_SPEC, add_robot, count
from tests.dashboard.test_route_guard import routes

Client = Callable[[Role], TestClient]


@pytest.fixture(autouse=True)
def fleet(store: MetadataStore) -> list[int]:
    """The two robots VALID_SPEC asks for: a launch is validated against the fleet."""
    return [add_robot(store, "sawyer-1"), add_robot(store, "sawyer-2")]


def test_launch_records_pending_run_and_event(as_role: Client, store: MetadataStore) -> None:
    r = as_role(Role.OPERATOR).post("/api/runs", json=VALID_SPEC)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    assert r.json()["state"] == "pending"
    run = store.get_run(run_id)
    assert run is not None and run.algorithm == "hg-dagger"
    assert run.spec["tasks"] == ["reach-v3", "pick-place-v3"]
    assert run.spec["buffer"]["online_fraction"] == 0.5  # defaults filled in
    assert run.spec["version"] == 1 and run.spec["hyperparameters"]["lr"] == 0.001
    with store.session() as s:
        ev = s.scalar(select(Event).where(Event.kind == "run.launched"))
        assert ev is not None and ev.run_id == run_id and ev.actor == "user:operator"
    detail = as_role(Role.VIEWER).get(f"/api/runs/{run_id}").json()
    assert detail["state"] == "pending" and detail["leased_robots"] == []
    assert [x["id"] for x in as_role(Role.VIEWER).get("/api/runs").json()] == [run_id]


def test_invalid_spec_names_each_field_and_creates_nothing(
    as_role: Client, store: MetadataStore
) -> None:
    bad = copy.deepcopy(VALID_SPEC)
    bad["tasks"] = ["reach-v3", "reach-v3", "bad task!"]
    bad["robots"]["count"] = 0
    bad["buffer"] = {"online_fraction": 1.5}
    bad["algorithm"] = "ppo"
    bad["surprise"] = 1
    op = as_role(Role.OPERATOR)  # logs in (an event) before counting
    before = (count(store, Run), count(store, Event))
    r = op.post("/api/runs", json=bad)
    assert r.status_code == 422
    locs = {tuple(e["loc"]) for e in r.json()["detail"]}
    assert {
        ("body", "tasks"),
        ("body", "robots", "count"),
        ("body", "buffer", "online_fraction"),
        ("body", "algorithm"),
        ("body", "surprise"),
    } <= locs
    msgs = " ".join(e["msg"] for e in r.json()["detail"])
    assert "bad task!" in msgs
    assert (count(store, Run), count(store, Event)) == before


def test_init_from_unknown_run_is_a_field_error(as_role: Client, store: MetadataStore) -> None:
    spec = copy.deepcopy(VALID_SPEC)
    spec["policy"]["init_from_run"] = "run-nope"
    r = as_role(Role.OPERATOR).post("/api/runs", json=spec)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "policy", "init_from_run"]
    assert count(store, Run) == 0


def test_state_machine_and_conflicts(as_role: Client, store: MetadataStore) -> None:
    op = as_role(Role.OPERATOR)
    run_id = op.post("/api/runs", json=VALID_SPEC).json()["id"]

    def act(action: str) -> tuple[int, str]:
        r = op.post(f"/api/runs/{run_id}/{action}")
        return r.status_code, r.json().get("state") or r.json()["detail"]

    assert act("resume")[0] == 409  # pending runs are not resumable
    assert act("pause") == (200, "paused")
    assert act("checkpoint") == (200, "paused")
    assert act("stop") == (200, "stopped")  # no cloud is running: stopped at once
    code, detail = act("pause")
    assert code == 409 and "stopped" in detail
    assert act("resume") == (200, "resuming")
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.run_id == run_id))]
    assert kinds == [
        "run.launched",
        "run.paused",
        "run.checkpoint_requested",
        "run.stopping",
        "run.stopped",
        "run.resuming",
    ]


def test_stop_releases_leases_atomically(as_role: Client, store: MetadataStore) -> None:
    a, b = add_robot(store, "a"), add_robot(store, "b")
    run_id = as_role(Role.OPERATOR).post("/api/runs", json=VALID_SPEC).json()["id"]
    store.lease_robots(run_id, [a, b])
    assert as_role(Role.VIEWER).get(f"/api/runs/{run_id}").json()["leased_robots"] == ["a", "b"]
    assert as_role(Role.OPERATOR).post(f"/api/runs/{run_id}/stop").status_code == 200
    assert store.active_leases(run_id) == []
    with store.session() as s:
        assert {r.status for r in s.scalars(select(Robot))} == {RobotStatus.IDLE}
        assert s.query(Lease).count() == 2


VALID_BODIES = {
    "/answer": {},
    "/label": {"label": "success"},
    "/command": {"id": 1, "axes": [], "deadman": False},
}


def test_unknown_ids_are_404_on_every_route_with_an_id(as_role: Client) -> None:
    admin = as_role(Role.ADMIN)
    checked = 0
    for method, path in routes(admin.app):  # type: ignore[arg-type]
        if "{" not in path:
            continue
        url = re.sub(r"\{[^}]+\}", "987654", path)
        # A valid body where the route takes one: its check comes before the lookup (422).
        body = next((b for tail, b in VALID_BODIES.items() if path.endswith(tail)), None)
        if body is None and path.startswith("/api/users"):
            body = {"disabled": False}
        r = admin.request(method, url, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        checked += 1
    assert checked >= 12
