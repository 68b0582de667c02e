"""The control loop: what each stored row says, flag precedence, episodes, weight swaps."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from edge_agent.core import ControlledRobot
from edge_agent.episodes import MarkOutbox
from edge_agent.operators import NoOperator
from edge_agent.weights import StagedWeights
from tests.edge_agent.helpers import BiasPolicy, FixedOperator, make_agent, spooled_rows
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge


def bias_of(versions: np.ndarray) -> np.ndarray:
    """The action BiasPolicy produces at each version (-1: the untrained zeros)."""
    return np.where(versions < 0, 0.0, versions / 1000.0)


def run_and_rows(agent, episodes=1):
    agent.run(episodes=episodes)
    agent.uplink.flush()
    return spooled_rows(agent.uplink.spool)


# -- driver contract: the fake robot behaves like hal's real driver ------------------


@pytest.fixture(params=["fake", "metaworld"])
def any_driver(request):
    if request.param == "fake":
        return PointRobot(episode_steps=5)
    from hal.drivers.metaworld import MetaWorldDriver

    return MetaWorldDriver("contract-robot", task="reach-v3", max_episode_steps=5)


def test_driver_contract(any_driver):
    d = any_driver
    assert isinstance(d, ControlledRobot)
    assert set(d.action_features) == {"action"}
    d.connect()
    obs = d.reset(task="reach-v3")
    for key, feat in d.observation_features.items():
        assert obs[key].shape == tuple(feat["shape"])
    out = d.send_action({"action": np.full(4, 5.0, np.float32)})
    assert np.all(out["action"] <= 1.0)  # what was really sent: clipped
    for _ in range(4):
        d.send_action({"action": np.zeros(4, np.float32)})
    assert d.episode.truncated and not d.episode.terminated
    assert isinstance(d.episode.reward, float)
    d.disconnect()


# -- intervention flag precedence ------------------------------------------------------------


@pytest.mark.parametrize(("source", "env"), [(True, False), (False, True)])
def test_source_flag_reaches_the_row_whatever_the_env_says(tmp_path, source, env):
    op_action = np.array([0.5, -0.5, 0.25, 1.0], np.float32)
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=6, env_intervention=env),
        BiasPolicy(),
        operator=FixedOperator(source, op_action),
    )
    rows = run_and_rows(agent)
    assert rows.num_rows == 6
    assert rows.column("is_intervention").to_pylist() == [source] * 6
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    expected = op_action if source else np.zeros(4, np.float32)
    assert np.allclose(executed, expected)
    # The novice's proposal (zeros) and the operator's action are both kept; the buffer
    # stores an absent one as the executed action.
    proposed = np.stack(rows.column("action.policy").to_numpy(zero_copy_only=False))
    assert np.allclose(proposed, 0.0)
    operator = np.stack(rows.column("action.operator").to_numpy(zero_copy_only=False))
    assert np.allclose(operator, expected)


def test_without_a_source_the_robots_own_device_may_claim_the_step(tmp_path):
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=4, env_intervention=True),
        BiasPolicy(),
        operator=NoOperator(),
    )
    rows = run_and_rows(agent)
    assert rows.column("is_intervention").to_pylist() == [True] * 4


# -- rows, episodes, seq -----------------------------------------------------------------------


def test_rows_carry_every_buffer_field_and_the_final_observation(tmp_path):
    robot = PointRobot(episode_steps=5)
    agent = make_agent(tmp_path, robot, BiasPolicy(), tasks=("reach-v3", "push-v3"))
    rows = run_and_rows(agent, episodes=2)
    assert rows.num_rows == 10
    assert rows.column("seq").to_pylist() == list(range(10))
    assert rows.column("episode_index").to_pylist() == [0] * 5 + [1] * 5
    assert rows.column("frame_index").to_pylist() == list(range(5)) * 2
    assert rows.column("task").to_pylist() == ["reach-v3"] * 5 + ["push-v3"] * 5
    assert set(rows.column("robot_id").to_pylist()) == {"robot-1"}
    assert rows.column("truncated").to_pylist() == ([False] * 4 + [True]) * 2
    ts = rows.column("timestamp").to_pylist()
    assert ts[0] == 0.0 and all(b > a for a, b in zip(ts[:4], ts[1:5], strict=True))
    final = rows.column("next.observation.state").to_pylist()
    assert [f is not None for f in final] == ([False] * 4 + [True]) * 2
    # the final observation is the robot's state after the last action
    last = np.frombuffer(final[9], np.float32)
    assert np.allclose(last, robot.pos)


def test_seq_and_episode_index_survive_an_agent_restart(tmp_path):
    agent = make_agent(tmp_path, PointRobot(episode_steps=3), BiasPolicy())
    run_and_rows(agent, episodes=2)
    agent.uplink.close()
    again = make_agent(tmp_path, PointRobot(episode_steps=3), BiasPolicy())
    rows = run_and_rows(again, episodes=1)
    assert rows.column("seq").to_pylist() == list(range(9))
    assert rows.column("episode_index").to_pylist()[-3:] == [2, 2, 2]


def test_stop_mid_episode_closes_it_as_truncated(tmp_path):
    robot = PointRobot(episode_steps=10_000)
    agent = make_agent(tmp_path, robot, BiasPolicy(), settings=fast_edge(control_hz=100.0))
    t = threading.Thread(target=agent.run)
    t.start()
    time.sleep(0.3)
    agent.stop()
    t.join(10)
    rows = spooled_rows(agent.uplink.spool)
    assert rows.num_rows >= 2
    trunc = rows.column("truncated").to_pylist()
    assert trunc[-1] is True and not any(trunc[:-1])
    assert rows.column("next.observation.state")[rows.num_rows - 1].as_py() is not None


def test_rerecord_discards_the_held_episode_and_reuses_its_index(tmp_path):
    class RerecordOnce(FixedOperator):
        def __init__(self):
            super().__init__(False)
            self.n = 0

        def step(self, observation, proposed):
            out = super().step(observation, proposed)
            self.n += 1
            if self.n == 2:
                out.command = "rerecord"
            return out

    settings = fast_edge(control_hz=200.0, episode_commit="episode_end")
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=4),
        BiasPolicy(),
        operator=RerecordOnce(),
        settings=settings,
    )
    rows = run_and_rows(agent, episodes=2)
    assert agent.stats.discarded_episodes == 1
    # Only the complete episodes, two of them: the discarded one does not count (issue 16).
    assert rows.num_rows == 8
    assert rows.column("episode_index").to_pylist() == [0] * 4 + [1] * 4
    assert rows.column("seq").to_pylist() == list(range(8))
    # Nothing of it left the robot: nothing to tell but the kept episodes' outcomes.
    assert [(m.episode_index, m.kind) for m in agent.marks.pending()] == [
        (0, "failure"),
        (1, "failure"),
    ]


def test_operator_label_ends_the_episode(tmp_path):
    class SayDone(FixedOperator):
        def step(self, observation, proposed):
            out = super().step(observation, proposed)
            out.command = "success"
            return out

    agent = make_agent(
        tmp_path, PointRobot(episode_steps=50), BiasPolicy(), operator=SayDone(False)
    )
    rows = run_and_rows(agent)
    assert rows.num_rows == 1 and rows.column("terminated").to_pylist() == [True]
    assert agent.stats.labels["success"] == 1
    # The kept episode's outcome waits in the durable outbox for the cloud's buffer.
    (mark,) = agent.marks.pending()
    assert (mark.episode_index, mark.kind, mark.reason) == (0, "success", "SayDone")
    assert [m.kind for m in MarkOutbox(agent.uplink.spool.directory).pending()] == ["success"]


def test_a_failure_verdict_ends_the_episode_truncated_not_terminated(tmp_path):
    """A failed attempt is no absorbing state: the step is truncated, so SAC bootstraps."""

    class SayFailed(FixedOperator):
        def step(self, observation, proposed):
            out = super().step(observation, proposed)
            out.command = "failure"
            return out

    agent = make_agent(
        tmp_path, PointRobot(episode_steps=50), BiasPolicy(), operator=SayFailed(False)
    )
    rows = run_and_rows(agent)
    assert rows.num_rows == 1
    assert rows.column("terminated").to_pylist() == [False]
    assert rows.column("truncated").to_pylist() == [True]
    (mark,) = agent.marks.pending()
    assert (mark.episode_index, mark.kind) == (0, "failure")


# -- weights -------------------------------------------------------------------------------


def test_weight_swap_during_a_running_loop_is_atomic_at_episode_end(tmp_path):
    staged = StagedWeights()
    policy = BiasPolicy()
    settings = fast_edge(control_hz=400.0, weight_apply_at="episode_end")
    agent = make_agent(
        tmp_path, PointRobot(episode_steps=15), policy, weights=staged, settings=settings
    )
    done = threading.Event()

    def publish():
        v = 0
        while not done.is_set():
            v += 1
            staged.offer(v, {"bias": torch.full((4,), v / 1000.0)})
            time.sleep(0.003)

    pub = threading.Thread(target=publish)
    pub.start()
    try:
        rows = run_and_rows(agent, episodes=6)
    finally:
        done.set()
        pub.join()
    versions = np.asarray(rows.column("policy_version").to_pylist())
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    # Every action is exactly the one its tagged version produces ...
    assert np.allclose(executed, bias_of(versions)[:, None], atol=1e-6)
    # ... and each episode ran one version from its first step to its last.
    eps = np.asarray(rows.column("episode_index").to_pylist())
    for e in np.unique(eps):
        assert len(set(versions[eps == e])) == 1
    assert len(set(versions)) >= 3
    assert agent.stats.weight_swaps == len(set(versions.tolist()) - {-1})


def test_weight_swap_at_chunk_boundaries_only(tmp_path):
    staged = StagedWeights()
    policy = BiasPolicy(chunk=4)
    settings = fast_edge(control_hz=400.0, weight_apply_at="chunk_boundary")
    agent = make_agent(
        tmp_path, PointRobot(episode_steps=40), policy, weights=staged, settings=settings
    )
    done = threading.Event()

    def publish():
        v = 0
        while not done.is_set():
            v += 1
            staged.offer(v, {"bias": torch.full((4,), v / 1000.0)})
            time.sleep(0.002)

    pub = threading.Thread(target=publish)
    pub.start()
    try:
        rows = run_and_rows(agent, episodes=2)
    finally:
        done.set()
        pub.join()
    versions = np.asarray(rows.column("policy_version").to_pylist())
    frames = np.asarray(rows.column("frame_index").to_pylist())
    changes = np.flatnonzero(np.diff(versions) != 0) + 1
    assert changes.size >= 3
    assert np.all(frames[changes] % 4 == 0)  # only where a new chunk starts
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed, bias_of(versions)[:, None], atol=1e-6)


def test_weights_that_do_not_fit_keep_the_running_version(tmp_path):
    staged = StagedWeights()
    policy = BiasPolicy()
    agent = make_agent(tmp_path, PointRobot(episode_steps=3), policy, weights=staged)
    staged.offer(1, {"bias": torch.full((4,), 0.5)})
    run_and_rows(agent)
    staged.offer(2, {"bias": torch.zeros(7)})  # wrong shape
    rows = run_and_rows(agent)
    assert agent.applied_version == 1
    assert agent.stats.weight_errors == 1
    assert rows.column("policy_version").to_pylist()[-3:] == [1, 1, 1]
    assert torch.allclose(policy.bias, torch.full((4,), 0.5))


def test_a_step_the_buffer_would_refuse_is_dropped_counted_and_leaves_no_seq_gap(tmp_path):
    class GlitchyRobot(PointRobot):
        """A sensor glitch: NaN in the observation at one step."""

        def _get_observation(self):
            obs = super()._get_observation()
            if self.episode.frame_index == 3:
                obs["observation.state"][1] = np.nan
            return obs

    agent = make_agent(tmp_path, GlitchyRobot(episode_steps=6), BiasPolicy())
    rows = run_and_rows(agent)
    assert agent.uplink.stats.invalid == 1
    assert agent.report()["invalid_steps"] == 1.0
    assert rows.column("frame_index").to_pylist() == [0, 1, 2, 4, 5]
    assert rows.column("seq").to_pylist() == list(range(5))


def test_heartbeats_carry_loop_statistics_and_the_applied_version(tmp_path):
    beats = []
    staged = StagedWeights()
    staged.offer(3, {"bias": torch.zeros(4)})
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=30),
        BiasPolicy(),
        weights=staged,
        settings=fast_edge(control_hz=100.0, heartbeat_interval_s=0.05),
    )
    agent.heartbeat = lambda state, version, stats: beats.append((state, version, dict(stats)))
    agent.run(episodes=1)
    assert len(beats) >= 3
    assert any(state == "running" for state, _, _ in beats)
    state, version, stats = beats[-1]
    assert state == "stopped" and version == 3
    assert stats["steps"] == 30.0 and stats["latency_p99_ms"] >= stats["latency_p50_ms"] > 0
    assert stats["overruns"] >= 0 and 0 < stats["loop_hz"] <= 110
