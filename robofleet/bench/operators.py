"""``robofleet bench operators``: fewer people than robots, and return on human effort.

Four simulated blind Meta-World robots learn with HG-DAgger in the same wall-clock budget,
once per operator configuration (:mod:`robofleet.bench.operator_runs`): (a) ``risk``: help
requests from the risk signal served by one simulated operator; (b) ``dedicated``: a
simulated person at each robot (four people); (c) ``random``: requests at random times, about
as many as (a)'s, served by one operator. (a) runs first: (c)'s request rate is (a)'s
requests per robot step.

Figures per configuration: ground-truth success over time (initial / best / final / late,
late being the mean of the last third of the evaluation points, as ``bench rewards``),
operator minutes (time people were busy: assigned to a request, or standing at a robot all
run long), autonomous successes, and return on human effort (Fleet-DAgger: autonomous
successes per operator minute). Prints a table, writes the success curves to ``--figure``
(PNG) and prints one JSON object as the last stdout line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foundation.clitext import plain_text
from robofleet.bench.operator_runs import CONFIGS, help_section, run_config
from robofleet.bench.success_figure import save_success_figure

FIGURE = Path("docs/figures/bench_operators.png")

# Used for (c) when (a) did not run or made no requests.
FALLBACK_RANDOM_RATE = 0.01


def _words(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def random_rate(risk_run: dict[str, Any] | None) -> float:
    """(a)'s requests per robot step (so (c) asks about as often); a fallback without them."""
    if not risk_run or not risk_run.get("help_requests") or not risk_run.get("env_steps"):
        return FALLBACK_RANDOM_RATE
    return min(1.0, float(risk_run["help_requests"]) / float(risk_run["env_steps"]))


def runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run per configuration in ``args.configs`` (``risk`` first when present)."""
    order = sorted(args.configs, key=lambda c: CONFIGS.index(c))
    done: dict[str, dict[str, Any]] = {}
    for config in order:
        help_doc = help_section(
            config,
            operators=args.operators,
            threshold=args.threshold,
            random_rate=random_rate(done.get("risk")),
            on_call_steps=args.on_call_steps,
            timeout_s=args.timeout_s,
        )
        done[config] = run_config(
            config,
            help_doc,
            task=args.task,
            robots=args.robots,
            minutes=args.minutes,
            eval_every_s=args.eval_every,
            eval_episodes=args.eval_episodes,
            control_hz=args.control_hz,
            settings_file=args.config,
            keep=args.keep,
        )
    return [done[c] for c in order]


def _fmt(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """The figures as a plain-text table, a row per configuration."""
    cols = (
        ("config", "config"),
        ("operators", "people"),
        ("initial_success", "init"),
        ("best_success", "best"),
        ("final_success", "final"),
        ("late_success", "late"),
        ("help_requests", "requests"),
        ("interventions", "interv"),
        ("operator_minutes", "op min"),
        ("autonomous_successes", "auto ok"),
        ("return_on_human_effort", "ok/op min"),
    )
    body = [[_fmt(r.get(k)) for k, _t in cols] for r in rows]
    lines = [[t for _k, t in cols], *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet bench operators", description=plain_text(__doc__))
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--configs", type=_words, default=list(CONFIGS), help="risk,dedicated,random")
    p.add_argument("--minutes", type=float, default=3.0, help="budget of each run")
    p.add_argument("--robots", type=int, default=4, help="robots of each run")
    p.add_argument("--operators", type=int, default=1, help="people of risk and random")
    p.add_argument("--task", default="reach-v3", help="Meta-World task")
    p.add_argument("--threshold", type=float, default=0.002, help="ensemble risk that asks")
    p.add_argument("--on-call-steps", type=int, default=40, help="steps of one takeover")
    p.add_argument("--timeout-s", type=float, default=20.0, help="a request's timeout")
    p.add_argument("--control-hz", type=float, default=20.0, help="robots' control rate")
    p.add_argument(
        "--eval-every", type=float, default=20.0, metavar="SECONDS", help="evaluation cadence"
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep runs' files")
    p.add_argument("--figure", type=Path, default=FIGURE, help="PNG of the success curves")
    return p


def plot(rows: list[dict[str, Any]], path: Path, robots: int, minutes: float) -> None:
    """Ground-truth success against wall time, one line per configuration."""
    curves = [(f"{r['config']}: {r['operators']} operator(s)", r["history"]) for r in rows]
    title = f"HG-DAgger, {robots} blind robots, {minutes:g} min each: who helps"
    save_success_figure(curves, path, title)


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        print(f"unknown configurations {unknown}; known: {list(CONFIGS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    rows = runs(args)
    for r in rows:
        r["operators"] = args.robots if r["config"] == "dedicated" else args.operators
    print(table(rows), flush=True)
    plot(rows, args.figure, args.robots, args.minutes)
    out = {
        "benchmark": "operators",
        "robots": args.robots,
        "minutes": args.minutes,
        "task": args.task,
        "configs": {r["config"]: r for r in rows},
        "figure": str(args.figure),
    }
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
