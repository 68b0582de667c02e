"""The figures of ``robofleet bench soak`` at its end: the summary object (its JSON line) and
its tables."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

from robofleet.bench.soak_probe import judge

STEP_KEYS = (
    "acked", "stored", "retention_deleted", "lost", "unverified", "stored_twice", "unacked_rows",
)  # fmt: skip
# The least change of a series that counts (besides soak_probe.REL_TOL of its median).
TOLERANCES = (
    ("rss MiB", 16.0),
    ("fds", 4.0),
    ("threads", 4.0),
    ("sockets", 4.0),
    ("MiB", 1.0),
    ("rows", 1.0),
)


def tolerance(series: str) -> float:
    """The absolute tolerance of ``series`` (by the end of its name)."""
    for suffix, tol in TOLERANCES:
        if series.endswith(suffix) or f" {suffix} " in f" {series} ":
            return tol
    return 0.0


def resource_verdicts(series: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, Any]]:
    """Series name -> its verdict over the second half (``soak_probe.judge``) as a dict."""
    out = {}
    for name, points in sorted(series.items()):
        v = judge(points, tolerance(name))
        out[name] = {**asdict(v), "slope_per_h": round(v.slope_per_h, 3)}
    return out


def final_seqs(run_dir: Any, robots: Any) -> dict[str, Any]:
    """Each robot's seqs in the run's buffer as it was left (opened read-only: its sealed
    segments and any write-ahead log a crash left; not those retention deleted); empty when
    it holds no buffer."""
    from buffer import ReplayBuffer

    if not (run_dir / "buffer" / "schema.json").exists():
        return {}
    buf = ReplayBuffer.open(run_dir / "buffer", read_only=True)
    try:
        return {k: buf.stored_seqs(k, retired=False) for k in robots}
    finally:
        buf.close()


LIFECYCLE_KINDS = ("run.resuming", "learner.restarted")


def lifecycle_events(store: Any) -> set[tuple[str, str, int]]:
    """``(run id, kind, event id)`` of every :data:`LIFECYCLE_KINDS` event the metadata store
    holds now. The soak's sampler collects them as it goes: metadata retention keeps only the
    newest few of each kind, so the store alone cannot count an hour's resumes at the end."""
    from sqlalchemy import select

    from foundation.store.models import Event

    with store.session() as s:
        rows = s.execute(
            select(Event.run_id, Event.kind, Event.id).where(Event.kind.in_(LIFECYCLE_KINDS))
        ).all()
    return {(str(r), str(k), int(i)) for r, k, i in rows if r is not None}


def _run_figures(soak: Any, name: str, run_id: str) -> dict[str, Any]:
    from sqlalchemy import func, select

    from foundation.store.models import PolicyVersion, Robot
    from robofleet.bench.soak_fleet import run_row
    from robofleet.bench.soak_ledger import count_steps
    from runs.accounting import acked_seqs

    state, run_dir, reason = run_row(soak.store, run_id)
    ledger = soak.ledgers.get(name)
    spools = sorted(soak.work.glob(f"robots/*/robots/*/runs/{run_id}"))
    acked = acked_seqs(spools)
    counts = (
        count_steps(ledger, ledger.on_disk(), acked, final_seqs(run_dir, acked)) if ledger else {}
    )
    with soak.store.session() as s:
        names = {str(i): n for i, n in s.execute(select(Robot.id, Robot.name))}
        # The newest version, not a count of rows: metadata retention thins old version rows.
        published = s.scalar(
            select(func.max(PolicyVersion.version)).where(PolicyVersion.run_id == run_id)
        )
    seen = soak.lifecycle | lifecycle_events(soak.store)
    kinds = {k: sum(1 for r, kind, _ in seen if r == run_id and kind == k) for k in LIFECYCLE_KINDS}
    return {
        "run_id": run_id,
        "state": str(state),
        "reason": reason,
        "versions_published": int(published or 0),
        "resumes": int(kinds.get("run.resuming", 0)),
        "learner_restarts": int(kinds.get("learner.restarted", 0)),
        "segments_unreadable": ledger.unreadable if ledger else 0,
        "rows_unseen": ledger.rows_unseen() if ledger else 0,
        "robots": {names.get(k, k): asdict(c) for k, c in counts.items()},
    }


