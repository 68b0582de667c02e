"""``robofleet bench weights --vla`` at tiny sizes runs end to end (real cloud, relay and
subscriptions; LeRobot's transport where the memory budget lets it), and its verify-only robot
checks every chunk's digest while holding nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from comms.bench import weights_vla as V
from comms.wire import weight_codec as W
from robofleet.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_weights_vla_tiny_prints_tables_then_figures(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = 3_000_000  # two 1024 x 1024 BF16 layers: "2M"
    # Room for one held robot beside a direct cloud (5 model copies) and for LeRobot's path to
    # one actor (4), not more: every other case is verify-only and has no LeRobot figure.
    gib = 5.5 * V.model_bytes(params) / (1 << 30)
    argv = ["--vla-only", "--vla-params", str(params), "--vla-subscribers", "1,2"]
    assert main(["bench", "weights", *argv, "--vla-memory-gib", f"{gib:.9f}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    table = "\n".join(lines[:-1])
    assert "VLA weights" in table and "robot peak memory" in table
    assert "verify-only" in table and "held" in table and "site relay" in table
    res = json.loads(lines[-1])
    modes = res["vla_subscriber_mode_per_case"]
    held = {"2Mx1_full", "2Mx1_delta"}
    assert set(modes) == {
        f"2Mx{n}{via}_{v}" for n in (1, 2) for via in ("", "_relay") for v in ("full", "delta")
    }
    assert all(mode == (V.HELD if k in held else V.VERIFY_ONLY) for k, mode in modes.items())
    best, first = res["vla_push_s_per_case"], res["vla_push_s_first_run_per_case"]
    assert set(first) == set(best) and all(0 < best[k] <= first[k] for k in best)
    ratios = res["vla_push_ratio_vs_lerobot_per_case"]
    assert all((r is not None and r > 0) == k.startswith("2Mx1_") for k, r in ratios.items())
    assert res["vla_push_ratio_vs_lerobot"] > 0
    sent = res["vla_sent_bytes_per_case"]
    assert sent["2Mx2_delta"] < sent["2Mx2_full"] / 10  # 1 % changed: sent as a delta
    copies = res["vla_robot_extra_copies_during_apply"]
    assert set(copies) == {"2M_full_into_empty", "2M_full", "2M_delta"}
    assert all(b > 0 for b in res["vla_robot_peak_bytes_during_apply"].values())
    assert set(res["vla_robot_extra_copies_anon_during_apply"]) == set(copies)
    assert res["vla_robot_extra_copies_max"] == max(copies["2M_full"], copies["2M_delta"])
    assert res["vla_bench_process_peak_bytes"] > 0


def test_a_verify_only_robot_checks_every_chunk_and_holds_nothing() -> None:
    state = V.bf16_state(2_000_000)
    s0 = W.Snapshot.take(state, 0)
    full = W.encode_full("run", s0, chunk_bytes=256 * 1024)
    rx = V.VerifyOnlyReceiver()
    asm = rx.new_assembler(full.manifest)
    assert len(asm.payload) == 0
    bad = bytearray(full.chunk(3))
    bad[7] ^= 1
    assert asm.add_buffer(0, W.FULL_BASE, 3, bytes(bad))
    for i in range(full.num_chunks):
        if i != 3:
            asm.add_buffer(0, W.FULL_BASE, i, full.chunk_view(i))
    assert asm.missing == [3] and asm.rejected == 1 and not rx.apply(asm)
    assert asm.add_buffer(0, W.FULL_BASE, 3, full.chunk(3)) and asm.complete
    assert rx.apply(asm) and rx.current() == (0, {}) and rx.bytes_verified == len(full.payload)
    V.perturb(state)
    delta = W.encode_delta("run", s0, W.Snapshot.take(state, 1), chunk_bytes=256 * 1024)
    assert delta is not None and rx.wants(delta.manifest)  # follows versions: gets deltas
    asm = rx.new_assembler(delta.manifest)
    for i in range(delta.num_chunks):
        asm.add_buffer(1, 0, i, delta.chunk_view(i))
    assert rx.apply(asm) and rx.version == 1 and rx.current()[1] == {}
    changed = sum(
        int(np.count_nonzero(a != s0.arrays[k][1]))
        for k, (_, a) in W.Snapshot.take(state, 1).arrays.items()
    )
    total = sum(a.size for _, a in s0.arrays.values())
    assert 0.005 < changed / total <= V.DELTA_FRACTION
