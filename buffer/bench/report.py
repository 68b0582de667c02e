"""The table ``robofleet bench buffer`` prints (figures from ``buffer.bench.suite``)."""

from __future__ import annotations

from typing import Any

from buffer.table.ack_phases import PHASES


def print_table(r: dict[str, float], result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench buffer: {result['records']} records of ~21 KB, 8 writers x 64")
    for col, justify in (
        ("measure", "left"),
        ("robofleet buffer", "right"),
        ("baseline", "right"),
        ("ratio", "right"),
        ("target", "right"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in _ingest_rows(r, result) + _sample_rows(r, result) + _camera_rows(r, result):
        t.add_row(*row)
    for row in _memory_rows(r) + _shard_rows(r) + learner_rows(r):
        t.add_row(*row)
    Console().print(t)


def print_learner_table(r: dict[str, float], shard_counts: tuple[int, ...]) -> None:
    """The learner view's rows alone (``python -m buffer.bench.learner_view``)."""
    from rich.console import Console
    from rich.table import Table

    counts = ", ".join(str(k) for k in shard_counts)
    t = Table(
        title=f"bench buffer: the learner's view of {counts} shards while "
        f"{r['learner_robots']:.0f} robots write {r['learner_robot_hz']:g} camera steps/s each"
    )
    for col, justify in (
        ("measure", "left"),
        ("robofleet buffer", "right"),
        ("baseline", "right"),
        ("ratio", "right"),
        ("target", "right"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in learner_rows(r, shard_counts):
        t.add_row(*row)
    Console().print(t)


def _ingest_rows(r: dict[str, float], result: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            "durable ingest (records/s) vs raw Arrow IPC + fsync",
            f"{r['ingest_records_per_s']:,.0f}",
            f"{r['arrow_records_per_s']:,.0f}",
            f"{result['ingest_ratio_vs_arrow']:.2f}",
            ">= 0.5",
        ),
        (
            "  ingest ratio per round: min / median / max",
            "",
            "",
            f"{r['ingest_ratio_min']:.2f} / {r['ingest_ratio_median']:.2f} / "
            f"{r['ingest_ratio_max']:.2f}",
            "",
        ),
        (
            "  ingest CPU seconds (all threads) vs Arrow",
            f"{r['ingest_cpu_s']:.2f}",
            f"{r['arrow_cpu_s']:.2f}",
            f"{result['ingest_cpu_ratio_vs_arrow']:.2f}",
            "",
        ),
        (
            "ack latency p50 / p99 (ms)",
            f"{r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f}",
            "",
            "",
            "",
        ),
        ("fdatasyncs per appended batch", f"{r['fsyncs_per_batch']:.2f}", "1.00", "", ""),
        _phase_row("  ack latency by phase", r, ""),
    ]


def _phase_row(label: str, r: dict[str, float], prefix: str) -> tuple[str, ...]:
    """Mean ms per append in each phase (``buffer.table.ack_phases``)."""
    ms = " / ".join(f"{r[f'{prefix}ack_{p}_ms']:.1f}" for p in PHASES)
    return (f"{label} (ms): {' / '.join(PHASES)}", ms, "", "", "")


def _sample_rows(r: dict[str, float], result: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            "hot sample, batch 256 (ms) vs numpy gather",
            f"{r['hot_sample_ms']:.2f}",
            f"{r['gather_sample_ms']:.2f}",
            f"{result['sample_ratio_vs_gather']:.2f}",
            ">= 0.5",
        ),
        (
            "hot sample, batch 256 (ms) vs lerobot ReplayBuffer",
            f"{r['hot_sample_ms']:.2f}",
            f"{r['lerobot_sample_ms']:.2f}",
            f"{result['sample_ratio_vs_lerobot']:.2f}",
            ">= 1.5",
        ),
        (
            f"cold sample (ms), data {r['data_mb']:.0f} MB = 2x budget",
            f"{r['cold_sample_ms']:.2f}",
            f"{r['hot_sample_ms']:.2f} (hot)",
            f"{result['cold_ratio_vs_hot']:.2f}",
            "",
        ),
        ("cold cache hit rate", f"{r['cold_hit_rate']:.2f}", "", "", ""),
    ]


def _camera_rows(r: dict[str, float], result: dict[str, Any]) -> list[tuple[str, ...]]:
    kb = r["camera_step_kb"]
    return [
        (
            f"camera steps ({kb:.0f} KB: 2x 128x128x3 + state), 8 writers x 16: "
            "durable ingest (MB/s) vs raw Arrow IPC + fsync",
            f"{r['camera_ingest_mb_per_s']:,.0f}",
            f"{r['camera_arrow_mb_per_s']:,.0f}",
            f"{result['camera_ingest_ratio_vs_arrow']:.2f}",
            ">= 0.5",
        ),
        (
            "  camera ingest ratio per round: min / median / max",
            "",
            "",
            f"{r['camera_ingest_ratio_min']:.2f} / {r['camera_ingest_ratio_median']:.2f} / "
            f"{r['camera_ingest_ratio_max']:.2f}",
            "",
        ),
        (
            "  camera ack latency p50 / p99 (ms)",
            f"{r['camera_ack_p50_ms']:.1f} / {r['camera_ack_p99_ms']:.1f}",
            "",
            "",
            "",
        ),
        _phase_row("  camera ack latency by phase", r, "camera_"),
        (
            "camera steps: hot sample, batch 256 (ms) vs numpy gather of the same frames",
            f"{r['camera_hot_sample_ms']:.1f}",
            f"{r['camera_gather_sample_ms']:.1f}",
            f"{result['camera_sample_ratio_vs_gather']:.2f}",
            ">= 0.5",
        ),
    ]


def _memory_rows(r: dict[str, float]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    budget = r["memory_budget_mb"]
    for m in (2, 10, 20):
        key = f"mem_{m}x_above_budget_mb"
        if key not in r:
            continue
        rows.append(
            (
                f"resident memory above a {budget:.0f} MiB budget at {m}x its data "
                f"({r[f'mem_{m}x_rows']:,.0f} rows of 64x64x3)",
                f"{r[key]:+.1f} MiB ({r[f'mem_{m}x_above_budget_per_row']:+.0f} B/row)",
                "",
                "",
                f"<= index ({r['index_bytes_per_row']:.0f} B/row)",
            )
        )
    if rows:
        rows.append(
            (
                "  peak above budget, after sampling 256-row batches",
                f"{r['mem_peak_above_budget_mb']:+.1f} MiB",
                "",
                "",
                "",
            )
        )
    return rows


def _shard_rows(r: dict[str, float]) -> list[tuple[str, ...]]:
    if "shards_speedup" not in r:
        return []
    n = int(r["shards"])
    return [
        (
            f"ingest (records/s), {n} shard processes vs 1 (robots hashed to shards)",
            f"{r['shardN_records_per_s']:,.0f}",
            f"{r['shard1_records_per_s']:,.0f}",
            f"{r['shards_speedup']:.2f}",
            "",
        )
    ]


def learner_rows(
    r: dict[str, float], shard_counts: tuple[int, ...] = (1, 2, 4)
) -> list[tuple[str, ...]]:
    """Per shard count: the learner's full-speed data rate against the numpy gather, and its
    wait for data at its update rate (``buffer.bench.learner_view``)."""
    rows: list[tuple[str, ...]] = []
    for k in shard_counts:
        if f"learner_batches_per_s_{k}" not in r:
            continue
        shards = f"{k} shard{'s' if k > 1 else ''}"
        rows.append(
            (
                f"learner view, {shards}, robots writing: camera batch of "
                f"{r['learner_batch_rows']:.0f} at full speed (ms) vs numpy gather",
                f"{r[f'learner_ms_per_batch_{k}']:.1f} ({r[f'learner_batches_per_s_{k}']:.1f}/s, "
                f"{r[f'learner_mb_per_s_{k}']:,.0f} MB/s)",
                f"{r['learner_gather_ms']:.1f}",
                f"{r[f'learner_ratio_vs_gather_{k}']:.2f}",
                "",
            )
        )
        rows.append(
            (
                f"  learner at {r['learner_hz']:g} updates/s: time waiting for data "
                "(wait p50 / p99 ms, updates/s)",
                f"{100 * r[f'learner_wait_fraction_{k}']:.1f} % "
                f"({r[f'learner_wait_p50_ms_{k}']:.1f} / {r[f'learner_wait_p99_ms_{k}']:.1f}, "
                f"{r[f'learner_updates_per_s_{k}']:.1f})",
                "",
                "",
                "< 5 %",
            )
        )
        if f"learner_socket_ms_per_batch_{k}" in r:
            rows.append(
                (
                    "  the same over the socket (no shared memory): full speed ms; wait at "
                    f"{r['learner_hz']:g} updates/s",
                    f"{r[f'learner_socket_ms_per_batch_{k}']:.1f} "
                    f"({r[f'learner_socket_batches_per_s_{k}']:.1f}/s); "
                    f"{100 * r[f'learner_socket_wait_fraction_{k}']:.1f} % "
                    f"({r[f'learner_socket_updates_per_s_{k}']:.1f} updates/s)",
                    f"{r['learner_gather_ms']:.1f}",
                    f"{r[f'learner_socket_ratio_vs_gather_{k}']:.2f}",
                    "",
                )
            )
    return rows
