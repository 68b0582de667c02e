"""The command-line face of ``robofleet bench weights --vla`` (:mod:`comms.bench.weights_vla`):
its options and the run that prints its tables and returns its JSON keys."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The VLA cases' option group (``--vla``, ``--vla-only``, sizes, repeats, memory)."""
    vla = parser.add_argument_group(
        "VLA-sized versions (opt-in: a full run of them takes ~10 minutes and ~10 GiB)"
    )
    vla.add_argument(
        "--vla",
        action="store_true",
        help="also run the 0.5B and 1B BF16 cases (full and delta, direct and via a site relay, "
        "1/4/16 subscribers) and a robot's peak memory while it applies one",
    )
    vla.add_argument("--vla-only", action="store_true", help="run only the VLA cases")
    vla.add_argument(
        "--vla-params",
        default=None,
        help="comma-separated parameter counts of the VLA cases (default 500000000,1000000000)",
    )
    vla.add_argument(
        "--vla-subscribers", default=None, help="comma-separated subscriber counts (default 1,4,16)"
    )
    vla.add_argument(
        "--vla-repeats",
        type=int,
        default=2,
        help="runs of each VLA case; the best is reported (the first is shown too)",
    )
    vla.add_argument(
        "--vla-memory-gib",
        type=float,
        default=10.0,
        help="memory a VLA case may use: held subscribers and LeRobot's path only where they "
        "fit, else verify-only subscribers and no LeRobot figure",
    )


def _ints(text: str | None, default: Sequence[int]) -> list[int]:
    return list(default) if text is None else [int(x) for x in text.split(",") if x.strip()]


def run_vla(args: argparse.Namespace) -> dict[str, Any]:
    """The VLA cases (:mod:`comms.bench.weights_vla`): tables unless ``--json``, JSON keys."""
    from comms.bench import weights_vla as V

    sizes = _ints(args.vla_params, V.VLA_PARAMS)
    subs = _ints(args.vla_subscribers, V.SUBSCRIBERS)
    budget = int(args.vla_memory_gib * (1 << 30))

    def log(msg: str) -> None:
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    rows = V.push_rows(sizes, subs, budget, log, args.vla_repeats)
    mem = V.memory_rows(sizes, log)
    if not args.json:
        V.print_tables(rows, mem, args.vla_repeats)
    return V.result(rows, mem)
