"""``robofleet data import | export | ls | inspect | rm``: datasets a lab has, as offline data.

``import SOURCE --into NAME`` reads a LeRobotDataset v3 directory, a robofleet buffer or ROS 2
bag(s) (``lab_data.registry``) into the catalog (``<data_dir>/datasets``,
``lab_data.catalog``), where a run's ``buffer.offline_data`` mounts it. ``export RUN|NAME
--format lerobot --out DIR`` writes a run's buffer (``<data_dir>/runs/<id>/buffer``) or a
dataset as a LeRobotDataset v3. ``ls`` lists datasets and runs whose buffers can be mounted;
``inspect`` says what one holds. Long imports and exports show a progress bar on stderr.
Exit codes: 0 done, 2 a user error (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foundation.clitext import plain_text

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet data", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    sub = p.add_subparsers(dest="action", required=True)
    imp = sub.add_parser("import", help="import a dataset or bag(s) into the catalog")
    imp.add_argument("source", help="LeRobotDataset v3 directory, robofleet buffer, ROS 2 bag(s)")
    imp.add_argument("--into", required=True, metavar="NAME", help="the catalog dataset's name")
    imp.add_argument(
        "--format",
        default=None,
        help="a registered format (lerobot, robofleet, ros2, or a plugin's); detected when unset",
    )
    imp.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an importer option (VALUE read as JSON when it parses, else as text)",
    )
    imp.add_argument("--robot-id", default=None, help="the steps' robot_id")
    imp.add_argument("--task", default=None, help="the steps' task name (replaces LeRobot's)")
    imp.add_argument(
        "--ignore-column",
        action="append",
        default=[],
        metavar="C",
        help="a LeRobot column to leave out instead of refusing the dataset",
    )
    imp.add_argument("--joints", default=None, help="ROS 2: joint names, comma-separated")
    imp.add_argument("--state-topic", default=None, help="ROS 2: JointState topic")
    imp.add_argument("--command-topic", default=None, help="ROS 2: command topic ('' for none)")
    imp.add_argument("--json", action="store_true", help="print JSON")
    exp = sub.add_parser("export", help="export a run's buffer or a dataset")
    exp.add_argument("ref", metavar="RUN|NAME", help="a run id, a dataset name or a buffer path")
    exp.add_argument(
        "--format", choices=("lerobot",), default="lerobot", help="LeRobotDataset v3 (the only one)"
    )
    exp.add_argument("--out", required=True, type=Path, help="new directory to write")
    exp.add_argument("--fps", type=int, default=None, help="default: from the timestamps")
    exp.add_argument("--videos", action="store_true", help="MP4 cameras (lossy) instead of PNG")
    exp.add_argument("--repo-id", default=None, help="dataset id in its metadata")
    exp.add_argument("--task", action="append", default=None, help="only this task (repeat)")
    exp.add_argument("--robot", action="append", default=None, help="only this robot (repeat)")
    exp.add_argument("--success-only", action="store_true", help="only successful episodes")
    exp.add_argument("--interventions-only", action="store_true", help="only operator steps")
    exp.add_argument("--json", action="store_true", help="print JSON")
    ls = sub.add_parser("ls", help="list datasets and runs usable as offline data")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ins = sub.add_parser("inspect", help="what a dataset, run or buffer directory holds")
    ins.add_argument(
        "ref", metavar="NAME|RUN|PATH", help="a dataset name, a run id or a buffer path"
    )
    ins.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="delete a catalog dataset")
    rm.add_argument("name", help="the catalog dataset's name")
    return p


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local data only: never reach a hub
    from robofleet.settings import load_settings

    data_dir = Path(load_settings(args.config).data_dir)
    actions: dict[str, Callable[[argparse.Namespace, Path], int]] = {
        "import": _import,
        "export": _export,
        "ls": _ls,
        "inspect": _inspect,
        "rm": _rm,
    }
    try:
        return actions[args.action](args, data_dir)
    except USER_ERRORS as exc:
        print(f"robofleet data {args.action}: {exc}", file=sys.stderr)
        return 2


def catalog(data_dir: Path) -> Any:
    from lab_data.catalog import DatasetCatalog

    return DatasetCatalog(data_dir / "datasets")


def run_buffers(data_dir: Path) -> dict[str, Path]:
    """Run id -> its buffer directory, for runs under ``<data_dir>/runs`` that have one."""
    runs = data_dir / "runs"
    if not runs.is_dir():
        return {}
    return {
        d.name: d / "buffer"
        for d in sorted(runs.iterdir())
        if (d / "buffer" / "schema.json").is_file()
    }


def resolve(data_dir: Path, ref: str) -> tuple[str, Path]:
    """``(kind, buffer directory)`` of a dataset name, a run id or a buffer path.

    Raises:
        ValueError: none of them (names what exists).
    """
    cat = catalog(data_dir)
    if ref in cat.names():
        return "dataset", cat.buffer_dir(ref)
    runs = run_buffers(data_dir)
    if ref in runs:
        return "run", runs[ref]
    if (Path(ref) / "schema.json").is_file():
        return "path", Path(ref)
    raise ValueError(
        f"{ref!r} is no dataset ({', '.join(cat.names()) or 'none'}), no run with a buffer "
        f"({', '.join(runs) or 'none'}) and no buffer directory"
    )


@contextmanager
def progress_bar(label: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields ``update(done, total)``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=True,
    )
    task = bar.add_task(label, total=None)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _import(args: argparse.Namespace, data_dir: Path) -> int:
    from lab_data.registry import detect_format, import_data, importer

    source = Path(args.source)
    fmt = importer(args.format).format if args.format else detect_format(source)
    options: dict[str, Any] = dict(_option(o) for o in args.option)
    if args.ignore_column:
        options["ignore_columns"] = list(args.ignore_column)
    if args.joints:
        options["joints"] = [j.strip() for j in args.joints.split(",") if j.strip()]
    if args.state_topic:
        options["state_topic"] = args.state_topic
    if args.command_topic is not None:
        options["command_topic"] = args.command_topic or None
    cat = catalog(data_dir)
    with _quiet_libraries(), progress_bar(f"importing {source.name}", not args.json) as update:

        def fill(dest: Path) -> None:
            import_data(
                source,
                dest,
                format=fmt,
                robot_id=args.robot_id,
                task=args.task,
                progress=update,
                **options,
            )

        cat.create(args.into, fill, format=fmt, source=source.resolve())
    info = cat.info(args.into)
    if args.json:
        print(json.dumps(info))
    else:
        print(
            f"imported {args.into}: {info['rows']} steps, {info['episodes']} episodes, "
            f"{info['intervention_rows']} intervention steps, "
            f"{info['successful_episodes']} successful episodes "
            f"({cat.buffer_dir(args.into)})"
        )
    return 0


def _export(args: argparse.Namespace, data_dir: Path) -> int:
    from buffer.table.replay_buffer import ReplayBuffer
    from foundation.rows import RowFilter
    from lab_data.lerobot_io import export_lerobot

    _kind, buffer_dir = resolve(data_dir, args.ref)
    if args.out.exists():
        raise FileExistsError(f"--out {args.out} exists already")
    keep = RowFilter(
        tasks=args.task or None,
        robot_ids=args.robot or None,
        success_only=args.success_only,
        interventions_only=args.interventions_only,
    )
    with ReplayBuffer.open(buffer_dir, read_only=True) as buf:
        fps = args.fps or estimate_fps(buf)
        with _quiet_libraries(), progress_bar(f"exporting {args.ref}", not args.json) as update:
            export_lerobot(
                buf,
                args.out,
                args.repo_id or f"local/{args.out.name}",
                fps,
                use_videos=args.videos,
                progress=update,
                keep=keep,
            )
    frames = _lerobot_frames(args.out)
    result = {"out": str(args.out), "fps": fps, "frames": frames, "format": args.format}
    done = f"exported {frames} frames at {fps} fps to {args.out}"
    print(json.dumps(result) if args.json else done)
    return 0


def _lerobot_frames(root: Path) -> int:
    info = json.loads((root / "meta" / "info.json").read_text())
    return int(info.get("total_frames", 0))


def estimate_fps(buf: Any) -> int:
    """Frames per second from consecutive steps' timestamps (median), else 10."""
    import numpy as np

    idx = buf.index
    lo, hi = buf.first_row - idx.base, buf.visible - idx.base
    nxt = idx.cols["next_row"][lo:hi]
    has = nxt >= 0
    if not has.any():
        return 10
    dt = idx.cols["timestamp"][nxt[has] - idx.base] - idx.cols["timestamp"][lo:hi][has]
    dt = dt[dt > 0]
    return max(1, round(1.0 / float(np.median(dt)))) if dt.size else 10


