"""Samplers: true successors, episode boundaries, truncation, priorities, mixes, state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer import (
    CacheAwareSampler,
    InterventionSampler,
    MixSampler,
    PrioritizedSampler,
    RecencySampler,
    UniformSampler,
)
from buffer.sampling.prioritized import SumTree
from buffer.sampling.view import SamplingView
from tests.buffer.helpers import episodes, final_value, obs_value, open_buffer, step


def _interleave(per_robot: list[list[dict]], chunk: int) -> list[list[dict]]:
    """Batches alternating between robots, like concurrent uplinks."""
    batches = []
    pos = [0] * len(per_robot)
    while any(p < len(r) for p, r in zip(pos, per_robot, strict=True)):
        for i, r in enumerate(per_robot):
            if pos[i] < len(r):
                batches.append(r[pos[i] : pos[i] + chunk])
                pos[i] += chunk
    return batches


def _check_transitions(b: dict[str, np.ndarray]) -> None:
    robots = np.array([int(r.split("-")[1]) for r in b["robot_id"]])
    seq = b["observation.state"][:, 0].astype(np.int64) - robots * 100_000
    done = b["terminated"] | b["truncated"]
    want_next = np.where(
        done,
        [final_value(r, s) for r, s in zip(robots, seq, strict=True)],
        [obs_value(r, s + 1) for r, s in zip(robots, seq, strict=True)],
    )
    np.testing.assert_array_equal(b["next.observation.state"][:, 0], want_next.astype(np.float32))
    # The payload of every column belongs to the same step.
    np.testing.assert_array_equal(b["action"][:, 0], b["observation.state"][:, 0])
    np.testing.assert_array_equal(
        b["observation.images.front"][:, 0, 0, 0], (seq % 251).astype(np.uint8)
    )
    assert (b["truncated"] & b["terminated"]).sum() == 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=5), min_size=1, max_size=3),
    chunk=st.integers(1, 7),
    open_tail=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    length=st.integers(1, 6),
    history=st.integers(0, 3),
)
def test_property_successors_boundaries_truncation(
    tmp_path_factory, lengths, chunk, open_tail, seed, length, history
) -> None:
    """For any interleaving of robots' episodes (terminated or truncated), sampled transitions
    pair each step with its true successor or its real final observation, and sequences never
    cross an episode boundary; an unfinished episode's last step is never sampled."""
    per_robot = []
    for r, ls in enumerate(lengths):
        recs = episodes(r, ls)
        seq = len(recs)
        recs += [step(r, seq + k, len(ls), k) for k in range(open_tail)]  # still running
        per_robot.append(recs)
    path = tmp_path_factory.mktemp("s")
    rng = np.random.default_rng(seed)
    with open_buffer(path / "b", segment_target_bytes=700) as buf:
        for batch in _interleave(per_robot, chunk):
            buf.append(batch)
        n_trans = sum(sum(ls) for ls in lengths) + sum(max(open_tail - 1, 0) for _ in lengths)
        assert len(buf) == n_trans
        b = buf.sample(64, rng=rng)
        _check_transitions(b)
        ep_len = {(r, e): n for r, ls in enumerate(lengths) for e, n in enumerate(ls)}
        for r_id, e, f in zip(b["robot_id"], b["episode_index"], b["frame_index"], strict=True):
            n = ep_len.get((int(r_id.split("-")[1]), int(e)))
            if n is None:  # the open episode: its last step has no successor yet
                assert f < open_tail - 1
        s = buf.sample_sequences(16, length, history=history, rng=rng)
        T = history + length
        assert s["mask"].shape == (16, T)
        assert s["mask"][:, history].all()
        for i in range(16):
            ep = s["episode_index"][i]
            fr = s["frame_index"][i]
            valid = s["mask"][i]
            assert (ep == ep[history]).all()  # padding repeats a step of the same episode
            vf = fr[valid]
            assert (np.diff(vf) == 1).all()  # consecutive frames where valid
            # padded positions repeat the nearest valid frame
            assert (fr[~valid & (np.arange(T) < history)] == vf[0]).all()
            assert (fr[~valid & (np.arange(T) > history)] == vf[-1]).all()
            last_done = s["terminated"][i][valid][-1] or s["truncated"][i][valid][-1]
            if not valid[-1]:
                # A sequence ends early only at a done step or at the newest step of a
                # still-running episode (its successor is not stored yet).
                robot = int(s["robot_id"][i][history].split("-")[1])
                open_ep = ep_len.get((robot, int(ep[history]))) is None
                assert last_done or (open_ep and vf[-1] == open_tail - 2)
            assert s["bootstrap_terminated"][i] == s["terminated"][i][valid][-1]


