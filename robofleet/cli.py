"""The ``robofleet`` command line: parses the top level and dispatches.

Every subcommand is a module of :mod:`robofleet.commands` (or a component's benchmark)
with ``main(argv) -> int``; it parses its own options. Exit code 2: bad settings.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from foundation import __version__

EXIT_BAD_SETTINGS = 2

# Subcommands: name -> (module whose ``main(argv) -> int`` runs it, help).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "robofleet.commands.demo",
        "post-train a simulated Meta-World fleet with HG-DAgger, live",
    ),
    "cloud": (
        "robofleet.commands.cloud",
        "run the cloud side: gRPC services, buffer, learner, run manager, API",
    ),
    "edge": ("robofleet.commands.edge", "run an edge agent on a robot computer"),
    "lerobot-gateway": (
        "robofleet.commands.lerobot_gateway",
        "serve an unmodified LeRobot HIL-SERL actor as a robot of the fleet",
    ),
    "relay": ("robofleet.commands.relay", "run a site relay for the robots of one site"),
    "dashboard": ("robofleet.commands.dashboard", "serve the web dashboard and REST API"),
    "resume": (
        "robofleet.commands.resume",
        "continue a paused run on its robots, or a stopped or crashed run from its last checkpoint",
    ),
    "run": ("robofleet.commands.runs", "launch, list, pause, stop and promote runs"),
    "hal": ("robofleet.commands.hal", "robots and nodes: probe, list, node-command"),
    "data": (
        "robofleet.commands.data",
        "datasets as offline data: import (LeRobot, ROS 2 bags), export, ls, inspect",
    ),
    "robots": (
        "robofleet.commands.robots",
        "enroll a robot: a one-time token and the `robofleet edge` command its computer runs",
    ),
}

# Benchmarks: name -> module with ``main(argv) -> int``. A component measures itself; a
# benchmark that wires several components lives in the roof (robofleet.bench).
BENCHMARKS: dict[str, str] = {
    "buffer": "buffer.bench.suite",
    "crash": "buffer.bench.crash",
    "weights": "comms.bench.weights",
    "transport": "comms.bench.transport",
    "efficiency": "robofleet.bench.efficiency",
    "assign": "robofleet.bench.assign",
    "fleet": "robofleet.bench.fleet",
    "edge": "edge_agent.latency_report",
    "data": "robofleet.bench.data",
    "rewards": "robofleet.bench.rewards",
    "operators": "robofleet.bench.operators",
    "soak": "robofleet.bench.soak",
    "lerobot": "robofleet.bench.lerobot",
}


def _load_main(module: str) -> Callable[[Sequence[str]], int]:
    main: Callable[[Sequence[str]], int] = importlib.import_module(module).main
    return main


def _settings(args: argparse.Namespace) -> Any:
    from robofleet.settings import load_settings

    return load_settings(args.config)


def _cmd_config_show(args: argparse.Namespace) -> int:
    settings = _settings(args)
    data = settings.masked()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        import yaml
        from rich.console import Console
        from rich.syntax import Syntax

        Console().print(Syntax(yaml.safe_dump(data, sort_keys=False), "yaml", theme="ansi_dark"))
    return 0


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from foundation.store.metadata_store import current_revision, upgrade

    settings = _settings(args)
    url = settings.database_url
    before = current_revision(url)
    upgrade(url, args.revision)
    after = current_revision(url)
    print(f"database {settings.masked()['database_url']}: {before or '(empty)'} -> {after}")
    return 0


def _cmd_db_current(args: argparse.Namespace) -> int:
    from foundation.store.metadata_store import current_revision

    print(current_revision(_settings(args).database_url) or "(empty)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="robofleet",
        description="Fleet-scale online post-training for robot policies.",
    )
    parser.add_argument("--version", action="version", version=f"robofleet {__version__}")
    parser.add_argument(
        "--config",
        default=None,
        help="YAML settings file (default: $ROBOFLEET_CONFIG or ./robofleet.yaml)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_config = sub.add_parser("config", help="inspect settings")
    config_sub = p_config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    p_show = config_sub.add_parser("show", help="print the effective settings, secrets masked")
    p_show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    p_show.set_defaults(func=_cmd_config_show)

    p_db = sub.add_parser("db", help="metadata database")
    db_sub = p_db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    p_up = db_sub.add_parser("upgrade", help="migrate the database in place (rows are kept)")
    p_up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    p_up.set_defaults(func=_cmd_db_upgrade)
    p_cur = db_sub.add_parser("current", help="print the database's migration revision")
    p_cur.set_defaults(func=_cmd_db_current)

    for name, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument(
            "args", nargs=argparse.REMAINDER, help="arguments of the subcommand (see its --help)"
        )

    p_bench = sub.add_parser("bench", help="run a benchmark side by side with its baseline")
    p_bench.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    p_bench.add_argument(
        "args", nargs=argparse.REMAINDER, help="benchmark options (see its --help)"
    )
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the top-level command ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


def _split_component(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Split ``[global options] COMMAND rest`` for component commands and benchmarks.

    Component subcommands parse their own options, so everything after the command name is
    passed through untouched (argparse's REMAINDER would not keep leading ``--options``).
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            i += 2
            continue
        if arg.startswith("--config="):
            i += 1
            continue
        if arg.startswith("-"):
            return argv, None, []
        break
    if i < len(argv) and (argv[i] in COMMANDS or argv[i] == "bench"):
        return argv[:i], argv[i], argv[i + 1 :]
    return argv, None, []


def main(argv: Sequence[str] | None = None) -> int:
    from robofleet.settings import SettingsError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    head, command, rest = _split_component(argv)
    if command is not None and not (command == "bench" and (not rest or rest[0].startswith("-"))):
        args = parser.parse_args(head)
        config_args = ["--config", args.config] if args.config is not None else []
        if command == "bench":
            name, rest = rest[0], rest[1:]
            if name not in BENCHMARKS:
                _subparser(parser, "bench").error(
                    f"unknown benchmark {name!r} (choose from {', '.join(sorted(BENCHMARKS))})"
                )
            module = BENCHMARKS[name]
        else:
            module, _ = COMMANDS[command]
        entry = _load_main(module)
        try:
            return entry([*config_args, *rest])
        except SettingsError as err:
            print(f"robofleet: {err}", file=sys.stderr)
            return EXIT_BAD_SETTINGS
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        result: int = args.func(args)
        return result
    except SettingsError as err:
        print(f"robofleet: {err}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


if __name__ == "__main__":
    sys.exit(main())
