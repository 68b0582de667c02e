"""Meta-World driver: real MuJoCo physics with Meta-World's scripted experts."""

from __future__ import annotations

import numpy as np
import pytest

from hal.drivers.metaworld import DEFAULT_MAX_EPISODE_STEPS, MetaWorldDriver, expert_policy


@pytest.fixture
def sawyer():
    d = MetaWorldDriver("sawyer-0", tasks=["reach-v3", "pick-place-v3"])
    d.connect()
    yield d
    d.disconnect()


@pytest.mark.parametrize("task", ["reach-v3", "pick-place-v3"])
def test_expert_reaches_success(sawyer: MetaWorldDriver, task: str) -> None:
    act = expert_policy(task)
    obs = sawyer.reset(task=task, seed=7)
    while not sawyer.episode.done and not sawyer.episode.success:
        sawyer.send_action({"action": act(obs)})
        obs = sawyer.get_observation()
    assert sawyer.episode.success, (
        f"{task}: expert failed within {sawyer.episode.frame_index} steps"
    )
    assert sawyer.episode.task == task and not sawyer.episode.truncated


def test_random_actions_do_not_succeed_at_pick_place(sawyer: MetaWorldDriver) -> None:
    """The success flag is the env's, not a constant: zero actions never pick anything."""
    sawyer.reset(task="pick-place-v3", seed=7)
    for _ in range(30):
        sawyer.send_action(np.zeros(4, np.float32))
    assert not sawyer.episode.success


def test_task_switch_and_fixed_seeds() -> None:
    sawyer = MetaWorldDriver("switcher", tasks=["reach-v3", "door-open-v3"])
    sawyer.connect()
    a = sawyer.reset(task="reach-v3", seed=3)["observation.state"]
    b = sawyer.reset(task="door-open-v3", seed=3)["observation.state"]
    assert sawyer.episode.task == "door-open-v3"
    a2 = sawyer.reset(task="reach-v3", seed=3)["observation.state"]
    c = sawyer.reset(task="reach-v3", seed=4)["observation.state"]
    np.testing.assert_array_equal(a, a2)  # an evaluation configuration repeats exactly
    assert not np.allclose(a[-3:], c[-3:])  # another seed, another goal
    assert not np.allclose(a, b)
    with pytest.raises(ValueError, match="no task 'pick-place-v3'"):
        sawyer.reset(task="pick-place-v3")
    sawyer.disconnect()


def test_step_limit_default_and_configurable() -> None:
    assert MetaWorldDriver("d").spec.max_episode_steps == DEFAULT_MAX_EPISODE_STEPS == 500
    d = MetaWorldDriver("short", task="reach-v3", max_episode_steps=3)
    d.connect()
    try:
        d.reset(seed=1)
        for _ in range(3):
            d.send_action(np.zeros(4, np.float32))
        assert d.episode.truncated
    finally:
        d.disconnect()


def test_rendered_camera_shows_the_scene() -> None:
    d = MetaWorldDriver("cam", task="reach-v3", cameras=["corner", "topview"], image_size=(48, 64))
    d.connect()
    try:
        obs = d.reset(seed=0)
        for cam in ("corner", "topview"):
            img = obs[f"observation.images.{cam}"]
            assert img.shape == (48, 64, 3) and img.dtype == np.uint8
            assert img.std() > 5  # a scene, not a blank frame
        assert not np.array_equal(
            obs["observation.images.corner"], obs["observation.images.topview"]
        )
    finally:
        d.disconnect()


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match="unknown Meta-World v3 task"):
        MetaWorldDriver("x", task="reach-v2")
    with pytest.raises(ValueError, match="no scripted expert"):
        expert_policy("nope-v3")
    with pytest.raises(ValueError, match="max_episode_steps"):
        MetaWorldDriver("x", max_episode_steps=0)
    bad = MetaWorldDriver("x", cameras=["no-such-cam"])
    with pytest.raises(Exception, match="no camera 'no-such-cam'"):
        bad.connect()


def test_drivers_build_from_several_threads_at_once() -> None:
    """Meta-World draws goal lists from numpy's global random state; the driver serialises
    those builds, so concurrent drivers all connect and get the same goals as a serial build."""
    import threading

    from hal.drivers import metaworld as mw

    tasks = ["reach-v3", "push-v3", "pick-place-v3", "door-open-v3"]

    def first_state(task: str) -> np.ndarray:
        d = MetaWorldDriver(f"t-{task}", task=task)
        d.connect()
        try:
            return np.asarray(d.reset(seed=3)["observation.state"])
        finally:
            d.disconnect()

    mw._build_mt1.cache_clear()  # every thread must build its own list, at the same time
    states: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(tasks))

    def build(task: str) -> None:
        try:
            barrier.wait(30)
            states[task] = first_state(task)
        except BaseException as exc:  # collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(states) == sorted(tasks)
    mw._build_mt1.cache_clear()
    for task in tasks:  # the same goals as lists built one at a time
        np.testing.assert_array_equal(states[task], first_state(task), err_msg=task)
