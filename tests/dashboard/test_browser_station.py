"""The operator station end to end in Debian's chromium (Playwright): two simulated Meta-World
robots with a camera (real edge agents over comms' real gRPC server, which the dashboard's
uvicorn reaches in the same process, as in ``robofleet cloud``) show their frames; a keyboard
takeover from the page moves one, its steps are stored as interventions, the page shows the
round trip; closing the tab holds the robot. The step schema has no column for who acted: a
stored intervention of a robot is the browser's because its remote operator counts exactly
those steps (``station/steps`` in its heartbeat statistics). The station's screenshot goes to
docs/figures/station.png (the README shows it)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from comms.cloud.step_sink import MemorySink
from edge_agent.build import AgentOptions, BuiltAgent, build_agent
from foundation.store.models import Run
from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.test_browser import ARGS, CHROMIUM, _shot
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.procs import wait_until
from tests.fakes.settings import fast_comms, fast_edge

FIGURE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "station.png"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _robot(cloud: Cloud[MemorySink], tmp: Path, name: str, seed: int) -> tuple[BuiltAgent, int]:
    opts = AgentOptions(
        robot_name=name,
        tasks=["reach-v3"],
        driver="metaworld",
        driver_options={"cameras": ["corner"], "image_size": [96, 96]},
        run_id=RUN,
        server=cloud.address,
        token=cloud.store.create_enrollment_token(timedelta(minutes=5)),
        operator="remote",
        max_episode_steps=200,
        seed=seed,
        spool_dir=tmp / name,
    )
    edge = fast_edge(control_hz=20.0, batch_max_steps=4, wait_for_first_weights=False)
    built = build_agent(edge, fast_comms(), opts)
    robot_id = json.loads((tmp / name / "credential.json").read_text())["robot_id"]
    return built, int(robot_id)


def test_station_shows_two_camera_robots_drives_one_and_holds_it_when_the_tab_closes(
    live_server: LiveServer, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    store = live_server.store
    with store.session() as s:
        s.add(Run(id=RUN, algorithm="hg_dagger"))
    sink = MemorySink()
    cloud = Cloud(store, sink)
    live_server.app.state.robot_control = cloud.server  # the cloud's comms server, in process
    robots = [_robot(cloud, tmp_path, f"sim-arm-{i}", i) for i in range(2)]
    store.lease_robots(RUN, [rid for _, rid in robots])
    threads = [threading.Thread(target=b.agent.run, daemon=True) for b, _ in robots]
    for t in threads:
        t.start()
    (driven, driven_id), (_, other_id) = robots
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            context = browser.new_context(viewport={"width": 1100, "height": 760})
            page = context.new_page()
            page.set_default_timeout(20_000)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{live_server.url}/station")
            page.fill("#username", "operator")
            page.fill("#password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(f"{live_server.url}/station")
            # both robots' frames are shown (decoded images), each with its state
            for rid in (driven_id, other_id):
                page.wait_for_function(
                    "id => { const i = document.querySelector("
                    "`.station-robot[data-robot-id='${id}'] img`);"
                    " return i && i.complete && i.naturalWidth === 96; }",
                    arg=str(rid),
                )
            page.wait_for_selector(
                f".station-robot[data-robot-id='{other_id}'][data-state=autonomous]"
            )
            assert page.is_visible("#station-help")  # the help requests' place, empty

            # take over the first robot: hold the deadman (Shift) and drive +x (D)
            page.click(f".station-robot[data-robot-id='{driven_id}']")
            steps_before = driven.agent.stats.interventions
            page.keyboard.down("Shift")
            page.keyboard.down("d")
            page.wait_for_selector(
                f".station-robot[data-robot-id='{driven_id}'][data-state=taken_over]"
            )
            wait_until(lambda: driven.agent.stats.interventions >= steps_before + 20, 30, "driven")
            page.wait_for_function(
                "() => Number(document.getElementById('drive-rtt-n').textContent) >= 10"
            )
            rtt_text = page.inner_text("#drive-rtt")
            assert rtt_text.endswith(" ms"), rtt_text
            page.screenshot(path=str(FIGURE))
            _shot(page, "station")
            assert not errors, errors
            # close the tab with the deadman still held: the robot holds
            context.close()
            browser.close()
        wait_until(lambda: driven.agent.heartbeat_state == "paused", 5, "the hold")
        time.sleep(0.1)  # a step under way when the hold came ends (with the safe hold)
        view = cloud.server.station_view(driven_id)
        assert view is not None and view.note in ("deadman released", "heartbeat lost")
        held_at = driven.agent.stats.steps
        time.sleep(0.5)
        assert driven.agent.stats.steps == held_at
        assert robots[1][0].agent.heartbeat_state == "running"  # the other one went on
        print(f"station round trip p50 from the page: {rtt_text}")
    finally:
        for b, _ in robots:
            b.agent.stop()
        for t in threads:
            t.join(30)
        for b, _ in robots:
            b.agent.uplink.wait_acked(30)
            b.close()
        cloud.close()
    browser_steps = driven.agent.report()["station/steps"]
    rows = [b for rid, b in sink.batches if rid == driven_id]
    flags = np.concatenate(
        [b.column("is_intervention").to_numpy(zero_copy_only=False) for b in rows]
    )
    actions = np.stack(
        np.concatenate([b.column("action").to_numpy(zero_copy_only=False) for b in rows])
    )
    # every stored intervention of the robot is a step the browser's person took
    assert flags.sum() >= 20 and flags.sum() == browser_steps
    assert (actions[flags][:, 0] > 0.9).sum() >= 20  # +x, as the key drove it
    other = [b for rid, b in sink.batches if rid == other_id]
    assert not any(b.column("is_intervention").to_numpy(zero_copy_only=False).any() for b in other)
