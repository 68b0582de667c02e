"""Many writers and several readers at once never see a partially written row."""

from __future__ import annotations

import sys
import threading

import numpy as np

from buffer import PrioritizedSampler, ReplayBuffer, UniformSampler
from tests.buffer.helpers import episodes, open_buffer


def test_writers_and_readers_stress(tmp_path) -> None:
    writers, eps = 6, 12
    errors: list[BaseException] = []
    done = threading.Event()
    with open_buffer(
        tmp_path / "b",
        segment_target_bytes=3000,
        memory_budget_bytes=40_000,
        prefetch=True,
        prefetch_interval_s=0.005,
    ) as buf:

        def write(r: int) -> None:
            try:
                recs = episodes(r, [10] * eps)
                for i in range(0, len(recs), 7):
                    buf.append(recs[i : i + 7])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def read(seed: int) -> None:
            rng = np.random.default_rng(seed)
            sampler = UniformSampler() if seed % 2 else PrioritizedSampler()
            try:
                while not done.is_set():
                    if len(buf) < 8:
                        continue
                    b = buf.sample(16, sampler, rng=rng)
                    robots = np.array([int(x.split("-")[1]) for x in b["robot_id"]])
                    seq = b["observation.state"][:, 0].astype(np.int64) - robots * 100_000
                    # Every column of a row belongs to the same, fully written step.
                    assert (b["observation.state"] == b["observation.state"][:, :1]).all()
                    np.testing.assert_array_equal(b["action"][:, 0], b["observation.state"][:, 0])
                    np.testing.assert_array_equal(
                        b["observation.images.front"][:, 2, 3, 1], (seq % 251).astype(np.uint8)
                    )
                    np.testing.assert_array_equal(b["reward"], (seq % 13).astype(np.float32))
                    nxt = b["next.observation.state"][:, 0]
                    done_mask = b["terminated"] | b["truncated"]
                    want = np.where(
                        done_mask,
                        -b["observation.state"][:, 0] - 1,
                        b["observation.state"][:, 0] + 1,
                    )
                    np.testing.assert_array_equal(nxt, want)
                    s = buf.sample_sequences(4, 3, rng=rng)
                    assert s["mask"][:, 0].all()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ws = [threading.Thread(target=write, args=(r,)) for r in range(writers)]
        rs = [threading.Thread(target=read, args=(s,)) for s in range(3)]
        for t in rs + ws:
            t.start()
        for t in ws:
            t.join()
        done.set()
        for t in rs:
            t.join()
        assert not errors, errors[0]
        assert buf.num_steps == writers * eps * 10
        assert len(buf) == writers * eps * 10
        seqs, robots = buf.index.view("seq"), buf.index.view("robot")
        for code in range(writers):
            assert sorted(seqs[robots == code].tolist()) == list(range(eps * 10))
    # Every segment was sealed by renaming WAL stripes written concurrently (records out of
    # row order inside a file): reopening rebuilds the same rows from those files alone.
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.recovered_rows == 0 and again.num_steps == writers * eps * 10
        rows = np.arange(again.first_row, again.visible, dtype=np.int64)
        got = again.storage.gather(rows, ["observation.state", "action"], count=False)
        robots = again.index.view("robot").astype(np.int64)
        names = np.array([int(n.split("-")[1]) for n in again.index.robots.names])
        want = names[robots] * 100_000 + again.index.view("seq")
        np.testing.assert_array_equal(got["observation.state"][:, 0], want.astype(np.float32))
        np.testing.assert_array_equal(got["action"][:, 0], want.astype(np.float32))


def test_selecting_successful_episodes_while_outcomes_are_marked(tmp_path) -> None:
    # ``select`` runs without the buffer's lock while marks add episode outcomes under it:
    # the outcome table is read as one snapshot, never while it grows.
    from foundation.rows import RowFilter

    errors: list[BaseException] = []
    done = threading.Event()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often, as on a busy machine
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(1, [2] * 50))
        index = buf.state.index
        for ep in range(0, 100, 2):
            buf.mark_episode("robot-1", "run-a", ep // 2, "success")

        def mark() -> None:
            try:
                for ep in range(20_000):  # outcomes of episodes to come, as marks may arrive
                    index.set_outcome(("run-a", "robot-1", 1_000 + ep), "success")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
            finally:
                done.set()

        t = threading.Thread(target=mark)
        t.start()
        selects = 0
        try:
            while not done.is_set():
                assert len(buf.select(RowFilter(success_only=True))) == 100
                selects += 1
        except RuntimeError as e:
            errors.append(e)
        finally:
            t.join()
            sys.setswitchinterval(switch)
        assert selects > 0 and not errors, errors