def test_truncated_step_keeps_real_final_observation(tmp_path) -> None:
    recs = episodes(0, [3, 3])  # episode 1 ends truncated
    with open_buffer(tmp_path / "b") as buf:
        buf.append(recs)
        b = buf.read_transitions(np.array([2, 5]))
        assert b["terminated"].tolist() == [True, False]
        assert b["truncated"].tolist() == [False, True]
        assert b["next.observation.state"][:, 0].tolist() == [final_value(0, 2), final_value(0, 5)]
        assert (b["next.observation.images.front"] == 255).all()


def test_recency_and_intervention_samplers(tmp_path) -> None:
    recs = []
    seq = 0
    for e in range(20):
        for f in range(10):
            recs.append(step(0, seq, e, f, terminated=f == 9, intervention=e % 4 == 0))
            seq += 1
    rng = np.random.default_rng(0)
    with open_buffer(tmp_path / "b") as buf:
        buf.append(recs)
        b = buf.sample(500, RecencySampler(30), rng=rng)
        assert b["index"].min() >= 170
        b = buf.sample(300, InterventionSampler(), rng=rng)
        assert b["is_intervention"].all()
        b = buf.sample(4000, InterventionSampler(weight=3.0), rng=rng)
        share = b["is_intervention"].mean()
        # 50 of 200 steps are interventions: p = 3*50 / (3*50 + 150) = 0.5
        assert 0.45 < share < 0.55
        b = buf.sample(4000, UniformSampler(), rng=rng)
        assert 0.2 < b["is_intervention"].mean() < 0.3


def test_sum_tree_proportional() -> None:
    t = SumTree(5)
    t.set(np.arange(5), np.array([1.0, 0.0, 3.0, 0.0, 6.0]))
    assert t.total == pytest.approx(10.0)
    rng = np.random.default_rng(0)
    leaf = t.find(rng.random(100_000) * t.total)
    counts = np.bincount(leaf, minlength=5) / 100_000
    np.testing.assert_allclose(counts, [0.1, 0, 0.3, 0, 0.6], atol=0.01)
    t.grow(100)
    assert t.total == pytest.approx(10.0)


def test_prioritized_sampler_updates_and_state_roundtrip(tmp_path) -> None:
    rng = np.random.default_rng(1)
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [10] * 10))
        ps = PrioritizedSampler(alpha=1.0, beta=1.0)
        b = buf.sample(64, ps, rng=rng)
        assert b["weight"].max() == pytest.approx(1.0)
        rows = np.arange(100)
        ps.update_priorities(rows, np.where(rows == 42, 99.0, 1.0))  # P(42) = 1/2
        b = buf.sample(1000, ps, rng=rng)
        hit = b["index"] == 42
        assert 0.45 < hit.mean() < 0.55
        # Importance weights (N P)^-1: row 42 is 99x as likely, so weighs 1/99 of the others.
        assert b["weight"][~hit].max() == pytest.approx(1.0)
        assert b["weight"][hit].max() == pytest.approx(1 / 99, rel=1e-3)
        state = ps.state_dict()
        restored = PrioritizedSampler()
        restored.load_state_dict(state)
        np.testing.assert_array_equal(restored.tree.leaves(), ps.tree.leaves())
        b2 = buf.sample(1000, restored, rng=np.random.default_rng(5))
        assert 0.45 < (b2["index"] == 42).mean() < 0.55
        with pytest.raises(ValueError, match="finite"):
            ps.update_priorities(np.array([1]), np.array([np.nan]))
        # New data gets the highest priority seen so far.
        buf.append(episodes(0, [10], seq0=100, ep0=10))
        buf.sample(8, ps, rng=rng)
        assert ps.tree.leaves()[105] == pytest.approx(ps.tree.leaves()[42])


def test_cache_aware_and_hot_only(tmp_path) -> None:
    rng = np.random.default_rng(2)
    with open_buffer(
        tmp_path / "b", segment_target_bytes=1200, memory_budget_bytes=6000, prefetch=False
    ) as buf:
        for e in range(30):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        buf.flush()
        hot = [(c.first_row, c.end) for c in buf.storage.chunks if c.hot]
        cold = [c for c in buf.storage.chunks if not c.hot]
        assert cold, "the budget must push segments out of RAM"
        b = buf.sample(200, UniformSampler(hot_only=True), rng=rng)
        assert all(any(lo <= r < hi for lo, hi in hot) for r in b["index"])
        _check_transitions(b)
        b = buf.sample(200, CacheAwareSampler(hot_share=0.5), rng=rng)
        in_hot = np.array([any(lo <= r < hi for lo, hi in hot) for r in b["index"]])
        assert in_hot.mean() >= 0.5
        _check_transitions(b)


