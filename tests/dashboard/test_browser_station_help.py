"""The station's help queue in Debian's chromium: two robots of a run asked for a person (their
heartbeats carry the requests, as ``edge_agent.help`` sends them); the station lists them by
risk and shows the robots waiting; the person takes the top one (assigned to them, answered
``took_over``, its robot selected to drive), dismisses the other and is done."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from comms.cloud.liveness import record_heartbeat
from foundation.store.help_requests import HelpRequest
from foundation.store.models import Run
from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.helpers import add_robot
from tests.dashboard.test_browser import _shot, page  # noqa: F401  (the chromium fixture)

pytestmark = pytest.mark.browser


def _ask(live_server: LiveServer, robot_id: int, name: str, risk: float) -> None:
    report = {"key": f"{name}:1:5", "episode": 1, "step": 5, "risk": risk, "timeout_s": 600.0}
    report["requested_at"] = time.time() - 2
    stats = {"help_waiting": 1.0, "help_risk": risk}
    record_heartbeat(live_server.store, robot_id, "running", 1, stats, "run-a", {"help": [report]})


def _requests(live_server: LiveServer) -> dict[str, tuple[str, str | None]]:
    with live_server.store.session() as s:
        rows = s.scalars(select(HelpRequest).where(HelpRequest.run_id == "run-a"))
        return {r.key.split(":")[0]: (r.assigned_to, r.outcome) for r in rows}


def test_station_takes_the_riskiest_help_request_and_dismisses_the_other(
    page,  # noqa: F811  # type: ignore[no-untyped-def]
    live_server: LiveServer,
) -> None:
    base, store = live_server.url, live_server.store
    js_errors: list[str] = []
    page.on("pageerror", lambda e: js_errors.append(str(e)))
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    low, high = add_robot(store, "arm-1"), add_robot(store, "arm-2")
    store.lease_robots("run-a", [low, high])
    _ask(live_server, low, "arm-1", 0.4)
    _ask(live_server, high, "arm-2", 0.9)

    page.goto(f"{base}/station")  # the login form first, then back here
    page.fill("#username", "operator")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/station")
    rows = page.locator("#station-help-table tbody tr")
    page.wait_for_selector("#station-help-table tbody tr:nth-child(2)")
    assert "arm-2" in rows.nth(0).inner_text() and "0.90" in rows.nth(0).inner_text()
    assert "arm-1" in rows.nth(1).inner_text() and "waiting" in rows.nth(1).inner_text()
    assert rows.nth(1).locator("button", has_text="Take").count() == 0  # take gives the top one
    page.wait_for_selector("[data-robot-id] .badge.waiting_for_help")
    _shot(page, "station-help")

    rows.nth(0).locator("button", has_text="Take").click()
    page.wait_for_selector("#drive-name:has-text('arm-2')")
    page.wait_for_selector("#station-help-table tbody tr:has-text('user:operator')")
    assert _requests(live_server)["arm-2"] == ("user:operator", "took_over")
    page.locator("#station-help-table tbody tr", has_text="arm-1").locator(
        "button", has_text="Dismiss"
    ).click()
    page.wait_for_function("() => !document.body.innerText.includes('arm-1\\trun-a')")
    assert _requests(live_server)["arm-1"][1] == "dismissed"
    page.click("#drive-help-done")
    page.wait_for_selector("#station-help-empty", state="visible")
    with store.session() as s:
        released = s.scalar(select(HelpRequest.released_at).where(HelpRequest.robot_id == high))
    assert released is not None  # the person is free for the next request
    assert js_errors == []
