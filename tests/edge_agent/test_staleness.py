"""Weight-swap timing and the staleness figures the agent reports (version_lag, apply_delay)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edge_agent.config import EdgeSettings
from edge_agent.weights import StagedWeights
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge


class OfferAtStep(PointRobot):
    """Offers version ``v`` to the agent's weight slot right after action ``at[v]`` is sent,
    so the tests know exactly when each version became available."""

    def __init__(self, staged: StagedWeights, at: dict[int, int], episode_steps: int) -> None:
        super().__init__(episode_steps=episode_steps)
        self.staged = staged
        self.at = at
        self.total = 0

    def send_action(self, action: Any) -> dict[str, np.ndarray]:
        out = super().send_action(action)
        self.total += 1
        for v, step in self.at.items():
            if step == self.total:
                self.staged.offer(v, {"bias": torch.full((4,), v / 1000.0)})
        return out


def run(tmp_path, apply_at: str, every: int = 25):
    staged = StagedWeights()
    staged.offer(1, {"bias": torch.full((4,), 0.001)})
    driver = OfferAtStep(staged, {2: 3, 3: 12}, episode_steps=10)
    settings = fast_edge(
        control_hz=1000.0, weight_apply_at=apply_at, weight_apply_every_steps=every
    )
    agent = make_agent(tmp_path, driver, BiasPolicy(), weights=staged, settings=settings)
    agent.run(episodes=2)
    agent.uplink.flush()
    rows = spooled_rows(agent.uplink.spool)
    return agent, np.asarray(rows.column("policy_version").to_pylist())


def test_episode_end_apply_acts_stale_until_the_next_episode(tmp_path):
    agent, versions = run(tmp_path, "episode_end")
    # v2 arrives after step 3 but waits for episode 1; v3 (after step 12) never applies.
    assert versions.tolist() == [1] * 10 + [2] * 10
    # Steps acted while a newer version sat on the robot: 4..10 (v2) and 13..20 (v3).
    r = agent.report()
    assert agent.stats.stale_steps == 7 + 8
    assert r["version_lag_mean"] == (7 + 8) / 20 and r["version_lag_max"] == 1
    # v2 waited from step 4 to episode 1's start: at least 6 periods of 1 ms
    assert r["apply_delay_max_s"] >= 0.005 and r["apply_delay_mean_s"] > 0


def test_chunk_boundary_apply_acts_on_the_newest_version_at_every_step(tmp_path):
    agent, versions = run(tmp_path, "chunk_boundary")
    assert versions.tolist() == [1] * 3 + [2] * 9 + [3] * 8
    assert agent.stats.stale_steps == 0 and agent.report()["version_lag_mean"] == 0


def test_every_n_steps_applies_only_on_its_grid(tmp_path):
    agent, versions = run(tmp_path, "every_n_steps", every=4)
    # Boundaries at frames 0, 4, 8 of each episode: v2 (after step 3) applies at frame 4,
    # v3 (after step 12, i.e. frame 1 of episode 1) at frame 4 of episode 1 (step 15).
    assert versions.tolist() == [1] * 4 + [2] * 10 + [3] * 6
    # Step 4 acted with v1 while v2 waited for frame 4; steps 13, 14 with v2 while v3 waited.
    assert agent.stats.stale_steps == 1 + 2


def test_no_episode_starts_before_the_first_version_arrives(tmp_path):
    import threading
    import time

    staged = StagedWeights()
    driver = PointRobot(episode_steps=5)
    agent = make_agent(tmp_path, driver, BiasPolicy(), weights=staged)
    runner = threading.Thread(target=agent.run, kwargs={"episodes": 1})
    runner.start()
    time.sleep(0.3)
    assert driver.sent == [] and agent.stats.steps == 0  # the random init never acts
    staged.offer(4, {"bias": torch.full((4,), 0.004)})
    runner.join(10)
    assert not runner.is_alive()
    agent.uplink.flush()
    rows = spooled_rows(agent.uplink.spool)
    assert rows.column("policy_version").to_pylist() == [4] * 5
    assert agent.report()["weights_wait_s"] >= 0.3


def test_boundary_settings_are_validated():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="weight_apply_at"):
        EdgeSettings(weight_apply_at="whenever")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="weight_apply_every_steps"):
        EdgeSettings(weight_apply_every_steps=0)
