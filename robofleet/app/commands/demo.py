"""``robofleet demo``: post-train a simulated Meta-World fleet (HG-DAgger, RECAP or SAC), live.

Starts the cloud on the embedded defaults (local Ray, SQLite and buffers in ``data_dir``,
comms on 127.0.0.1, the dashboard on http://127.0.0.1:8000), enrolls ``--robots`` simulated
Sawyers through the enrollment service, launches one run through the run manager and shows its
progress until ``--minutes`` are over. ``--kill-learner-at S`` SIGKILLs the learner process S
seconds into the run; the supervisor restarts it from its last checkpoint. ``--json`` prints
the summary as the last line: initial_success, final_success, minutes, env_steps,
interventions, versions_published, acked_lost, learner_restarts.

``--algorithm`` picks the learner: ``hg-dagger`` (the default; MLP trained on the operator's
corrections), ``recap`` (pi*0.6's advantage-conditioned MLP; robots act on "positive") or
``sac`` (SAC with RLPD's symmetric sampling; a tanh-Gaussian actor that samples on the robots,
operator takeovers as the prior half of each batch). See ``cloud_learner.algorithms`` (each algorithm's builder).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_TASKS = "reach-v3,push-v3,drawer-close-v3,button-press-topdown-v3"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--robots", type=int, default=4, help="simulated robots (default 4)")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated Meta-World tasks")
    p.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    p.add_argument("--algorithm", default="hg-dagger", choices=["hg-dagger", "recap", "sac"])
    p.add_argument("--control-hz", type=float, default=20.0, help="robots' control rate")
    p.add_argument("--kill-learner-at", type=float, default=None, metavar="SECONDS")
    p.add_argument(
        "--eval-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="evaluation cadence (default: minutes * 6 s, at least 15 s)",
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes per task")
    p.add_argument("--port", type=int, default=8000, help="dashboard port (0 = any)")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary JSON as the last line")
    return p


def demo_spec(args: argparse.Namespace) -> Any:
    from cloud_learner.algorithms import BUILDERS
    from robofleet.runspec import parse_run_spec

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return parse_run_spec(
        {
            "version": 1,
            "name": "demo",
            "algorithm": args.algorithm,
            "tasks": tasks,
            # The synchronous loop's schedule, 0.5 updates per env step (samples per insert
            # 64 at batch 128), whatever the fleet's size; the cap only guards the CPU.
            "hyperparameters": {"control_hz": args.control_hz, "updates_per_s": 100.0},
            "buffer": {"samples_per_insert": 64.0},
            "policy": {"kind": BUILDERS[args.algorithm].policy_kind, "hidden_sizes": [128, 128]},
            "robots": {
                "robot_type": "metaworld-sawyer",
                "tags": {"simulated": "true"},
                "count": args.robots,
            },
            "learner": {"num_cpus": 1.0},
            # Fresh weights reach robots within ~15 env steps (robots swap at every step).
            "publish": {"every_updates": 10, "every_seconds": 1.0},
            "evaluation": {
                "every_seconds": args.eval_every or max(15.0, args.minutes * 6.0),
                "episodes_per_task": args.eval_episodes,
            },
            "stop": {"minutes": args.minutes},
        }
    )


def _table(progress: dict[str, Any], tasks: list[str], algorithm: str = "hg-dagger") -> Any:
    from rich.table import Table

    from cloud_learner.algorithms import BUILDERS

    name = BUILDERS[algorithm].display_name if algorithm in BUILDERS else algorithm
    t = Table(title=f"robofleet demo: {name} on a simulated fleet", expand=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("state", str(progress.get("state", "starting")))
    t.add_row("elapsed", f"{progress.get('elapsed_s', 0.0) / 60:.2f} min")
    t.add_row("robots", str(progress.get("robots", 0)))
    t.add_row("policy version", str(progress.get("policy_version", 0)))
    t.add_row("env steps", str(progress.get("env_steps", 0)))
    t.add_row("env steps/s", f"{progress.get('env_steps_per_s', 0.0):.1f}")
    t.add_row("learner updates/s", f"{progress.get('learner_updates_per_s', 0.0):.1f}")
    t.add_row("intervention rate", f"{progress.get('intervention_rate', 0.0):.2f}")
    t.add_row("interventions", str(progress.get("interventions", 0)))
    t.add_row("learner restarts", str(progress.get("learner_restarts", 0)))
    success = progress.get("success", {})
    for task in tasks:
        v = success.get(task)
        t.add_row(f"success {task}", "-" if v is None else f"{v:.2f}")
    mean = progress.get("success_mean")
    t.add_row("success (mean, policy alone)", "-" if mean is None else f"{mean:.2f}")
    return t


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
    from rich.console import Console
    from rich.live import Live

    from robofleet.app.cloud import CloudService
    from robofleet.app.settings import load_settings
    from robofleet.runspec import RunSpecError

    console = Console(stderr=args.json)
    settings = load_settings(args.config)
    try:
        spec = demo_spec(args)
    except RunSpecError as exc:
        print(f"robofleet demo: {exc}", file=sys.stderr)
        return 2
    cloud = CloudService(
        settings,
        sim_robots=args.robots,
        dashboard_port=None if args.no_dashboard else args.port,
        auto_resume=False,
    )
    try:
        cloud.start()
    except RuntimeError as exc:
        print(f"robofleet demo: {exc}", file=sys.stderr)
        cloud.close()
        return 1
    try:
        if cloud.dashboard_url:
            console.print(f"dashboard: {cloud.dashboard_url}")
            if cloud.admin_login:
                console.print(
                    f"login: username {cloud.admin_login[0]}  password {cloud.admin_login[1]}"
                )
            else:
                console.print(
                    "login: the admin account created by the first start of this data_dir"
                )
        assert cloud.manager is not None
        try:
            run_id = cloud.manager.launch(spec, actor="demo")
        except RunSpecError as exc:
            print(f"robofleet demo: {exc}", file=sys.stderr)
            return 2
        driver = cloud.manager.drivers[run_id]
        console.print(f"run {run_id}: {driver.run_dir}")
        killed = False
        started = time.monotonic()
        with Live(
            _table(driver.progress, spec.tasks, spec.algorithm),
            console=console,
            refresh_per_second=2,
        ) as live:
            while driver.alive:
                time.sleep(0.5)
                live.update(_table(driver.progress, spec.tasks, spec.algorithm))
                if (
                    args.kill_learner_at is not None
                    and not killed
                    and time.monotonic() - started >= args.kill_learner_at
                    and driver.learner is not None
                    and driver.learner.pid is not None
                ):
                    os.kill(driver.learner.pid, signal.SIGKILL)
                    killed = True
                    console.print(f"SIGKILLed the learner (pid) at {args.kill_learner_at:.0f}s")
        result = driver.result
        run = cloud.store.get_run(run_id) if cloud.store else None
        console.print(f"run ended: {run.state.value if run else '?'} {run.reason if run else ''}")
        if result:
            console.print(f"report: {result.get('report')}")
            for p in result.get("plots", []):
                console.print(f"plot: {p}")
        summary = {
            k: result.get(k)
            for k in (
                "initial_success",
                "final_success",
                "minutes",
                "env_steps",
                "interventions",
                "versions_published",
                "acked_lost",
                "learner_restarts",
            )
        }
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            console.print(summary)
        return 0 if result else 1
    finally:
        cloud.close()
