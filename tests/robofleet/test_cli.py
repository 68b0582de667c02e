import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from foundation import __version__
from robofleet.cli import BENCHMARKS, COMMANDS, build_parser, main


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ROBOFLEET_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "robofleet.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_version(tmp_path: Path) -> None:
    r = run_cli("--version", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.strip() == f"robofleet {__version__}"


def test_help_lists_every_subcommand(tmp_path: Path) -> None:
    r = run_cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for name in [*COMMANDS, "config", "db", "bench"]:
        assert name in r.stdout


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    r = run_cli("config", "show", "--json", cwd=tmp_path, env={"ROBOFLEET_SECRET_KEY": "topsecret"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["secret_key"] == "***"
    assert "topsecret" not in r.stdout
    assert data["comms"]["bind_host"] == "127.0.0.1"


def test_bad_setting_exits_2_without_traceback(tmp_path: Path) -> None:
    r = run_cli("config", "show", cwd=tmp_path, env={"ROBOFLEET_HAL__OFFLINE_AFTER_S": "-1"})
    assert r.returncode == 2
    assert "hal.offline_after_s" in r.stderr
    assert "Traceback" not in r.stderr


def test_db_upgrade_creates_sqlite_store(tmp_path: Path) -> None:
    r = run_cli("db", "upgrade", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(empty) -> 0006" in r.stdout
    assert (tmp_path / "robofleet-data" / "robofleet.db").exists()
    again = run_cli("db", "current", cwd=tmp_path)
    assert again.stdout.strip() == "0006"


def test_missing_dependency_of_a_subcommand_is_raised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pkg = tmp_path / "fakepkg_rf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("import definitely_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "demo", ("fakepkg_rf.broken", "x"))
    with pytest.raises(ModuleNotFoundError, match="definitely_missing_dependency_xyz"):
        main(["demo"])


def test_component_options_pass_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pkg = tmp_path / "fakepkg_pass"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(
        "import json\nSEEN = []\ndef main(argv):\n    SEEN.append(list(argv))\n    return 7\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "dashboard", ("fakepkg_pass.entry", "x"))
    monkeypatch.setitem(BENCHMARKS, "buffer", "fakepkg_pass.entry")
    import fakepkg_pass.entry as entry  # type: ignore[import-not-found]

    assert main(["--config", "c.yaml", "dashboard", "--port", "0"]) == 7
    assert main(["bench", "buffer", "--quick", "--json"]) == 7
    assert entry.SEEN == [["--config", "c.yaml", "--port", "0"], ["--quick", "--json"]]


def test_yaml_syntax_error_in_the_settings_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("buffer:\n  memory_budget_bytes: 10\nhal: x: y\n")
    r = run_cli("--config", "bad.yaml", "config", "show", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "robofleet: bad.yaml line 3, column 7: mapping values are not allowed here\n"


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(module: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser a subcommand's ``main`` builds (caught at its first parse)."""

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        raise _Parsed(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", caught)
        m.setattr(argparse.ArgumentParser, "parse_known_args", caught)
        with pytest.raises(_Parsed) as got:
            importlib.import_module(module).main([])
    return got.value.parser


def _help_faults(parser: argparse.ArgumentParser, path: str) -> list[str]:
    faults = (
        [f"{path}: reST markup in the description"] if "``" in (parser.description or "") else []
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            faults += [f"{path} {a.dest}: no help" for a in action._choices_actions if not a.help]
            for name, sub in action.choices.items():
                faults += _help_faults(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction) and not action.help:
            faults.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    return faults


def test_every_argument_of_every_subcommand_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    faults = _help_faults(build_parser(), "robofleet")
    for name, (module, _) in COMMANDS.items():
        faults += _help_faults(_parser_of(module, monkeypatch), f"robofleet {name}")
    for name, module in BENCHMARKS.items():
        faults += _help_faults(_parser_of(module, monkeypatch), f"robofleet bench {name}")
    assert faults == []


def test_unknown_benchmark_prints_the_bench_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "nosuch"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: robofleet bench ")
    assert f"unknown benchmark 'nosuch' (choose from {', '.join(sorted(BENCHMARKS))})" in err


def test_the_readme_says_what_the_cli_accepts() -> None:
    from cloud_learner.algorithms import BUILDERS
    from foundation.store.runs import REQUESTS
    from robofleet.commands.demo import build_parser as demo_parser

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")
    }
    bench = rows["`robofleet bench NAME`"].split("NAME is")[1].split("(")[0]
    assert sorted(re.findall(r"`([a-z-]+)`", bench)) == sorted(BENCHMARKS)
    algorithms = re.search(r"^algorithm: hg-dagger +# (.+)$", readme, re.MULTILINE)
    assert algorithms is not None and algorithms.group(1).split(" | ") == list(BUILDERS)
    resume_help = COMMANDS["resume"][1]
    assert resume_help in rows["`robofleet resume RUN`"]
    for state in REQUESTS["resume"][0]:
        assert state.value in resume_help
    minutes = demo_parser().get_default("minutes")
    assert f"The demo's run lasts {minutes:g} minutes" in readme