def _option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--option``: VALUE as JSON when it parses, else as text.

    Raises:
        ValueError: no ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--option {text!r}: expected KEY=VALUE")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _ls(args: argparse.Namespace, data_dir: Path) -> int:
    from lab_data.catalog import describe

    cat = catalog(data_dir)
    rows = [{"kind": "dataset", "name": n, **_brief(cat.info(n))} for n in cat.names()]
    for run_id, path in run_buffers(data_dir).items():
        rows.append({"kind": "run", "name": run_id, **_brief(describe(path))})
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("kind", "name", "steps", "episodes", "tasks", "successful", "format")
    for r in rows:
        table.add_row(
            r["kind"],
            r["name"],
            str(r["rows"]),
            str(r["episodes"]),
            ", ".join(r["tasks"]),
            str(r["successful_episodes"]),
            r.get("format") or "robofleet",
        )
    Console().print(table if rows else f"no datasets or run buffers under {data_dir}")
    return 0


def _brief(info: dict[str, Any]) -> dict[str, Any]:
    keys = ("rows", "episodes", "successful_episodes", "intervention_rows", "format", "source")
    return {"tasks": sorted(info["tasks"]), **{k: info.get(k) for k in keys}}


def _inspect(args: argparse.Namespace, data_dir: Path) -> int:
    from lab_data.catalog import describe

    kind, path = resolve(data_dir, args.ref)
    info = {"kind": kind, "buffer": str(path), **describe(path)}
    if kind == "dataset":
        info["provenance"] = {
            k: catalog(data_dir).info(args.ref).get(k) for k in ("format", "source", "imported_at")
        }
    if args.json:
        print(json.dumps(info))
        return 0
    _print_info(args.ref, info)
    return 0


def _print_info(ref: str, info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    share = info["success_share"]
    con.print(
        f"[bold]{ref}[/] ({info['kind']}, {info['buffer']}): {info['rows']} steps, "
        f"{info['episodes']} episodes, {info['bytes_on_disk'] / 1e6:.1f} MB on disk\n"
        f"interventions: {info['intervention_rows']} steps "
        f"({100 * info['intervention_share']:.1f} %); successful episodes: "
        f"{info['successful_episodes']}"
        + (f" ({100 * share:.1f} %)" if share is not None else " (no outcomes recorded)")
    )
    feats = Table("feature", "dtype", "shape")
    for name, f in info["features"].items():
        feats.add_row(name, f["dtype"], "x".join(map(str, f["shape"])))
    tasks = Table("task", "steps")
    for name, n in sorted(info["tasks"].items()):
        tasks.add_row(name, str(n))
    con.print(feats, tasks)


def _rm(args: argparse.Namespace, data_dir: Path) -> int:
    catalog(data_dir).remove(args.name)
    print(f"removed {args.name}")
    return 0


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Hide LeRobot's and datasets' own progress bars and info logs under ours."""
    import logging

    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(level)
