"""The row index forgets the rows retention deleted (``buffer.table.compaction``): it stays
near the live rows however many were written, and every answer (lookups, de-duplication,
sampling, episode marks, a reopen) is what a buffer whose index kept them all gives."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buffer import NothingToSample, ReplayBuffer, StepValidationError
from buffer.table import compaction, episodes
from buffer.table.retired import RETIRED_FILE
from foundation.rows import RowFilter
from tests.buffer.helpers import episodes as steps_of
from tests.buffer.helpers import open_buffer

SMALL = {"segment_target_bytes": 1300, "retention_max_bytes": 6000}  # ~20 rows stored
WIDER = {"segment_target_bytes": 1300, "retention_max_bytes": 40000}  # ~110 rows, ~10 a segment
ROBOTS = ("robot-0", "robot-3")
MIN_ROWS = 8  # compaction's minimum in these tests (the default is 16384)


def _round(e: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Round ``e``: robot 0's episode ``e`` (seqs ``10e ..``) and robot 3's (seqs
    ``1000 + 12e ..``: gaps between rounds); every 7th of robot 3's is interrupted (no done
    step: its next episode closes it)."""
    a = steps_of(0, [10], seq0=10 * e, ep0=e)
    b = steps_of(3, [10], seq0=1000 + 12 * e, ep0=e)
    return a, (b[:6] if e % 7 == 3 else b)


def _feed(buf: ReplayBuffer, rounds: int) -> None:
    """Rounds ``0 .. rounds - 1``, each with its marks: robot 0's episodes succeed or fail,
    every 5th of robot 3's is discarded."""
    for e in range(rounds):
        a, b = _round(e)
        buf.append(a)
        buf.append(b)
        if e % 3 < 2:
            buf.mark_episode("robot-0", "run-a", e, "success" if e % 3 == 0 else "failure")
        if e % 5 == 2:
            buf.mark_episode("robot-3", "run-a", e, "discard")
    buf.flush()


def _truth(rounds: int) -> dict[str, np.ndarray]:
    """Every seq each robot sent in ``rounds`` rounds."""
    return {
        "robot-0": np.arange(10 * rounds),
        "robot-3": np.concatenate([[s["seq"] for s in _round(e)[1]] for e in range(rounds)]),
    }


def _answers(buf: ReplayBuffer) -> dict[str, Any]:
    """What a reader asks of the buffer; sampling with fixed generators."""
    out: dict[str, Any] = {"window": buf.window(), "len": len(buf), "first": buf.first_row}
    for r in ROBOTS:
        out[f"stored {r}"] = buf.stored_seqs(r)
        out[f"on disk {r}"] = buf.stored_seqs(r, retired=False)
        out[f"retired {r}"] = buf.retired_seqs(r)
        out[f"durable {r}"] = buf.durable_seq(r)
        out[f"contains {r}"] = buf.contains(r, np.arange(-3, 2600))
    out["select"] = buf.select()
    out["success"] = buf.select(RowFilter(success_only=True))
    out["robot-3 rows"] = buf.select(RowFilter(robot_ids=("robot-3",)))
    out["episodes"] = episodes.summaries(buf, "run-a")
    for name, batch in (
        ("sample", buf.sample(64, rng=np.random.default_rng(1))),
        ("sequences", buf.sample_sequences(48, 3, history=6, rng=np.random.default_rng(2))),
        ("chunks", buf.sample_chunks(16, 4, rng=np.random.default_rng(3))),
        # the window's first row: its history is gone, so all padding
        ("first", buf.read_sequences(np.array([buf.first_row]), 2, 4)),
    ):
        for k, v in batch.items():
            out[f"{name} {k}"] = v
    return out


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_equal(got[k], want[k], err_msg=k)