def summary(soak: Any, finished_states: dict[str, Any]) -> dict[str, Any]:
    """The soak's figures (the JSON line): ``runs`` (per run: state, versions published,
    resumes, per robot its steps), ``steps`` (totals), ``faults`` (per kind: injected, failed,
    what each did), ``resources`` (per series its verdict), ``growing`` (those that grow),
    ``finished`` and ``ok`` (finished, nothing lost or stored twice, every fault injected)."""
    runs = {name: _run_figures(soak, name, run_id) for name, run_id in soak.runs.items()}
    steps = {k: 0 for k in STEP_KEYS}
    for r in runs.values():
        for c in r["robots"].values():
            for k in STEP_KEYS:
                steps[k] += c[k]
    steps["rows_unseen"] = sum(r["rows_unseen"] for r in runs.values())
    faults = {
        kind: {
            "injected": sum(1 for d in done if "error" not in d),
            "failed": sum(1 for d in done if "error" in d),
            "details": done,
        }
        for kind, done in soak.faults.items()
    }
    resources = resource_verdicts(soak.series)
    finished = all(str(st[0]) == "finished" for st in finished_states.values())
    ok = (
        finished
        and steps["lost"] == 0
        and steps["unverified"] == 0
        and steps["stored_twice"] == 0
        and steps["acked"] > 0
        and all(f["injected"] > 0 and f["failed"] == 0 for f in faults.values())
    )
    return {
        "bench": "soak",
        "minutes": soak.args.minutes,
        "robots": soak.args.robots,
        "finished": finished,
        "ok": ok,
        "steps": steps,
        "runs": runs,
        "faults": faults,
        "resources": resources,
        "growing": sorted(k for k, v in resources.items() if v["kind"] == "growing"),
        "disk": "tmpfs" if soak.disk is not None else soak.disk_refused,
    }


def print_tables(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"soak: {s['minutes']:g} min, {s['robots']} robots: steps per robot")
    for col in ("run", "robot", "acked", "stored", "deleted by retention", "lost",
                "unverified (unseen rows)", "stored twice", "unacked rows", "versions applied",
                "last version"):  # fmt: skip
        t.add_column(col, justify="right")
    for run, r in s["runs"].items():
        for robot, c in r["robots"].items():
            t.add_row(run, robot, *(str(c[k]) for k in STEP_KEYS),
                      str(c["versions"]), str(c["last_version"]))  # fmt: skip
    st = s["steps"]
    t.add_row("all", "", *(str(st[k]) for k in STEP_KEYS), "", "")
    console.print(t)
    r = Table(title="runs")
    for col in ("run", "state", "versions published", "resumes", "learner restarts",
                "rows unseen by the ledger"):  # fmt: skip
        r.add_column(col, justify="right")
    for run, x in s["runs"].items():
        r.add_row(run, f"{x['state']} {x['reason']}".strip(), str(x["versions_published"]),
                  str(x["resumes"]), str(x["learner_restarts"]), str(x["rows_unseen"]))  # fmt: skip
    console.print(r)
    f = Table(title="faults")
    for col in ("fault", "injected", "failed", "last"):
        f.add_column(col, justify="right" if col != "last" else "left")
    for kind, x in s["faults"].items():
        last = x["details"][-1] if x["details"] else {}
        f.add_row(kind, str(x["injected"]), str(x["failed"]), str(last)[:90])
    console.print(f)
    res = Table(title="resources over the second half of the run")
    for col in ("series", "first", "last", "peak", "slope /h", "verdict"):
        res.add_column(col, justify="right")
    for name, v in s["resources"].items():
        unit = name.rsplit(" ", 1)[-1] if name.endswith("MiB") else "/h"
        verdict = v["kind"] if v["kind"] != "growing" else f"growing {v['slope_per_h']:+.3g}"
        res.add_row(name, f"{v['first']:.1f}", f"{v['last']:.1f}", f"{v['peak']:.1f}",
                    f"{v['slope_per_h']:+.3g}", verdict + ("" if unit == "/h" else ""))  # fmt: skip
    console.print(res)
    console.print(
        f"finished: {s['finished']}  lost: {st['lost']}  unverified: {st['unverified']}  "
        f"stored twice: {st['stored_twice']}  "
        f"growing: {', '.join(s['growing']) or 'none'}"
    )
