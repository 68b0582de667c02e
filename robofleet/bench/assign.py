"""``robofleet bench assign``: how fast idle robot computers join a run and leave it.

For each robot count (``--robots 4,16``) a fresh cloud (:class:`robofleet.cloud.
CloudService`, SQLite in a temporary directory) starts that many simulated robot computers
(``robofleet edge`` processes with Meta-World Sawyers, :mod:`robofleet.sim.computers`),
launches one HG-DAgger run on all of them and stops it once every robot acts. Measured per
robot, from the metadata store (polled every 50 ms):

* ``cold_start_s`` (the baseline, side by side): process spawned -> enrolled and reporting
  idle: what a robot computer bound to one run at install time pays again for every run;
* ``assign_s``: run launched -> the robot's heartbeat says it acts in the run (driver
  connected, policy built, uplink and weight subscription up);
* ``release_s``: stop requested -> the robot reports idle again (episode finished at a safe
  boundary, spool drained, final report sent).

The table gives p50 and max of each; the last stdout line is one JSON object with them and
``assign_vs_cold_start`` (assign p50 / cold-start p50) per robot count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from foundation.clitext import plain_text

POLL_S = 0.05


def _stats(store: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    from sqlalchemy import select

    from foundation.store.models import Robot

    with store.session() as s:
        rows = s.execute(select(Robot.name, Robot.stats).where(Robot.name.in_(list(names))))
        return {name: dict(stats or {}) for name, stats in rows}


def _wait_each(
    store: Any, names: Sequence[str], done: Callable[[dict[str, Any]], bool], t0: float
) -> dict[str, float]:
    """Seconds from ``t0`` (monotonic) until ``done(stats)`` held for each robot."""
    when: dict[str, float] = {}
    deadline = t0 + 600
    while len(when) < len(names):
        if time.monotonic() > deadline:
            missing = sorted(set(names) - set(when))
            raise TimeoutError(f"robots {missing} did not get there within 600 s")
        now = time.monotonic()
        for name, stats in _stats(store, names).items():
            if name not in when and done(stats):
                when[name] = now - t0
        time.sleep(POLL_S)
    return when


def _first_reports(store: Any, names: Sequence[str], spawned_at: datetime) -> dict[str, float]:
    """Seconds from ``spawned_at`` to each robot's first report (its enrolment event)."""
    from sqlalchemy import select

    from foundation.store.models import Event, Robot

    with store.session() as s:
        ids = dict(s.execute(select(Robot.id, Robot.name).where(Robot.name.in_(list(names)))).all())
        rows = s.execute(
            select(Event.robot_id, Event.created_at)
            .where(Event.kind == "robot.status", Event.robot_id.in_(list(ids)))
            .order_by(Event.id)
        )
        first: dict[str, float] = {}
        for robot_id, at in rows:
            name = ids[robot_id]
            first.setdefault(name, (at - spawned_at).total_seconds())
    return first


def measure(robots: int, config: str | None = None) -> dict[str, dict[str, float]]:
    """One cloud with ``robots`` simulated robot computers: cold start, assign, release."""
    from robofleet.cloud import CloudService
    from robofleet.commands.demo import sim_fleet_spec
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robot_names, sim_robots

    with tempfile.TemporaryDirectory(prefix="bench-assign-") as tmp:
        settings = load_settings(config, data_dir=Path(tmp))
        cloud = CloudService(
            settings,
            robots=sim_robots(robots),
            dashboard_port=None,
            grpc_port=0,
            auto_resume=False,
        )
        spawned_at = datetime.now(UTC)
        cloud.start()
        try:
            assert cloud.store is not None and cloud.manager is not None
            names = sim_robot_names(robots)
            cold = _first_reports(cloud.store, names, spawned_at)
            spec = sim_fleet_spec(
                f"bench-assign-{robots}",
                "hg-dagger",
                ["reach-v3"],
                robots,
                minutes=30.0,
                eval_every_s=3600.0,
                eval_episodes=1,
            )
            t0 = time.monotonic()
            run_id = cloud.manager.launch(spec, actor="bench")
            assign = _wait_each(
                cloud.store,
                names,
                lambda st: st.get("run_id") == run_id and st.get("state") == "running",
                t0,
            )
            t1 = time.monotonic()
            cloud.manager.stop(run_id, actor="bench")
            release = _wait_each(
                cloud.store,
                names,
                lambda st: st.get("run_id") == run_id and st.get("state") == "idle",
                t1,
            )
        finally:
            closing = threading.Thread(target=cloud.close, daemon=True)
            closing.start()
            closing.join(180)
    return {"cold_start_s": cold, "assign_s": assign, "release_s": release}


def _summary(values: dict[str, float]) -> dict[str, float]:
    v = sorted(values.values())
    return {"p50": round(statistics.median(v), 3), "max": round(v[-1], 3)} if v else {}


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="robofleet bench assign", description=plain_text(__doc__))
    p.add_argument("--robots", default="4,16", help="robot counts, comma separated")
    p.add_argument("--config", default=None, help="settings file for the clouds")
    args = p.parse_args(list(argv) if argv is not None else None)
    counts = [int(n) for n in args.robots.split(",") if n.strip()]
    results: dict[str, Any] = {}
    table = Table(title="robot computers: join and leave a run (seconds)")
    for column in ("robots", "cold start p50", "max", "assign p50", "max", "release p50", "max"):
        table.add_column(column, justify="right")
    for n in counts:
        got = {k: _summary(v) for k, v in measure(n, args.config).items()}
        cold, assign = got["cold_start_s"], got["assign_s"]
        ratio = round(assign["p50"] / cold["p50"], 3) if cold.get("p50") else None
        results[str(n)] = {**got, "assign_vs_cold_start": ratio}
        table.add_row(
            str(n),
            *(
                f"{got[k][q]:.2f}"
                for k in ("cold_start_s", "assign_s", "release_s")
                for q in ("p50", "max")
            ),
        )
    Console().print(table)
    print(json.dumps({"bench": "assign", "robots": results}))
    return 0