def _bounded(buf: ReplayBuffer) -> None:
    """The index holds the live rows plus less than the compaction's slack."""
    live = buf.visible - buf.first_row
    dead = buf.first_row - buf.index.base
    assert 0 <= dead <= max(MIN_ROWS, live // 3 + 1), (dead, live)
    assert len(buf.index) == live + dead


def test_the_index_stays_near_the_live_rows(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compaction, "COMPACT_MIN_ROWS", MIN_ROWS)
    calls: list[int] = []
    real = compaction.compact

    def counted(index, retired, upto) -> None:  # type: ignore[no-untyped-def]
        calls.append(upto - index.base)
        real(index, retired, upto)

    monkeypatch.setattr(compaction, "compact", counted)
    with open_buffer(tmp_path / "b", **WIDER) as buf:
        written = 0
        for part in range(6):
            for e in range(20 * part, 20 * (part + 1)):
                a, b = _round(e)
                written += buf.append(a).stored + buf.append(b).stored
            buf.flush()
            _bounded(buf)
        segments = len((tmp_path / "b" / RETIRED_FILE).read_text().splitlines())
        assert buf.visible == written  # all 120 rounds, every row once
        assert len(buf.index) * 5 < written, (len(buf.index), written)
        assert buf.index.base > 0 and buf.index.base == sum(calls)
        # amortised: once a third of the live rows are dead (~4 segments), not every deletion
        assert 0 < len(calls) <= segments // 2, (len(calls), segments)
        truth = _truth(120)
        for r in ROBOTS:
            np.testing.assert_array_equal(buf.stored_seqs(r), truth[r])
            assert buf.durable_seq(r) == truth[r][-1]
            assert buf.contains(r, truth[r]).all()


def _run(path: Path, min_rows: int, monkeypatch: pytest.MonkeyPatch, rounds: int) -> ReplayBuffer:
    monkeypatch.setattr(compaction, "COMPACT_MIN_ROWS", min_rows)
    buf = open_buffer(path, **SMALL)
    _feed(buf, rounds)
    return buf


def test_answers_are_those_of_an_index_that_kept_every_row(tmp_path, monkeypatch) -> None:
    rounds = 40
    kept = _run(tmp_path / "kept", 1 << 40, monkeypatch, rounds)  # never compacts
    with kept:
        assert kept.index.base == 0 and kept.first_row > 0
        want = _answers(kept)
        # retired seqs sent again are duplicates; a gap seq below them is out of order
        dup = kept.append(_round(0)[0] + _round(1)[1])
        with pytest.raises(StepValidationError, match="out of order"):
            kept.append(steps_of(3, [1], seq0=1010, ep0=0))
    buf = _run(tmp_path / "compacted", MIN_ROWS, monkeypatch, rounds)
    with buf:
        assert buf.index.base > 0 and len(buf.index) < buf.visible // 3
        _bounded(buf)
        got = _answers(buf)
        _assert_same(got, want)
        truth = _truth(rounds)
        for r in ROBOTS:
            np.testing.assert_array_equal(got[f"stored {r}"], truth[r])
            assert got[f"durable {r}"] == truth[r][-1]
            gone, on_disk = got[f"retired {r}"], got[f"on disk {r}"]
            assert len(gone) and np.intersect1d(gone, on_disk).size == 0
            np.testing.assert_array_equal(np.sort(np.concatenate([gone, on_disk])), truth[r])
            assert (got[f"contains {r}"] == np.isin(np.arange(-3, 2600), truth[r])).all()
        assert not got["first mask"][0, :4].any() and got["first mask"][0, 4]
        assert len(got["success"]) and len(got["episodes"])
        visible = buf.visible
        again = buf.append(_round(0)[0] + _round(1)[1])
        assert (again.stored, again.duplicates) == (dup.stored, dup.duplicates) == (0, 20)
        assert buf.visible == visible
        with pytest.raises(StepValidationError, match="out of order"):
            buf.append(steps_of(3, [1], seq0=1010, ep0=0))
        # a reopen (read-only: this one stays open, so nothing is sealed or retired more)
        with ReplayBuffer.open(tmp_path / "compacted", read_only=True) as ro:
            assert ro.index.base == buf.first_row and ro.visible == buf.visible
            _assert_same(_answers(ro), _answers(buf))
            lo = buf.first_row - buf.index.base
            for name in ro.index.cols:
                mine = buf.index.view(name)[lo:]
                if name == "prev_row":  # links to rows gone are -1 on a reopen
                    mine = np.where(mine < buf.first_row, -1, mine)
                np.testing.assert_array_equal(ro.index.view(name), mine, err_msg=name)


def test_compaction_refuses_rows_outside_the_index(tmp_path) -> None:
    from buffer.table.index import RowIndex
    from buffer.table.retired import RetiredSeqs

    idx = RowIndex(base=10)
    with pytest.raises(ValueError, match="cannot drop"):
        compaction.compact(idx, RetiredSeqs(tmp_path, read_only=True), 11)
    with pytest.raises(ValueError, match="cannot drop"):
        compaction.compact(idx, RetiredSeqs(tmp_path, read_only=True), 9)


def test_sampling_beside_compaction_reads_the_rows_it_picked(tmp_path, monkeypatch) -> None:
    """Appends retire and compact in the sealer's thread while batches are drawn: each
    sampled step's index columns (robot, reward) belong to the payload row read with them
    (state = robot * 100000 + seq, reward = seq % 13), and history before the first stored
    row is padding. A draw whose rows all went meanwhile may give up (``_draw``'s retries),
    and a window of ~20 rows may hold no transition for a moment: only those two are
    tolerated."""
    monkeypatch.setattr(compaction, "COMPACT_MIN_ROWS", MIN_ROWS)
    failures: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            _feed(buf, 60)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _feed(buf, 2)
        writer = threading.Thread(target=write)
        writer.start()
        drawn = gave_up = 0
        rng = np.random.default_rng(5)
        while not done.is_set() or drawn < 20:
            try:
                batch = buf.sample(16, rng=rng)
                seqs = buf.sample_sequences(8, 2, history=4, rng=rng)
            except (FileNotFoundError, NothingToSample):
                gave_up += 1
                continue
            drawn += 1
            for b, mask in ((batch, None), (seqs, seqs["mask"])):
                state = b["observation.state"][..., 0].astype(np.int64)
                robot = np.char.add("robot-", (state // 100_000).astype(str))
                ok = np.ones(state.shape, bool) if mask is None else mask
                assert (robot[ok] == b["robot_id"][ok]).all()
                assert (b["reward"][ok] == (state[ok] % 100_000) % 13).all()
            both = seqs["mask"][:, 1:] & seqs["mask"][:, :-1]  # two real steps in a row
            assert (np.diff(seqs["frame_index"], axis=1)[both] == 1).all()
        writer.join()
        assert not failures and drawn >= 20 and gave_up <= drawn
        assert buf.index.base > 0


def test_prioritized_replay_holds_the_window_not_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prioritized sampler's sum tree drops the leaves of rows retention deleted, keeps
    the priorities it was given for rows still stored, and draws only stored rows."""
    from buffer import PrioritizedSampler

    monkeypatch.setattr(PrioritizedSampler, "REBASE_MIN", 16)
    monkeypatch.setattr(compaction, "COMPACT_MIN_ROWS", MIN_ROWS)
    ps = PrioritizedSampler()
    sizes = []
    with open_buffer(tmp_path / "b", **WIDER) as buf:
        for e in range(120):
            a, b = _round(e)
            buf.append(a)
            buf.append(b)
            buf.flush()
            got = buf.sample(32, ps, rng=np.random.default_rng(e))
            lo, hi = buf.window()
            assert ((got["index"] >= lo) & (got["index"] < hi)).all(), e
            ps.update_priorities(got["index"], np.full(32, 5.0))
            sizes.append(len(ps.tree.leaves()))
        # The priorities just set are where the tree says, after its rebases.
        assert ps.base is not None and ps.base > 0
        held = ps.tree.leaves()[got["index"] - ps.base]
        assert np.allclose(held, (5.0 + ps.eps) ** ps.alpha)
    assert hi > 2000 and max(sizes[60:]) <= 512, (hi, sizes[-10:])
