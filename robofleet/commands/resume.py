"""``robofleet resume RUN``: continue a paused run on its robots, or a stopped or crashed run
from its last checkpoint.

Marks the run ``resuming``; the running ``robofleet cloud`` picks it up within a second (or the
next one to start). The run keeps its buffer, checkpoints, curves and robots' spools.
Exit codes: 0 requested, 2 unknown run or a state that cannot resume.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from foundation.clitext import plain_text


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(
        prog="robofleet resume", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("run_id", help="the run's id (robofleet run list)")
    args = p.parse_args(list(argv))
    from foundation.store.metadata_store import MetadataStore, upgrade
    from foundation.store.runs import RunNotFound, RunStateError
    from robofleet.settings import load_settings
    from runs.manager import QueuedRunManager
    from runs.pidfile import cloud_running

    settings = load_settings(args.config)
    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    try:
        QueuedRunManager(store, settings.data_dir).resume(args.run_id, actor="cli")
    except (RunNotFound, RunStateError) as exc:
        print(f"robofleet resume: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    note = "" if cloud_running(settings.data_dir) else " (starts with `robofleet cloud`)"
    print(f"resuming {args.run_id}{note}")
    return 0
