"""The end-of-run report: ``report.json``, ``report.txt`` and PNG plots in the run directory.

Plots: success rate (mean over tasks and per task, from evaluation episodes) and the operator's
intervention rate, each against wall time (minutes) and against robot-hours. ``acked_lost`` and
each robot's counts (``robots``) come from :mod:`~runs.accounting`; ``human_cost`` (per robot
and per task: takeover time, labels, resets, autonomous successes per hour with and without
resets) from :mod:`~runs.human_cost`; operator minutes and return on human effort, at the end
and over time, from :mod:`~runs.operator_effort`. ``report.txt`` is the summary and the human-cost table
as text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comms.cloud.weight_file import latest_version
from foundation.runspec import RunSpec
from runs.accounting import RobotAccount
from runs.human_cost import human_cost, text_table
from runs.offline import read_provenance
from runs.starting import promoted_version, read_promotion


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def write_report(
    run_dir: Path,
    run_id: str,
    spec: RunSpec,
    *,
    learner_restarts: int,
    accounts: Mapping[str, RobotAccount],
    elapsed_s: float,
    setup_s: float | None = None,
    robot_reports: Mapping[str, Mapping[str, float]] | None = None,
    promotion: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``report.json`` and the plots; returns the report's summary keys.

    ``env_steps`` are the robots' transitions in the run's buffer, ``offline_steps`` its
    demonstration (offline) rows, apart. ``elapsed_s`` is the run's clock (from the moment the robots are up and the first policy
    version is out); ``setup_s`` the learner's start-up and BC warm start and the edge agents'
    start-up before it (None when unknown, e.g. a resumed run); ``accounts`` each robot's
    acknowledged, lost and buffered steps (``accounting.robot_accounts``); ``robot_reports``
    each robot's final heartbeat statistics by name (its human cost, ``runs.human_cost``);
    ``promotion`` what the run's end promoted and on what evidence, or why nothing
    (``runs.promotion.promote_best``; None: not decided here, e.g. a report written again).
    Each ``evaluations`` row names who scored its episodes (``scored_by``: ``driver``,
    ``operator``, ``classifier``, ``simulator``).
    """
    evals = _read_jsonl(run_dir / "evals.jsonl")
    progress = _read_jsonl(run_dir / "progress.jsonl")
    versions = latest_version(run_dir / "weights")
    effort = _read_jsonl(run_dir / "effort.jsonl")
    last_effort = effort[-1] if effort else {}
    last = progress[-1] if progress else {}
    summary: dict[str, Any] = {
        "initial_success": evals[0]["success_mean"] if evals else None,
        "final_success": evals[-1]["success_mean"] if evals else None,
        "minutes": round(elapsed_s / 60, 3),
        "env_steps": int(last.get("env_steps", 0)),
        "offline_steps": int(last.get("offline_steps", 0)),
        "interventions": int(last.get("interventions", 0)),
        "discarded_episodes": int(last.get("discarded_episodes", 0)),
        "versions_published": int(versions),
        "acked_lost": sum(a.lost for a in accounts.values()),
        "learner_restarts": learner_restarts,
        # Fleet-DAgger's return on human effort (runs.operator_effort).
        "operator_minutes": last_effort.get("operator_minutes"),
        "autonomous_successes": last_effort.get("autonomous_successes"),
        "return_on_human_effort": last_effort.get("return_on_human_effort"),
        "help_requests": last_effort.get("help_requests"),
    }
    plots = _plots(run_dir, evals, progress, spec)
    if effort:
        plots.append(_effort_plot(run_dir, evals, effort))
    report = {
        "run_id": run_id,
        **summary,
        "robot_hours": last.get("robot_hours", 0.0),
        "setup_s": setup_s,
        "initial_success_per_task": evals[0]["success"] if evals else {},
        "final_success_per_task": evals[-1]["success"] if evals else {},
        # acknowledged steps retention deleted (stored, so not in acked_lost)
        "acked_retention_deleted": sum(a.retention_deleted for a in accounts.values()),
        "robots": {key: dataclasses.asdict(a) for key, a in accounts.items()},
        "evaluations": evals,
        "plots": plots,
        "spec": spec.model_dump(mode="json"),
        # Where the run's data and weights came from, and the mix it trained on.
        "offline_data": read_provenance(run_dir),
        "online_share_per_task": last.get("online_share", {}),
        # reward.source: classifier: the last classifier version's held-out figures.
        "reward_classifier": last.get("reward_classifier"),
        "online_share_over_time": [
            {"wall_s": p["wall_s"], "env_steps": p["env_steps"], **p["online_share"]}
            for p in progress
            if p.get("online_share")
        ],
        "started_from": _started_from(spec),
        "promoted_version": promoted_version(run_dir),
        "human_cost": human_cost(robot_reports or {}),
        "operators": spec.help.operators,
        # Beside success over time (evaluations): operator minutes and return on effort.
        "effort_over_time": effort,
        "promotion": dict(promotion) if promotion is not None else read_promotion(run_dir),
        "reward_source": spec.reward.source,
        # Gateway robots (LeRobot's actors): steps whose reward the run's source replaced.
        "lerobot_rewards_replaced": _replaced(robot_reports or {}),
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    lines = {**summary, "promoted": _promoted_line(report["promotion"])}
    if report["lerobot_rewards_replaced"]:
        lines["reward"] = _replaced_line(spec.reward.source, report["lerobot_rewards_replaced"])
    (run_dir / "report.txt").write_text(_text(run_id, lines, report["human_cost"]))
    return {**summary, "report": str(run_dir / "report.json"), "plots": plots}


def _text(run_id: str, summary: Mapping[str, Any], cost: Mapping[str, Any]) -> str:
    """The summary, one ``key: value`` a line, then the human-cost table."""
    lines = [f"run {run_id}", *(f"{k}: {v}" for k, v in summary.items()), ""]
    lines.append("human cost (s: seconds; auto: autonomous episodes; ok/h: their successes")
    lines.append("per hour, excluding / including the resets after them)")
    return "\n".join(lines) + "\n" + text_table(cost)


def _replaced(robot_reports: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """Robot name -> steps whose reward LeRobot's actor sent and the run's reward source
    replaced (``robofleet lerobot-gateway``'s ``lerobot.rewards_replaced``), where any."""
    out = {}
    for name, stats in robot_reports.items():
        n = int(stats.get("lerobot.rewards_replaced", 0))
        if n > 0:
            out[name] = n
    return out


def _replaced_line(source: str, replaced: Mapping[str, int]) -> str:
    robots = ", ".join(f"{name} {n}" for name, n in sorted(replaced.items()))
    return f"{source} replaced the reward LeRobot's actor sent (steps: {robots})"


def _promoted_line(promotion: Mapping[str, Any] | None) -> str:
    """What the run promoted, on what evidence, in one line (``runs.promotion``)."""
    if not promotion or promotion.get("version") is None:
        return f"none ({(promotion or {}).get('why', 'not decided')})"
    ev = promotion.get("evidence")
    if not ev:
        return f"version {promotion['version']} ({promotion.get('by', 'manual')})"
    by = ", ".join(f"{k} {n}" for k, n in ev["scored_by"].items()) or "unknown"
    return (
        f"version {promotion['version']}: success {ev['success']:.2f} over {ev['episodes']} "
        f"evaluation episodes (scored by {by})"
    )


def _started_from(spec: RunSpec) -> dict[str, str] | None:
    """The starting weights the spec named (None: from scratch)."""
    p = spec.policy
    if p.init_from_run is not None:
        return {"run": p.init_from_run}
    if p.init_checkpoint is not None:
        return {"checkpoint": p.init_checkpoint}
    return None


def _plots(
    run_dir: Path, evals: list[dict[str, Any]], progress: list[dict[str, Any]], spec: RunSpec
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for xkey, xlabel, scale, name in (
        ("wall_s", "wall time (min)", 1 / 60, "vs_wall_time"),
        ("robot_hours", "robot-hours", 1.0, "vs_robot_hours"),
    ):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        if evals:
            xs = [e[xkey] * scale for e in evals]
            ax1.plot(xs, [e["success_mean"] for e in evals], "k-o", lw=2, label="mean")
            for task in spec.tasks:
                ax1.plot(
                    xs, [e["success"].get(task, 0.0) for e in evals], "--", alpha=0.6, label=task
                )
            ax1.legend(fontsize=7)
        ax1.set_xlabel(xlabel)
        ax1.set_ylabel("success rate (policy alone)")
        ax1.set_ylim(-0.05, 1.05)
        ax1.grid(alpha=0.3)
        xs2, rates = smoothed_rate(progress, xkey)
        if xs2:
            ax2.plot([x * scale for x in xs2], rates, "r-")
        ax2.set_xlabel(xlabel)
        ax2.set_ylabel("intervention rate (share of steps, 30 s window)")
        ax2.set_ylim(-0.05, 1.05)
        ax2.grid(alpha=0.3)
        fig.suptitle(f"{spec.name or 'run'}: {spec.algorithm} on {len(spec.tasks)} tasks")
        fig.tight_layout()
        path = run_dir / f"report_{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        out.append(str(path))
    return out


def _effort_plot(run_dir: Path, evals: list[dict[str, Any]], effort: list[dict[str, Any]]) -> str:
    """``report_effort.png``: success and return on human effort (autonomous successes per
    operator minute) over wall time, and operator minutes over wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if evals:
        ax1.plot([e["wall_s"] / 60 for e in evals], [e["success_mean"] for e in evals], "k-o")
    ax1.set_xlabel("wall time (min)")
    ax1.set_ylabel("success rate (policy alone)")
    ax1.set_ylim(-0.05, 1.05)
    ax1.grid(alpha=0.3)
    rohe = [(r["wall_s"] / 60, r["return_on_human_effort"]) for r in effort]
    rohe = [(x, y) for x, y in rohe if y is not None]
    twin = ax1.twinx()
    if rohe:
        twin.plot(*zip(*rohe, strict=True), "b-o", ms=3)
    twin.set_ylabel("autonomous successes per operator minute", color="b")
    ax2.plot(
        [r["wall_s"] / 60 for r in effort], [r["operator_minutes"] for r in effort], "g-o", ms=3
    )
    ax2.set_xlabel("wall time (min)")
    ax2.set_ylabel("operator minutes (people busy)")
    ax2.grid(alpha=0.3)
    fig.suptitle("return on human effort")
    fig.tight_layout()
    path = run_dir / "report_effort.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def smoothed_rate(
    progress: list[dict[str, Any]], xkey: str, window_s: float = 30.0
) -> tuple[list[float], list[float]]:
    """Interventions / env steps over the trailing ``window_s`` of wall time, from the
    cumulative counts (points before the robots' first step are left out). Where rows are
    further apart than ``window_s`` (the older part of a thinned ``progress.jsonl``) the rate
    is over the gap to the previous row."""
    xs: list[float] = []
    rates: list[float] = []
    j = 0
    for i, p in enumerate(progress):
        while progress[j]["wall_s"] < p["wall_s"] - window_s:
            j += 1
        j = min(j, i - 1) if i else 0
        steps = p["env_steps"] - progress[j]["env_steps"]
        if steps > 0 and i > j:
            xs.append(p[xkey])
            rates.append((p["interventions"] - progress[j]["interventions"]) / steps)
    return xs, rates
