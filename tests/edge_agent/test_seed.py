"""The driver seed option: each simulated robot can replay its own goal sequence."""

from __future__ import annotations

import numpy as np

from edge_agent.build import AgentOptions, build_agent
from hal.drivers.metaworld import MetaWorldDriver
from robofleet.commands.edge import build_parser, options_from_args
from tests.fakes.settings import fast_edge


def _agent_goals(tmp_path, name: str, **kw) -> list[np.ndarray]:
    """Run two 2-step episodes offline; each episode's goal (the last 3 state floats)."""
    opts = AgentOptions(
        robot_name=name, tasks=["reach-v3"], driver="metaworld", operator="none",
        max_episode_steps=2, spool_dir=tmp_path / name, **kw,
    )  # fmt: skip
    built = build_agent(fast_edge(control_hz=1000.0), None, opts)
    goals: list[np.ndarray] = []
    try:
        for _ in range(2):
            built.agent.run(episodes=1)
            goals.append(built.agent.driver.get_observation()["observation.state"][-3:].copy())
    finally:
        built.close()
    return goals


def _driver_goals(seed: int) -> list[np.ndarray]:
    """The goals of the first two unseeded resets of a driver built with ``seed``."""
    d = MetaWorldDriver("reference", task="reach-v3", seed=seed)
    d.connect()
    try:
        return [d.reset()["observation.state"][-3:].copy() for _ in range(2)]
    finally:
        d.disconnect()


def test_seed_option_sets_the_goal_sequence_and_defaults_to_the_old_one(tmp_path):
    default = _agent_goals(tmp_path, "r-default")
    seeded = _agent_goals(tmp_path, "r-seeded", seed=1007)
    for got, want in zip(default, _driver_goals(0), strict=True):
        np.testing.assert_array_equal(got, want)  # unchanged behaviour: seeds from 0
    for got, want in zip(seeded, _driver_goals(1007), strict=True):
        np.testing.assert_array_equal(got, want)
    for a, b in zip(default, seeded, strict=True):
        assert not np.allclose(a, b), (a, b)  # other goal variations, not a replay


def test_cli_seed_flag_reaches_the_agent_options():
    assert options_from_args(build_parser().parse_args([])).seed == 0
    opts = options_from_args(build_parser().parse_args(["--robot", "r1", "--seed", "1000"]))
    assert opts.seed == 1000 and opts.robot_name == "r1"
