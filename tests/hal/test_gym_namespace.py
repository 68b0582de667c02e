"""A Gymnasium id whose namespace names the package that registers it (gym-hil's
``gym_hil/PandaPickCubeBase-v0``) works without the ``module:`` prefix: the driver imports the
package first (issue 19: ``Namespace gym_hil not found``). gym-hil itself is not installed in
the test environment, so a tiny package made here stands in for it: it registers one env
when imported, as gym-hil does."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal.drivers import make_driver

PACKAGE = "rf_namespace_envs"
ENV_ID = f"{PACKAGE}/Line-v0"

_INIT = f'''
import numpy as np
import gymnasium as gym
from gymnasium import spaces


class Line(gym.Env):
    metadata = {{"render_fps": 25, "render_modes": []}}

    def __init__(self):
        self.observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {{}}

    def step(self, action):
        return np.full(2, float(action[0]), np.float32), 0.0, False, False, {{}}


gym.register(id="{ENV_ID}", entry_point=Line, max_episode_steps=5)
'''


@pytest.fixture
def env_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package on sys.path that registers ``ENV_ID`` on import (and is forgotten after)."""
    import gymnasium as gym

    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "__init__.py").write_text(textwrap.dedent(_INIT))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PACKAGE
    sys.modules.pop(PACKAGE, None)
    gym.registry.pop(ENV_ID, None)


def test_the_namespace_package_is_imported_before_make(env_package: str) -> None:
    assert env_package not in sys.modules
    driver = make_driver("gymnasium", "line-1", env_id=ENV_ID)
    assert env_package in sys.modules
    assert driver.spec.robot_type == "rf_namespace_envs-line-v0"
    assert driver.spec.control_hz == 25 and driver.spec.max_episode_steps == 5
    assert driver.spec.observation_features["observation.state"].shape == (2,)
    driver.connect()
    try:
        assert driver.get_observation()["observation.state"].shape == (2,)
    finally:
        driver.disconnect()


def test_the_module_prefix_still_works(env_package: str) -> None:
    driver = make_driver("gymnasium", "line-2", env_id=f"{PACKAGE}:{ENV_ID}")
    assert driver.spec.action_dim == 1


def test_a_namespace_without_a_package_is_named() -> None:
    with pytest.raises(ValueError, match="rf_no_such_pkg"):
        make_driver("gymnasium", "nothing", env_id="rf_no_such_pkg/Thing-v0")


def test_a_namespace_package_that_fails_to_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rf_broken_envs").mkdir()
    (tmp_path / "rf_broken_envs" / "__init__.py").write_text("import rf_missing_simulator\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="rf_broken_envs.*rf_missing_simulator"):
            make_driver("gymnasium", "broken", env_id="rf_broken_envs/Thing-v0")
    finally:
        sys.modules.pop("rf_broken_envs", None)
