"""Reuse across runs: mount earlier data as offline data, restore sampler state."""

from __future__ import annotations

import numpy as np
import pytest

from buffer import MixSampler, PrioritizedSampler, ReplayBuffer
from foundation.rows import RowFilter
from tests.buffer.helpers import episodes, open_buffer


def _fill_old(path) -> None:
    with open_buffer(path) as old:
        old.append(episodes(0, [5] * 4, task="reach", policy_version=1, run="run-old"))
        old.append(
            episodes(1, [5] * 4, task="push", policy_version=2, intervention=True, run="run-old")
        )
        old.append(episodes(2, [5] * 2, task="push", policy_version=3, run="run-old"))


def test_mount_filters_without_copying(tmp_path) -> None:
    _fill_old(tmp_path / "old")
    size_before = sum(p.stat().st_size for p in (tmp_path / "old").iterdir())
    with open_buffer(tmp_path / "new") as buf:
        buf.append(episodes(5, [5] * 2, run="run-new"))
        assert len(buf.mount(tmp_path / "old", RowFilter(tasks=("push",)))) == 30
        assert len(buf.mount(tmp_path / "old", RowFilter(robot_ids=("robot-0",)))) == 20
        assert len(buf.mount(tmp_path / "old", RowFilter(policy_versions=(2, 3)))) == 30
        assert len(buf.mount(tmp_path / "old", RowFilter(policy_versions=[1]))) == 20
        v = buf.mount(tmp_path / "old", RowFilter(tasks=("push",), interventions_only=True))
        assert len(v) == 20
        b = buf.read_transitions(np.arange(buf.visible))
        assert set(b["robot_id"]) == {"robot-5"}
        out = v.buffer.read_transitions(v.rows)
        assert out["is_intervention"].all() and set(out["task"]) == {"push"}
        # Nothing copied into the new directory; the old one is untouched.
        assert not any(
            p.name.startswith("seg") and "old" in p.name for p in (tmp_path / "new").iterdir()
        )
        assert v.buffer.read_only
    assert sum(p.stat().st_size for p in (tmp_path / "old").iterdir()) == size_before
    with ReplayBuffer.open(tmp_path / "old") as old:
        assert old.num_steps == 50


def test_mount_rejects_other_schema(tmp_path) -> None:
    from buffer import StepSchema

    other = StepSchema.from_features(
        {"observation.state": {"dtype": "float32", "shape": (7,)}},
        {"action": {"dtype": "float32", "shape": (2,)}},
    )
    ReplayBuffer.open(tmp_path / "x", other).close()
    with open_buffer(tmp_path / "new") as buf:
        with pytest.raises(ValueError, match="differs"):
            buf.mount(tmp_path / "x")


def test_restore_same_size_contents_and_sampler_state(tmp_path) -> None:
    rng = np.random.default_rng(0)
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [8] * 10))
        ps = PrioritizedSampler()
        b = buf.sample(32, ps, rng=rng)
        ps.update_priorities(b["index"], np.arange(32, dtype=np.float64))
        mix = MixSampler(adaptive=True)
        mix.report_success("reach", 0.25)
        ckpt = {"prio": ps.state_dict(), "mix": mix.state_dict()}
        size = len(buf)
        contents = buf.read_transitions(np.arange(buf.visible))
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert len(again) == size
        got = again.read_transitions(np.arange(again.visible))
        for k, v in contents.items():
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        ps2 = PrioritizedSampler()
        ps2.load_state_dict(ckpt["prio"])
        np.testing.assert_array_equal(ps2.tree.leaves(), ps.tree.leaves())
        r1 = ps.sample_indices(buf_view := again.view(), 64, np.random.default_rng(9))[0][1]
        r2 = ps2.sample_indices(buf_view, 64, np.random.default_rng(9))[0][1]
        np.testing.assert_array_equal(r1, r2)
        mix2 = MixSampler(adaptive=True)
        mix2.load_state_dict(ckpt["mix"])
        assert mix2.success == {"reach": 0.25}
