"""Hot/cold tiers: memory budget (real RSS of a subprocess), prefetch, metrics."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from tests.buffer.helpers import episodes, open_buffer, small_schema

ROOT = Path(__file__).resolve().parents[2]  # the probe imports buffer from the checkout


def test_resident_memory_within_budget_with_twice_the_data() -> None:
    # 64 MiB: small enough that one stray segment-sized transient (8 MiB here) would show.
    budget = 64 * 1024 * 1024
    out = subprocess.run(
        [sys.executable, "-m", "tests.buffer.memory_probe", str(budget)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["data"] >= 2 * budget
    growth = r["peak"] - r["base"]  # VmHWM: the true peak, not a sample of it
    assert growth <= 1.1 * budget, (growth / 2**20, r)
    assert 0 < r["hit_rate"] < 1  # some reads were served cold, correctly (checked inside)
    assert r["bytes_in_cache"] <= budget


def test_cold_reads_are_correct_and_prefetch_promotes(tmp_path) -> None:
    img = (48, 48, 3)  # over a page per row: cold rows are read from the segment file
    budget = 400_000
    with open_buffer(
        tmp_path / "b",
        small_schema(image=img),
        segment_target_bytes=70_000,
        memory_budget_bytes=budget,
        prefetch=True,
        prefetch_interval_s=0.01,
    ) as buf:
        for e in range(40):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e, image=img))
        buf.flush()
        cold = [c for c in buf.storage.chunks if not c.hot and c.sealed]
        assert cold
        target = cold[0]
        rows = np.arange(target.first_row, target.end, dtype=np.int64)
        b = buf.read_transitions(rows)
        np.testing.assert_array_equal(b["observation.state"][:, 0], buf.index.view("seq")[rows])
        np.testing.assert_array_equal(
            b["observation.images.front"][:, 0, 0, 0], (rows % 251).astype(np.uint8)
        )
        for _ in range(30):  # heat it up: the prefetch thread should promote it
            buf.read_transitions(rows)
            time.sleep(0.01)
            if target.hot:
                break
        assert target.hot, "a heavily sampled cold segment was not promoted"
        assert buf.storage.promotions >= 1
        b2 = buf.read_transitions(rows)
        np.testing.assert_array_equal(b2["observation.images.front"], b["observation.images.front"])
        st = buf.stats()
        for key in (
            "size_transitions",
            "bytes_on_disk",
            "bytes_in_cache",
            "cache_hit_rate",
            "prefetch_lag_s",
            "ack_latency_p50_s",
            "ack_latency_p99_s",
        ):
            assert key in st
        assert st["bytes_in_cache"] <= budget
        assert 0 < st["cache_hit_rate"] < 1
        assert st["size_transitions"] == 400
        assert st["bytes_on_disk"] > 400 * buf.storage.row_bytes


def test_budget_accounting_counts_spare_and_evicted_arrays_still_held(tmp_path) -> None:
    """Two transients that used to escape the byte budget: a pre-faulted spare tail whose
    count an append reset, and evicted hot arrays a reader still holds."""
    row = small_schema().fixed_row_bytes
    with open_buffer(
        tmp_path / "b", memory_budget_bytes=60 * row * 4, segment_target_bytes=10 * row
    ) as buf:
        threads = [
            threading.Thread(
                target=lambda r=r: [
                    buf.append(episodes(r, [5], seq0=5 * e, ep0=e)) for e in range(12)
                ]
            )
            for r in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        buf.flush()
        st = buf.storage
        spare = buf.sealer.spare  # noqa: SLF001 - the invariant is about this private spare tail
        assert spare is not None
        assert st.spare_bytes == len(spare["action"]) * st.row_bytes
        hot = next(c for c in st.chunks if c.hot and c.sealed)
        held = st.snapshot()  # a reader in flight holds the hot arrays
        before = st.retired_bytes
        with buf.state.lock:  # noqa: SLF001
            st.make_cold(hot)
        assert st.retired_bytes - before >= hot.n * st.row_bytes - hot.n * st.small_row_bytes
        del held
        gc.collect()
        assert st.retired_bytes == before  # unmapped now: no longer counted
