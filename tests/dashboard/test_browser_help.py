"""The run page's help requests in Debian's chromium: a robot's waiting request is listed with
the run's figures, an operator dismisses it from the page and the figures follow."""

from __future__ import annotations

import time

import pytest

from comms.cloud.liveness import record_heartbeat
from foundation.store.models import Run
from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.helpers import add_robot
from tests.dashboard.test_browser import _shot, page  # noqa: F401  (the chromium fixture)

pytestmark = pytest.mark.browser


def test_run_page_lists_and_dismisses_help_requests(page, live_server: LiveServer) -> None:  # noqa: F811  # type: ignore[no-untyped-def]
    base, store = live_server.url, live_server.store
    js_errors: list[str] = []
    page.on("pageerror", lambda e: js_errors.append(str(e)))
    rid = add_robot(store, "arm-1")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    report = {"key": "arm-1:2:9", "episode": 2, "step": 9, "risk": 0.87, "timeout_s": 600.0}
    report["requested_at"] = time.time() - 3
    record_heartbeat(store, rid, "running", 1, {}, "run-a", {"help": [report]})

    page.goto(f"{base}/runs/run-a")  # to the login form first, then back here
    page.fill("#username", "operator")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/runs/run-a")
    row = page.locator("#help-requests tbody tr", has_text="waiting")
    row.wait_for()
    assert all(x in row.inner_text() for x in ("arm-1", "0.87", "2 · 9"))
    page.wait_for_selector("#help-figures:has-text('1 requests: 1 open')")
    _shot(page, "help-requests")
    row.locator("button", has_text="Dismiss").click()
    page.wait_for_selector("#help-requests tbody tr:has-text('dismissed')")
    page.wait_for_selector("#help-figures:has-text('1 answered')")
    assert "user:operator" in page.locator("#help-requests tbody tr").first.inner_text()
    assert js_errors == []