def test_mix_sampler_fixed_and_adaptive(tmp_path) -> None:
    rng = np.random.default_rng(3)
    with open_buffer(tmp_path / "old") as old:
        old.append(
            episodes(0, [10] * 5, task="reach") + episodes(0, [10] * 5, seq0=50, ep0=5, task="push")
        )
    with open_buffer(tmp_path / "new") as buf:
        buf.append(
            episodes(1, [10] * 5, task="reach") + episodes(1, [10] * 5, seq0=50, ep0=5, task="push")
        )
        view = buf.mount(tmp_path / "old")
        assert len(view) == 100
        b = buf.sample(2000, MixSampler(0.5), rng=rng)
        assert 0.45 < (b["source"] == 0).mean() < 0.55  # RLPD 50/50
        assert set(b["robot_id"][b["source"] == 1]) == {"robot-0"}
        _check_transitions(b)
        mix = MixSampler({"reach": 1.0, "push": 0.0}, adaptive=True, floor=0.05)
        for _ in range(20):
            mix.report_success("reach", 1.0)
            mix.report_success("push", 0.0)
        b = buf.sample(2000, mix, rng=rng)
        push = b["task"] == "push"
        assert push.mean() > 0.85  # the failing task gets most samples
        assert (b["source"][push] == 1).all()  # push: offline only
        assert (b["source"][~push] == 0).all()  # reach: online only
        restored = MixSampler(adaptive=True)
        restored.load_state_dict(mix.state_dict())
        assert restored.success == mix.success


def test_mix_sampler_draws_exact_halves_online_then_offline(tmp_path) -> None:
    """RLPD's symmetric sampling with mounted prior data: round(B / 2) rows from the window,
    the rest from the mount, online part first."""
    with open_buffer(tmp_path / "prior") as prior:
        prior.append(episodes(0, [10] * 5))
    with open_buffer(tmp_path / "online") as buf:
        buf.append(episodes(1, [10] * 5))
        buf.mount(tmp_path / "prior")
        for seed in range(5):
            b = buf.sample(10, MixSampler(0.5), rng=np.random.default_rng(seed))
            assert b["source"].tolist() == [0] * 5 + [1] * 5
            assert b["robot_id"].tolist() == ["robot-1"] * 5 + ["robot-0"] * 5
            _check_transitions(b)


def test_mix_sampler_prior_from_operator_steps_mounts_or_both(tmp_path) -> None:
    """The prior side: the window's operator-labelled steps (HIL-SERL's demonstrations stored
    beside online data), the mounted views, or both; the online side is then autonomous."""
    rng = np.random.default_rng(4)
    with open_buffer(tmp_path / "prior") as prior:
        prior.append(episodes(0, [10] * 4))
    with open_buffer(tmp_path / "online") as buf:
        buf.append(
            episodes(1, [10] * 3, task="reach")
            + episodes(1, [10] * 3, seq0=30, ep0=3, task="push", intervention=True)
        )
        b = buf.sample(64, MixSampler(0.25, prior="interventions"), rng=rng)
        assert int((~b["is_intervention"]).sum()) == 16 and (b["source"] == 0).all()
        buf.mount(tmp_path / "prior")
        b = buf.sample(64, MixSampler(0.25, prior="interventions"), rng=rng)
        assert (b["source"] == 0).all()  # the mount is not its prior
        b = buf.sample(2000, MixSampler(0.5, prior="both"), rng=rng)
        online = (b["source"] == 0) & ~b["is_intervention"]
        assert online.sum() == 1000
        # The prior half splits by size: 30 operator steps here, 40 mounted rows.
        assert 0.38 < (b["source"][~online] == 0).mean() < 0.48
        assert (b["robot_id"][b["source"] == 1] == "robot-0").all()
        _check_transitions(b)
        per_task = MixSampler({"reach": 1.0, "push": 0.0}, prior="interventions")
        b = buf.sample(200, per_task, rng=rng)
        assert (b["is_intervention"] == (b["task"] == "push")).all()
        assert set(b["task"]) == {"reach", "push"}


def test_mix_sampler_one_empty_side_gives_the_whole_batch_and_none_raises(tmp_path) -> None:
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [10] * 3, intervention=True))
        b = buf.sample(32, MixSampler(0.5, prior="interventions"), rng=np.random.default_rng(0))
        assert b["is_intervention"].all()  # no autonomous step yet: all from the prior
        empty = SamplingView(buf, 0, 0, [])
        with pytest.raises(ValueError, match="nothing to sample"):
            MixSampler(prior="interventions").sample_indices(empty, 8, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"online_fraction": 1.5}, "online_fraction"),
        ({"online_fraction": {"reach": -0.1}}, "online_fraction"),
        ({"prior": "demos"}, "prior"),
    ],
)
def test_mix_sampler_refuses_bad_shares_and_priors_by_name(kwargs, what) -> None:
    with pytest.raises(ValueError, match=what):
        MixSampler(**kwargs)
