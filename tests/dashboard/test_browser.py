"""End to end in Debian's chromium (headless, driven by Playwright) against a real uvicorn:
log in, enroll a simulated robot (the page prints the `robofleet edge` command with its driver
and operator), launch an HG-DAgger run (after a field error), watch the success chart update as
metrics arrive (every axis named), see the robots join the run and the fleet say what each robot
does, page through a long list of policy versions, stop and resume the run. Screenshots of every
page go to test-artifacts/dashboard/."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from comms.cloud.enrollment_tokens import edge_command
from foundation.store.metrics import insert_metrics
from foundation.store.models import (
    Event,
    PolicyVersion,
    Robot,
    RobotStatus,
    Run,
    RunState,
    utcnow,
)
from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.helpers import add_robot

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"

pytestmark = pytest.mark.browser


@pytest.fixture
def page(live_server: LiveServer) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    # In CI chromium must be there (.ci/run installs it); locally too: a missing one fails.
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing (apt-get install chromium)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(15_000)
        yield pg
        context.close()
        browser.close()


def _shot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


SAWYER_SPEC = {
    "robot_type": "metaworld-sawyer",
    "observation_features": {
        "observation.state": {"dtype": "float32", "shape": [39]},
        "observation.images.corner": {"dtype": "video", "shape": [64, 64, 3]},
    },
    "action_features": {"action": {"dtype": "float32", "shape": [4]}},
    "control_hz": 80.0,
    "cameras": [{"name": "corner", "height": 64, "width": 64, "channels": 3}],
    "capabilities": {"can_reset": True, "simulated": True, "multi_task": True},
    "computer": {"driver": "metaworld", "operator": "scripted"},
}


def test_operator_journey(page, live_server: LiveServer) -> None:  # type: ignore[no-untyped-def]
    base, store = live_server.url, live_server.store
    requested: list[str] = []
    js_errors: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("pageerror", lambda e: js_errors.append(str(e)))

    # -- log in (a protected page sends us to the form first)
    page.goto(f"{base}/runs")
    assert page.url.startswith(f"{base}/login")
    page.fill("#username", "admin")
    page.fill("#password", "wrong password")
    page.click("button[type=submit]")
    page.wait_for_selector("#login-error:has-text('wrong username or password')")
    _shot(page, "01-login")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/runs")

    # -- enroll a simulated robot: the page shows the exact command, the robot exchanges it
    page.goto(f"{base}/enroll")
    page.fill("input[name=robot_name]", "sim-sawyer-1")
    page.fill("input[name=robot_type]", "metaworld-sawyer")
    page.fill("input[name=tags]", "site=lab-a")
    page.fill("input[name=driver]", "metaworld")
    page.fill("textarea[name=driver_options]", 'task=reach-v3\ncameras=["corner"]')
    page.fill("input[name=operator]", "scripted")
    page.click("#enroll-form button[type=submit]")
    page.wait_for_selector("#enroll-result", state="visible")
    command = page.inner_text("#enroll-command").strip()
    token = command.split("--token=")[1].split()[0]
    assert command == edge_command(
        "127.0.0.1:50051",
        token,
        "sim-sawyer-1",
        driver="metaworld",
        driver_options={"task": "reach-v3", "cameras": ["corner"]},
        operator="scripted",
    )
    page.wait_for_selector("#tokens tbody tr:has-text('site=lab-a')")
    _shot(page, "02-enroll")
    robot, _credential = store.consume_enrollment_token(
        token, robot_name="sim-sawyer-1", robot_type="metaworld-sawyer", spec=SAWYER_SPEC
    )
    assert robot.tags == {"site": "lab-a"}
    with store.session() as s:
        r = s.get(Robot, robot.id)
        assert r is not None
        r.status, r.last_heartbeat_at = RobotStatus.IDLE, utcnow()
        r.stats = {"control_loop_p99_ms": 6.1}

    # -- fleet: the robot is listed; e-stop it and clear it again
    page.goto(f"{base}/")
    row = page.locator("#robots tbody tr", has_text="sim-sawyer-1")
    row.wait_for()
    assert "idle" in row.inner_text() and "6.1 ms" in row.inner_text()
    row.get_by_role("button", name="E-stop").click()
    page.wait_for_selector("#robots tbody tr:has-text('estopped')")
    _shot(page, "03-fleet-estopped")
    page.locator("#robots tbody tr", has_text="sim-sawyer-1").get_by_role(
        "button", name="Clear e-stop"
    ).click()
    page.wait_for_selector("#robots tbody tr:has-text('idle')")

    # -- launch an HG-DAgger run: first with errors shown next to the fields
    page.goto(f"{base}/runs")
    page.fill("input[name=name]", "sawyer dagger")
    page.select_option("select[name=algorithm]", "hg-dagger")
    page.fill("input[name=tasks]", "reach-v3, reach-v3")
    page.fill("input[name='robots.robot_type']", "metaworld-sawyer")
    page.fill("input[name='robots.count']", "0")
    page.click("#launch")
    tasks_err = page.locator(".field-error[data-field='tasks']")
    count_err = page.locator(".field-error[data-field='robots.count']")
    tasks_err.filter(has_text="listed twice").wait_for()
    assert "greater than or equal to 1" in count_err.inner_text()
    assert page.locator("input[name='robots.count']").get_attribute("class") == "invalid"
    _shot(page, "04-launch-errors")
    page.fill("input[name=tasks]", "reach-v3, push-v3")
    page.fill("input[name='robots.count']", "1")
    # SAC learns from the robots' reward and this robot declares none: refused by field.
    page.select_option("select[name=algorithm]", "sac")
    page.click("#launch")
    reward_err = page.locator(".field-error[data-field='reward.source']")
    reward_err.filter(has_text="sim-sawyer-1").wait_for()
    assert "reward.source: labels" in reward_err.inner_text()
    page.select_option("select[name=algorithm]", "hg-dagger")
    page.select_option("select[name='reward.source']", "labels")
    page.click("#launch")
    page.wait_for_url(f"{base}/runs/run-*")
    run_id = page.url.rsplit("/", 1)[1]
    run = store.get_run(run_id)
    assert run is not None and run.state == RunState.PENDING
    assert run.spec["tasks"] == ["reach-v3", "push-v3"]
    assert run.spec["buffer"]["min_size"] == 1  # the form's field, as the learner uses it
    assert run.spec["reward"]["source"] == "labels"
    page.wait_for_selector("#run-reward:has-text('labels')")

    # -- run detail: the success chart updates as the learner writes metrics
    page.wait_for_selector("#stream-status:has-text('connected')")
    chart = page.locator("#chart-success_rate")
    assert chart.get_attribute("data-points") == "0"
    with store.session() as s:
        db_run = s.get(Run, run_id)
        assert db_run is not None
        db_run.state = RunState.RUNNING  # what the real run manager would do
    page.wait_for_selector("#run-state:has-text('running')")
    for step in range(1, 4):
        insert_metrics(
            store,
            run_id,
            [
                {
                    "name": "success_rate",
                    "step": step * 100,
                    "value": 0.2 * step,
                    "task": "reach-v3",
                },
                {
                    "name": "success_rate",
                    "step": step * 100,
                    "value": 0.1 * step,
                    "task": "push-v3",
                },
                {"name": "loss", "step": step * 100, "value": 1.0 / step},
                {"name": "buffer_robot_steps", "step": step * 100, "value": 100.0 * step},
                {"name": "buffer_offline_steps", "step": step * 100, "value": 500.0},
                {"name": "policy_version", "step": step * 100, "value": step, "robot_id": robot.id},
            ],
        )
        page.wait_for_function(
            "n => Number(document.querySelector('#chart-success_rate').dataset.points) === n",
            arg=2 * step,
        )
    assert page.locator("#chart-loss").get_attribute("data-points") == "3"
    # The buffer chart keeps the robots' steps and the demonstrations (offline rows) apart.
    buffer_chart = page.locator("#chart-buffer_steps")
    assert buffer_chart.get_attribute("data-points") == "6"
    assert buffer_chart.get_attribute("data-series") == "buffer_robot_steps buffer_offline_steps"
    # every chart names both axes with their units
    assert chart.get_attribute("data-x-axis") == "policy version"
    assert chart.get_attribute("data-y-axis") == "success rate (0–1)"
    assert page.locator("#chart-loss").get_attribute("data-x-axis") == "learner updates"
    for canvas in page.locator("canvas[id^=chart-]").all():
        assert canvas.get_attribute("data-x-axis") and canvas.get_attribute("data-y-axis")
    page.select_option("#x-axis", "wall")
    assert chart.get_attribute("data-x-axis") == "wall time (s since the run's first point)"
    assert chart.get_attribute("data-points") == "6"
    time.sleep(0.2)  # let the canvas paint before the screenshot
    _shot(page, "05-run-live-charts")
    # Each evaluation point says who scored its episodes.
    store.record_event(
        "run.evaluated",
        run_id=run_id,
        policy_version=3,
        success_mean=0.5,
        source="robots",
        scored_by={"driver": 2, "operator": 4},
    )
    page.reload()
    page.wait_for_selector("#eval-events tbody tr:has-text('driver 2, operator 4')")
    page.select_option("#x-axis", "wall")

    # -- the robot joins the run: the run page lists it and its events, the fleet says so
    with store.session() as s:
        r = s.get(Robot, robot.id)
        assert r is not None
        r.stats = {"state": "running", "run_id": run_id, "control_loop_p99_ms": 6.1}
    store.record_event("robot.assigned", run_id=run_id, robot="sim-sawyer-1")
    store.record_event("robot.joined", run_id=run_id, robot="sim-sawyer-1")
    refused = add_robot(store, "sim-sawyer-2")
    with store.session() as s:
        r = s.get(Robot, refused)
        assert r is not None
        r.stats = {"state": "refused", "run_id": run_id, "refused": "action: 7 != 4"}
    store.record_event(
        "robot.refused", run_id=run_id, robot="sim-sawyer-2", reason="action: 7 != 4"
    )
    page.reload()
    joined = page.locator("#run-robot-table tbody tr", has_text="sim-sawyer-1")
    joined.wait_for()
    assert "assigned run " + run_id + " (running)" in joined.inner_text()
    assert "metaworld · scripted" in joined.inner_text()
    page.wait_for_selector("#robot-events tbody tr:has-text('robot.joined')")
    refusal = page.locator("#robot-events tbody tr", has_text="robot.refused")
    assert "sim-sawyer-2" in refusal.inner_text() and "action: 7 != 4" in refusal.inner_text()
    assert "1–3 of 3" in page.inner_text("nav.pager[data-for=robot-events]")
    _shot(page, "05b-run-robots")
    # a robot holding for a reset by hand: a Ready button, and the run's human cost table
    with store.session() as s:
        r = s.get(Robot, robot.id)
        assert r is not None
        r.stats = {
            "state": "resetting",
            "run_id": run_id,
            "human/reach-v3/takeover_s": 12.5,
            "human/reach-v3/episode_s": 1800.0,
            "human/reach-v3/autonomous_reset_s": 1800.0,
            "autonomous/reach-v3/successes": 5.0,
        }
    page.reload()
    held = page.locator("#run-robot-table tbody tr", has_text="sim-sawyer-1")
    held.locator("button", has_text="Ready").wait_for()
    cost = page.locator("#human-cost tbody tr", has_text="sim-sawyer-1")
    cost.wait_for()
    assert cost.inner_text().split("\t")[-4:] == ["1800.0", "5", "10.0", "5.0"]
    _shot(page, "05b2-run-human-cost")
    with store.session() as s:
        r = s.get(Robot, robot.id)
        assert r is not None
        r.stats = {"state": "running", "run_id": run_id, "control_loop_p99_ms": 6.1}
    page.goto(f"{base}/")
    row = page.locator("#robots tbody tr", has_text="sim-sawyer-1")
    row.wait_for()
    text = row.inner_text()
    assert f"assigned run {run_id} (running)" in text
    assert "metaworld · scripted" in text and "state (39)" in text and "action (4)" in text
    assert "cameras corner 64×64" in text and "80 Hz" in text
    other = page.locator("#robots tbody tr", has_text="sim-sawyer-2").inner_text()
    assert f"refused run {run_id}: action: 7 != 4" in other
    _shot(page, "05c-fleet-states")
    page.select_option("#fleet-filter select[name=state]", "refused")
    page.click("#fleet-filter button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#robots tbody tr').length === 1")
    assert "sim-sawyer-2" in page.inner_text("#robots tbody")
    page.goto(f"{base}/runs/{run_id}")
    page.wait_for_selector("#stream-status:has-text('connected')")

    # -- stop, then resume
    page.click("button[data-action=stop]")
    page.wait_for_selector("#run-state:has-text('stopped')")
    assert store.get_run(run_id).state == RunState.STOPPED  # type: ignore[union-attr]
    _shot(page, "06-run-stopped")
    page.click("button[data-action=resume]")
    page.wait_for_selector("#run-state:has-text('resuming')")
    assert store.get_run(run_id).state == RunState.RESUMING  # type: ignore[union-attr]
    _shot(page, "07-run-resumed")

    # -- the other pages render, and the audit log shows what happened; long lists come a
    # page at a time (a 10-minute demo publishes thousands of policy versions)
    with store.session() as s:
        s.add_all(
            PolicyVersion(run_id=run_id, version=v, learner_step=10 * v, sha256="ab" * 32)
            for v in range(1, 121)
        )
    page.goto(f"{base}/policies?run_id={run_id}")
    versions = "nav.pager[data-for=versions]"
    page.wait_for_selector(f"{versions}:has-text('1–50 of 120')")
    assert page.locator("#versions tbody tr").count() == 50
    assert page.locator("#versions tbody tr").first.inner_text().split("\t")[1] == "120"
    page.click(f"{versions} button:has-text('Older')")
    page.wait_for_selector(f"{versions}:has-text('51–100 of 120')")
    assert page.locator("#versions tbody tr").first.inner_text().split("\t")[1] == "70"
    page.click(f"{versions} button:has-text('Newer')")
    page.wait_for_selector(f"{versions}:has-text('1–50 of 120')")
    page.fill("#policy-filter input[name=min_version]", "7")
    page.fill("#policy-filter input[name=max_version]", "9")
    page.click("#policy-filter button[type=submit]")
    page.wait_for_selector(f"{versions}:has-text('1–3 of 3')")
    _shot(page, "08-policies")
    page.goto(f"{base}/audit?run_id={run_id}")
    page.wait_for_selector("#events tbody tr:has-text('run.stopped')")
    page.wait_for_selector("#events tbody tr:has-text('run.resuming')")
    _shot(page, "09-audit")
    page.goto(f"{base}/account")
    page.fill("#token-form input[name=name]", "ci")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#new-token", state="visible")
    _shot(page, "10-account")
    page.goto(f"{base}/users")
    page.wait_for_selector("#users tbody tr:has-text('operator')")
    _shot(page, "11-users")
    page.click("#logout")
    page.wait_for_url(f"{base}/login")

    with store.session() as s:
        # (the robot.* and run.evaluated events were written above, as the run driver would)
        actors = set(
            s.scalars(
                select(Event.actor).where(
                    Event.run_id == run_id,
                    ~Event.kind.startswith("robot."),
                    Event.kind != "run.evaluated",
                )
            )
        )
    assert actors == {"user:admin"}
    assert not js_errors, js_errors
    assert requested and all(u.startswith(base) for u in requested), [
        u for u in requested if not u.startswith(base)
    ]
