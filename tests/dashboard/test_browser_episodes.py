"""The run page's episode viewer in Debian's chromium: the run's episodes are listed, one opens
with its frame and traces, its intervention segment is shaded, and an operator relabels it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.episode_fixtures import RUN, make_run
from tests.dashboard.test_browser import _shot, page  # noqa: F401  (the chromium fixture)

pytestmark = pytest.mark.browser


def test_run_page_views_and_relabels_an_episode(  # type: ignore[no-untyped-def]
    page,  # noqa: F811
    live_server: LiveServer,
    tmp_path: Path,
) -> None:
    base = live_server.url
    js_errors: list[str] = []
    page.on("pageerror", lambda e: js_errors.append(str(e)))
    run = make_run(live_server.store, tmp_path / "runs")
    page.goto(f"{base}/runs/{RUN}")
    page.fill("#username", "operator")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/runs/{RUN}")
    row = page.locator(f"#episodes tbody tr[data-key='{run['b']}/0']")
    row.wait_for()
    assert "arm-b" in row.inner_text() and page.locator("#episodes tbody tr").count() == 4
    row.locator("button", has_text="Open").click()
    page.wait_for_selector("#episode-frame[data-frame='0']")
    width = "document.getElementById('episode-frame').naturalWidth"
    deadline = time.monotonic() + 10  # the CSP forbids wait_for_function's eval: poll
    while not page.evaluate(width) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert page.evaluate(width) == run["image"][1]
    traces = page.locator("#episode-traces canvas")
    assert traces.count() == 3  # the state, and one chart per action dim
    assert traces.first.get_attribute("data-segments") == "1"
    assert traces.first.get_attribute("data-helps") == "1"
    page.locator("#episode-scrubber").fill("4")
    page.wait_for_selector("#episode-frame[data-frame='4']")
    assert "a person acted" in page.inner_text("#episode-status")
    _shot(page, "episode-viewer")
    page.click("#episode-view button[data-label=failure]")
    page.wait_for_selector("#episode-label:has-text('failure')")
    row.locator("td", has_text="failure").wait_for()
    assert "user:operator" in row.inner_text()
    assert js_errors == []
