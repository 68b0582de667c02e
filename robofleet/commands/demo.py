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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from foundation.clitext import plain_text

if TYPE_CHECKING:
    from rich.console import Console

    from foundation.runspec import RunSpec
    from robofleet.cloud import CloudService
    from runs.run import RunDriver

DEFAULT_TASKS = "reach-v3,push-v3,drawer-close-v3,button-press-topdown-v3"
# The fleet run's update schedule (the demo's and ``robofleet bench efficiency``'s): the
# synchronous loop's 0.5 updates per env step at batch 128, whatever the fleet's size, held
# with Reverb's samples-per-insert rule (buffer.RateLimiter.sampling_side, in the learner
# process) under an update-rate cap high enough that the rule, not the cap, binds up to 8
# robots (the cap only guards the CPU).
UPDATES_PER_S = 100.0
SAMPLES_PER_INSERT = 64.0
# Its weight cadence: fresh weights reach robots within ~15 env steps. Measured (bench
# efficiency, 4 robots): publishing every 50 updates and applying at episode start, robots
# acted on versions a whole episode old and the fleet kept collecting corrections the learner
# had already made; every 10 updates (0.25 s at 40 updates/s) applied at each action-chunk
# boundary keeps the version lag near 0.
PUBLISH_EVERY_UPDATES = 10
PUBLISH_EVERY_SECONDS = 1.0
LINE_EVERY_S = 30.0  # a progress line this often when the output is not a terminal
SUMMARY_KEYS = (
    "initial_success",
    "final_success",
    "minutes",
    "env_steps",
    "interventions",
    "versions_published",
    "acked_lost",
    "learner_restarts",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet demo", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--robots", type=int, default=4, help="simulated robots (default 4)")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated Meta-World tasks")
    p.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    p.add_argument(
        "--algorithm", default="hg-dagger", help="a registered algorithm (hg-dagger, recap, sac)"
    )
    p.add_argument("--control-hz", type=float, default=20.0, help="robots' control rate")
    p.add_argument(
        "--kill-learner-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="SIGKILL the learner process this long into the run (its supervisor restarts it)",
    )
    p.add_argument(
        "--eval-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="evaluation cadence (default: minutes * 6 s, at least 15 s)",
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes per task")
    p.add_argument(
        "--cameras",
        default="",
        help="comma-separated Meta-World cameras the robots render (e.g. corner): the policy "
        "is a CNN on them (--policy) and success comes from the robots' evaluation episodes",
    )
    p.add_argument("--image-size", type=int, default=32, help="side of the frames (pixels)")
    p.add_argument(
        "--policy",
        default=None,
        help="policy kind (default: cnn with cameras, else the algorithm's own)",
    )
    p.add_argument(
        "--offline-data",
        action="append",
        default=[],
        metavar="SOURCE",
        help="a dataset, run id or path to mount as offline data (repeatable)",
    )
    p.add_argument("--init-from-run", default=None, metavar="RUN", help="start from its version")
    p.add_argument("--port", type=int, default=8000, help="dashboard port (0 = any)")
    p.add_argument("--no-dashboard", action="store_true", help="do not serve the web dashboard")
    p.add_argument("--json", action="store_true", help="print the summary JSON as the last line")
    return p


def sim_fleet_spec(
    name: str,
    algorithm: str,
    tasks: Sequence[str],
    robots: int,
    *,
    minutes: float,
    eval_every_s: float,
    eval_episodes: int,
    control_hz: float = 20.0,
    updates_per_s: float | None = UPDATES_PER_S,
    samples_per_insert: float | None = SAMPLES_PER_INSERT,
    publish_every_updates: int = PUBLISH_EVERY_UPDATES,
    publish_every_seconds: float = PUBLISH_EVERY_SECONDS,
    target_success: float | None = None,
    policy: Mapping[str, Any] | None = None,
    offline_data: Sequence[str] = (),
    eval_on: str = "simulator",
) -> RunSpec:
    """The run spec of ``robots`` simulated Meta-World Sawyers (robot type
    ``metaworld-sawyer``, tag ``simulated``) training ``algorithm``'s default policy kind
    (two hidden layers of 128) on ``tasks`` with a one-CPU learner; the run the demo and
    ``robofleet bench efficiency`` launch. ``updates_per_s`` None leaves the run's default
    cap (RunParams.updates_per_s); ``samples_per_insert`` None leaves only the cap;
    ``target_success`` None stops on ``minutes`` alone. ``policy`` overrides the policy
    section (e.g. ``{"kind": "cnn"}`` for robots with cameras), ``offline_data`` is mounted,
    ``eval_on`` is ``simulator`` (fixed goals in the cloud) or ``robots``.

    Raises:
        foundation.runspec.RunSpecError: the spec is invalid (e.g. an unknown task).
    """
    from cloud_learner.algorithms import BUILDERS
    from foundation.runspec import parse_run_spec

    hyperparameters: dict[str, Any] = {"control_hz": control_hz}
    if updates_per_s is not None:
        hyperparameters["updates_per_s"] = updates_per_s
    stop: dict[str, Any] = {"minutes": minutes}
    if target_success is not None:
        stop["target_success"] = target_success
    return parse_run_spec(
        {
            "version": 1,
            "name": name,
            "algorithm": algorithm,
            "tasks": list(tasks),
            "hyperparameters": hyperparameters,
            "buffer": {
                "samples_per_insert": samples_per_insert,
                "offline_data": list(offline_data),
            },
            # The weak start: one episode of each task driven by the robots' operators (the
            # scripted expert on simulated robots), cloned before the first policy.
            "demonstrations": {"episodes_per_task": 1},
            "policy": {
                "kind": BUILDERS[algorithm].policy_kind,
                "hidden_sizes": [128, 128],
                **(policy or {}),
            },
            "robots": {
                "robot_type": "metaworld-sawyer",
                "tags": {"simulated": "true"},
                "count": robots,
            },
            "learner": {"num_cpus": 1.0},
            "publish": {
                "every_updates": publish_every_updates,
                "every_seconds": publish_every_seconds,
            },
            # The simulated fleet's success curve comes from the cloud's Meta-World evaluator on
            # fixed goals (the same ones every point), so the demo's figures stay comparable.
            "evaluation": {
                "on": eval_on,
                "every_seconds": eval_every_s,
                "episodes_per_task": eval_episodes,
            },
            "stop": stop,
        }
    )


def demo_spec(args: argparse.Namespace) -> RunSpec:
    """The demo's run (:func:`sim_fleet_spec`) from its command line."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    policy: dict[str, Any] = {}
    if args.policy or args.cameras:
        policy["kind"] = args.policy or "cnn"
    if args.init_from_run:
        policy["init_from_run"] = args.init_from_run
    return sim_fleet_spec(
        "demo",
        args.algorithm,
        tasks,
        args.robots,
        minutes=args.minutes,
        eval_every_s=args.eval_every or max(15.0, args.minutes * 6.0),
        eval_episodes=args.eval_episodes,
        control_hz=args.control_hz,
        policy=policy,
        offline_data=args.offline_data,
        # The cloud's simulator evaluator renders no camera: camera runs are measured by
        # the robots' own evaluation episodes.
        eval_on="robots" if args.cameras else "simulator",
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
    parser = build_parser()
    args = parser.parse_args(list(argv))
    from cloud_learner.algorithms import BUILDERS

    if args.algorithm not in BUILDERS:
        parser.error(f"--algorithm {args.algorithm!r}: choose from {', '.join(sorted(BUILDERS))}")
    from rich.console import Console

    from foundation.runspec import RunSpecError
    from robofleet.cloud import CloudService
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robots

    console = Console(stderr=args.json)
    settings = load_settings(args.config)
    try:
        spec = demo_spec(args)
    except RunSpecError as exc:
        _error(exc)
        return 2
    unknown = _unknown_tasks(spec.tasks)
    if unknown:  # before a cloud and Ray start: the simulated fleet runs Meta-World only
        _error(ValueError(f"--tasks: no Meta-World task {unknown}"))
        return 2
    cameras = [c for c in args.cameras.split(",") if c]
    cloud = CloudService(
        settings,
        robots=sim_robots(args.robots, cameras, (args.image_size, args.image_size))
        if args.robots
        else None,
        dashboard_port=None if args.no_dashboard else args.port,
        auto_resume=False,
    )
    try:
        cloud.start()
    except RuntimeError as exc:
        _error(exc)
        cloud.close()
        return 1
    try:
        _print_login(console, cloud)
        assert cloud.manager is not None
        try:
            run_id = cloud.manager.launch(spec, actor="demo")
        except RunSpecError as exc:
            _error(exc)
            return 2
        driver = cloud.manager.drivers[run_id]
        console.print(f"run {run_id}: {driver.run_dir}")
        _watch(console, driver, spec, args.kill_learner_at)
        return _report(console, cloud, run_id, driver.result, as_json=args.json)
    finally:
        cloud.close()


def _unknown_tasks(tasks: list[str]) -> str:
    """``tasks`` that are not Meta-World v3 tasks, named with the closest ones ("": none)."""
    from foundation.naming import unknown_names
    from hal.drivers.metaworld import v3_tasks

    return unknown_names(tasks, v3_tasks())


def _error(exc: Exception) -> None:
    print(f"robofleet demo: {exc}", file=sys.stderr)


def _print_login(console: Console, cloud: CloudService) -> None:
    """The dashboard's address and how to log in, when the cloud serves one."""
    if not cloud.dashboard_url:
        return
    console.print(f"dashboard: {cloud.dashboard_url}")
    if cloud.admin_login:
        console.print(f"login: username {cloud.admin_login[0]}  password {cloud.admin_login[1]}")
    else:
        console.print("login: the admin account created by the first start of this data_dir")


def _watch(
    console: Console, driver: RunDriver, spec: RunSpec, kill_learner_at: float | None
) -> None:
    """The live progress table until the run ends; SIGKILLs the learner process once,
    ``kill_learner_at`` seconds after the watch began (None: never)."""
    from rich.live import Live

    from runs.cadence import Every

    killed = False
    started = time.monotonic()
    line = Every(LINE_EVERY_S, started)
    with Live(
        _table(driver.progress, spec.tasks, spec.algorithm),
        console=console,
        refresh_per_second=2,
    ) as live:
        while driver.alive:
            time.sleep(0.5)
            live.update(_table(driver.progress, spec.tasks, spec.algorithm))
            if not console.is_terminal and line.due(time.monotonic()):
                # A log or a CI job sees the live table only when it ends: a line meanwhile.
                console.print(_progress_line(driver.progress), soft_wrap=True)
            if (
                kill_learner_at is not None
                and not killed
                and time.monotonic() - started >= kill_learner_at
                and driver.learner is not None
                and driver.learner.pid is not None
            ):
                os.kill(driver.learner.pid, signal.SIGKILL)
                killed = True
                console.print(f"SIGKILLed the learner (pid) at {kill_learner_at:.0f}s")
        run = driver.ctx.store.get_run(driver.run_id)
        final = {**driver.progress, "state": run.state.value if run else "?"}
        live.update(_table(final, spec.tasks, spec.algorithm))
    if not console.is_terminal:
        console.line()  # the table's last line is not ended off a terminal


def _progress_line(progress: dict[str, Any]) -> str:
    """One line of the run's figures for output that is not a terminal."""
    mean = progress.get("success_mean")
    return (
        f"{progress.get('elapsed_s', 0.0) / 60:.1f} min: "
        f"version {progress.get('policy_version', 0)}, "
        f"{progress.get('env_steps', 0)} env steps, "
        f"intervention rate {progress.get('intervention_rate', 0.0):.2f}, "
        f"success {'-' if mean is None else f'{mean:.2f}'}"
    )


def _report(
    console: Console, cloud: CloudService, run_id: str, result: dict[str, Any], *, as_json: bool
) -> int:
    """Print how the run ended, its report and plots and the summary (:data:`SUMMARY_KEYS`;
    one JSON line when ``as_json``); 0 when the run left a result, else 1."""
    run = cloud.store.get_run(run_id) if cloud.store else None
    reason = f" ({run.reason})" if run and run.reason else ""
    console.print(f"run ended: {run.state.value if run else '?'}{reason}")
    if result:
        console.print(f"report: {result.get('report')}")
        for p in result.get("plots", []):
            console.print(f"plot: {p}")
    summary = {k: result.get(k) for k in SUMMARY_KEYS}
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        console.print_json(json.dumps(summary))
    return 0 if result else 1
