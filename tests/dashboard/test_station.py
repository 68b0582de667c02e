"""The operator station's routes: the page's guard, each robot's state, the command path to the
cloud (pushed as the robot reads it, answered with the robot's echo), frames, resume.

The cloud is a stand-in that records what the dashboard pushes and plays the robot's echo;
tests/edge_agent/test_remote_operator.py runs the same commands through comms' real server
to a real agent, and tests/dashboard/test_browser_station.py the whole path from Chromium.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from foundation.contracts import RobotStation
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Robot, RobotStatus, Run
from tests.dashboard.conftest import login
from tests.dashboard.helpers import add_robot

JPEG = b"\xff\xd8\xff\xe0fake-jpeg"


@dataclass(frozen=True)
class View:
    run_id: str = "run-a"
    frame: bytes = b""
    frame_format: str = ""
    camera: str = ""
    taken_over: bool = False
    echo_id: int = 0
    note: str = ""
    received: float = 0.0


class FakeStation:
    """The cloud's comms server as the station sees it; a connected robot echoes each
    command ``echo_after_s`` after it was pushed, as its remote operator's report would."""

    def __init__(self, connected: set[int], echo_after_s: float = 0.02) -> None:
        self.connected = connected
        self.echo_after_s = echo_after_s
        self.views: dict[int, View] = {}
        self.teleop: list[tuple[int, dict[str, Any], str]] = []
        self.pushed: list[tuple[int, str, str, str]] = []
        # Cleared, the robot's echoes wait until it is set again: a test can then see an
        # answer given before the echo however slowly the machine runs.
        self.echoes_flow = threading.Event()
        self.echoes_flow.set()

    def push_control(self, robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        if robot_id not in self.connected:
            return False
        self.pushed.append((robot_id, kind, run_id, reason))
        return True

    def push_teleop(self, robot_id: int, command: str, run_id: str = "") -> bool:
        if robot_id not in self.connected:
            return False
        cmd = json.loads(command)
        self.teleop.append((robot_id, cmd, run_id))

        def echo() -> None:
            self.echoes_flow.wait(30.0)
            old = self.views.get(robot_id, View(received=time.monotonic()))
            self.views[robot_id] = replace(
                old, echo_id=cmd["id"], taken_over=cmd["deadman"], received=time.monotonic()
            )

        timer = threading.Timer(self.echo_after_s, echo)
        timer.daemon = True
        timer.start()
        return True

    def station_view(self, robot_id: int) -> View | None:
        return self.views.get(robot_id)


def _app(settings: Any, store: MetadataStore, control: Any) -> Any:
    from dashboard.app import create_app
    from runs.manager import QueuedRunManager

    return create_app(settings, store, QueuedRunManager(store, settings.data_dir), control)


def _beat(store: MetadataStore, robot_id: int, state: str, **stats: float) -> None:
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        assert robot is not None
        robot.stats = {"state": state, "run_id": "run-a", **stats}


def _lease(store: MetadataStore, *robot_ids: int) -> None:
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    store.lease_robots("run-a", list(robot_ids))


def test_the_station_page_needs_an_operator(settings: Any, store: MetadataStore) -> None:
    app = _app(settings, store, FakeStation(set()))
    assert isinstance(app.state.robot_control, RobotStation)
    from fastapi.testclient import TestClient

    anon = TestClient(app, follow_redirects=False)
    assert anon.get("/station").status_code == 303
    assert anon.get("/api/station/robots").status_code == 401
    assert login(app, Role.VIEWER.value).get("/station").status_code == 403
    page = login(app, Role.OPERATOR.value).get("/station")
    assert page.status_code == 200 and 'id="station-help"' in page.text
    assert "/static/station.js" in page.text


def test_each_robot_shows_its_state_frame_and_autonomous_success(
    settings: Any, store: MetadataStore
) -> None:
    ids = {
        name: add_robot(store, name)
        for name in ("auto", "driven", "resetting", "held", "quiet", "gone")
    }
    with store.session() as s:
        gone = s.get(Robot, ids["gone"])
        assert gone is not None
        gone.status = RobotStatus.OFFLINE
    _beat(store, ids["auto"], "running", **{"autonomous/reach/episodes": 4.0})
    _beat(
        store,
        ids["auto"],
        "running",
        **{"autonomous/reach/successes": 3.0, "autonomous/reach/episodes": 4.0},
    )
    _beat(store, ids["driven"], "running")
    _beat(store, ids["resetting"], "resetting")
    _beat(store, ids["held"], "paused")
    station = FakeStation(set(ids.values()))
    now = time.monotonic()
    station.views[ids["auto"]] = View(
        frame=JPEG, frame_format="jpeg", camera="corner", received=now
    )
    station.views[ids["driven"]] = View(taken_over=True, received=now)
    station.views[ids["held"]] = View(note="heartbeat lost", received=now)
    app = _app(settings, store, station)
    rows = {r["name"]: r for r in login(app, Role.OPERATOR.value).get("/api/station/robots").json()}
    assert {n: r["state"] for n, r in rows.items()} == {
        "auto": "autonomous",
        "driven": "taken_over",
        "resetting": "waiting_for_reset",
        "held": "held",
        "quiet": "idle",
        "gone": "offline",
    }
    auto = rows["auto"]
    assert auto["camera"] == "corner" and auto["frame_age_s"] is not None
    assert (auto["autonomous_successes"], auto["autonomous_episodes"]) == (3, 4)
    assert rows["held"]["note"] == "heartbeat lost" and rows["quiet"]["frame_age_s"] is None
    op = login(app, Role.OPERATOR.value)
    img = op.get(f"/api/station/robots/{ids['auto']}/frame")
    assert img.status_code == 200 and img.content == JPEG
    assert img.headers["content-type"] == "image/jpeg"
    assert op.get(f"/api/station/robots/{ids['quiet']}/frame").status_code == 404


def test_a_command_reaches_the_robot_and_answers_with_its_echo(
    settings: Any, store: MetadataStore
) -> None:
    rid, other = add_robot(store, "arm-1"), add_robot(store, "arm-2")
    station = FakeStation({rid})
    app = _app(settings, store, station)
    op = login(app, Role.OPERATOR.value)
    body = {"id": 5, "axes": [1.0, 0.0, -0.5], "deadman": True, "wait_echo_ms": 500}
    r = op.post(f"/api/station/robots/{rid}/command", json=body)
    assert r.status_code == 409 and "not leased" in r.json()["detail"]
    _lease(store, rid, other)
    r = op.post(f"/api/station/robots/{rid}/command", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"echo_id": 5, "echoed": True, "taken_over": True, "note": ""}
    robot, sent, run_id = station.teleop[-1]
    assert (robot, run_id) == (rid, "run-a")
    assert sent == {
        "id": 5,
        "axes": [1.0, 0.0, -0.5],
        "deadman": True,
        "label": "",
        "actor": "user:operator",
    }
    # no wait: answered before the robot echoes (held back until the answer is in)
    station.echoes_flow.clear()
    r = op.post(f"/api/station/robots/{rid}/command", json={**body, "id": 6, "wait_echo_ms": 0})
    station.echoes_flow.set()
    assert r.json()["echoed"] is False
    r = op.post(f"/api/station/robots/{other}/command", json=body)
    assert r.status_code == 409 and "not connected" in r.json()["detail"]
    for bad in ({**body, "axes": [1.5]}, {**body, "id": 0}, {**body, "label": "maybe"}):
        assert op.post(f"/api/station/robots/{rid}/command", json=bad).status_code == 422
    label = {"id": 7, "deadman": False, "label": "success"}
    assert op.post(f"/api/station/robots/{rid}/command", json=label).status_code == 200
    assert station.teleop[-1][1]["label"] == "success"
    assert op.post(f"/api/station/robots/{rid}/resume").status_code == 200
    assert station.pushed == [(rid, "resume", "run-a", "station: user:operator")]
    with store.session() as s:
        kinds = {e.kind for e in s.scalars(select(Event).where(Event.robot_id == rid))}
    assert {"robot.station_success", "robot.station_resume"} <= kinds
    viewer = login(app, Role.VIEWER.value)
    assert viewer.post(f"/api/station/robots/{rid}/command", json=body).status_code == 403


def test_without_the_cloud_in_process_the_station_says_why(
    settings: Any, store: MetadataStore
) -> None:
    rid = add_robot(store, "arm-1")
    _lease(store, rid)
    app = _app(settings, store, None)
    op = login(app, Role.OPERATOR.value)
    assert op.get("/api/station/robots").status_code == 200
    r = op.post(f"/api/station/robots/{rid}/command", json={"id": 1, "deadman": True})
    assert r.status_code == 409 and "comms server" in r.json()["detail"]
