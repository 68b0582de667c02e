"""``robofleet run launch SPEC | list | stop RUN | pause RUN | promote RUN``: runs through the
metadata store.

``launch`` validates the spec (every bad field named; a spec asking for robots the fleet does
not have is refused, nothing recorded) and records a ``pending`` run that the running
``robofleet cloud`` starts within a second. ``stop`` asks the cloud to end a run (final
checkpoint, evaluation and report); with no cloud running the run is marked stopped at once.
``pause`` asks the cloud to stop the run's edge agents while the run keeps its robots' leases
(``robofleet resume RUN`` starts them again on the same robots). ``promote`` makes a version
of a run (default its newest, ``--version N`` one still on disk) the one a later run's
``policy.init_from_run`` starts from (a run that ends promotes its best evaluated version
itself, ``runs.promotion``, and none without evaluations).
Exit codes: 0 done, 2 invalid spec or request.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from foundation.clitext import plain_text

RUN_ID_HELP = "the run's id (robofleet run list)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet run", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    sub = p.add_subparsers(dest="action", required=True)
    launch = sub.add_parser("launch", help="launch a run from a YAML/JSON spec")
    launch.add_argument("spec", help="the run spec file (YAML or JSON)")
    launch.add_argument("--json", action="store_true", help='print {"run_id": ...} as JSON')
    ls = sub.add_parser("list", help="list runs")
    ls.add_argument("--json", action="store_true", help="print JSON")
    stop = sub.add_parser("stop", help="stop a run")
    stop.add_argument("run_id", help=RUN_ID_HELP)
    pause = sub.add_parser("pause", help="pause a run (robots hold, leases kept)")
    pause.add_argument("run_id", help=RUN_ID_HELP)
    promote = sub.add_parser("promote", help="promote a policy version of a run")
    promote.add_argument("run_id", help=RUN_ID_HELP)
    promote.add_argument("--version", type=int, default=None, help="default: the newest")
    return p


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
    from cloud_learner.run_plan import parse_spec
    from foundation.runspec import RunSpecError, load_run_spec
    from foundation.store.metadata_store import MetadataStore, upgrade
    from foundation.store.models import Run
    from foundation.store.runs import RunNotFound, RunStateError
    from robofleet.settings import load_settings
    from runs.manager import QueuedRunManager
    from runs.pidfile import cloud_running

    settings = load_settings(args.config)
    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    manager = QueuedRunManager(store, settings.data_dir)
    try:
        if args.action == "launch":
            try:
                run_id = manager.launch(load_run_spec(args.spec, parse_spec), actor="cli")
            except RunSpecError as exc:
                print(f"robofleet run launch: {exc}", file=sys.stderr)
                return 2
            if args.json:
                print(json.dumps({"run_id": run_id}))
            else:
                print(f"launched {run_id}")
                if cloud_running(settings.data_dir) is None:
                    print("no cloud is running: the run starts with `robofleet cloud`")
            return 0
        if args.action == "promote":
            from runs.starting import PromotionError, promote_from_disk

            try:
                version = promote_from_disk(store, args.run_id, args.version)
            except PromotionError as exc:
                print(f"robofleet run promote: {exc}", file=sys.stderr)
                return 2
            print(f"promoted version {version} of {args.run_id}")
            return 0
        if args.action == "list":
            with store.session() as s:
                runs = list(s.scalars(select(Run).order_by(Run.created_at)))
            _print_runs(runs, args.json)
            return 0
        try:
            getattr(manager, args.action)(args.run_id, actor="cli")
        except (RunNotFound, RunStateError) as exc:
            print(f"robofleet run {args.action}: {exc}", file=sys.stderr)
            return 2
        if args.action == "pause":
            print(f"pausing {args.run_id} (robots hold still and stay leased to it)")
        elif cloud_running(settings.data_dir) is None:
            print(f"stopped {args.run_id}")
        else:
            print(f"stopping {args.run_id} (the cloud writes the final checkpoint and report)")
        return 0
    finally:
        store.close()


def _print_runs(runs: Sequence[Any], as_json: bool) -> None:
    rows = [
        {
            "run_id": r.id,
            "name": r.name,
            "state": r.state.value,
            "reason": r.reason,
            "created_at": r.created_at.isoformat(),
        }
        for r in runs
    ]
    if as_json:
        print(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table("run", "name", "state", "reason", "created")
    for row in rows:
        t.add_row(row["run_id"], row["name"], row["state"], row["reason"], row["created_at"])
    Console().print(t)
