"""A spec the fleet cannot serve is refused with a clear error and nothing is recorded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from foundation.runspec import RunSpecError, parse_run_spec
from foundation.store.metadata_store import upgrade
from foundation.store.models import Lease, Robot, RobotStatus, Run
from runs.manager import submit_run
from tests.dashboard.helpers import sawyer_spec
from tests.fakes.cloud import ROBOFLEET, cli, store_for
from tests.fakes.settings import cloud_env
from tests.runs.helpers import spec_file


def _fleet(data_dir: Path, n: int) -> None:
    url = f"sqlite:///{(data_dir / 'robofleet.db').as_posix()}"
    upgrade(url)
    store = store_for(data_dir)
    with store.session() as s:
        for i in range(n):
            s.add(
                Robot(
                    name=f"sim-{i:02d}",
                    robot_type="metaworld-sawyer",
                    status=RobotStatus.IDLE,
                    tags={"simulated": "true"},
                    spec=sawyer_spec(),
                )
            )
    store.close()


def _counts(data_dir: Path) -> tuple[int, int]:
    store = store_for(data_dir)
    with store.session() as s:
        runs = s.scalar(select(func.count()).select_from(Run)) or 0
        leases = s.scalar(select(func.count()).select_from(Lease)) or 0
    store.close()
    return runs, leases


def test_cli_refuses_more_robots_than_the_fleet_has(tmp_path: Path) -> None:
    _fleet(tmp_path, 2)
    out = cli(tmp_path, "run", "launch", str(spec_file(tmp_path / "s.yaml", "big", 5)))
    assert out.returncode == 2
    assert "robots: asks for at least 5 robot(s)" in out.stderr
    assert "the fleet has 2" in out.stderr
    assert _counts(tmp_path) == (0, 0)


def test_refuses_robots_with_tags_nobody_has(tmp_path: Path) -> None:
    _fleet(tmp_path, 2)
    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "robots": {"tags": {"site": "mars"}, "count": 1},
            "policy": {"kind": "gaussian", "hidden_sizes": [64, 32]},
            "hyperparameters": {"lr": -1, "colour": 3},
        }
    )
    store = store_for(tmp_path)
    with pytest.raises(RunSpecError) as err:
        submit_run(store, spec, tmp_path / "runs", actor="test")
    errors = err.value.errors
    assert "site=mars" in errors["robots"] and "the fleet has 0" in errors["robots"]
    assert "gaussian" in errors["policy.kind"]  # SAC's actor; unequal hidden sizes are fine
    assert "hyperparameters.lr" in errors and "hyperparameters.colour" in errors
    store.close()
    assert _counts(tmp_path) == (0, 0)


def test_buffer_fields_a_run_would_ignore_are_refused_by_name(tmp_path: Path) -> None:
    _fleet(tmp_path, 1)
    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 1},
            "buffer": {
                "sampler": "prioritized",
                "min_size": 1000,  # applied: not refused
                "offline_data": ["/data/old-run"],
                "samples_per_insert": 64,  # applied: not refused
                "memory_budget_bytes": 1 << 26,
            },
        }
    )
    store = store_for(tmp_path)
    with pytest.raises(RunSpecError) as err:
        submit_run(store, spec, tmp_path / "runs", actor="test")
    errors = err.value.errors
    assert set(errors) == {"buffer.sampler", "buffer.offline_data[0]"}
    assert "hg-dagger" in errors["buffer.sampler"]
    assert "no path that exists" in errors["buffer.offline_data[0]"]
    store.close()
    assert _counts(tmp_path) == (0, 0)


def _min_size_spec(min_size: object, **extra: object) -> dict[str, object]:
    return {
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "robots": {"robot_type": "metaworld-sawyer", "count": 1},
        "buffer": {"min_size": min_size},
        **extra,
    }


def test_buffer_min_size_is_accepted_and_reaches_the_learner(tmp_path: Path) -> None:
    from cloud_learner.run_plan import RunPlan

    _fleet(tmp_path, 1)
    spec = parse_run_spec(_min_size_spec(40))
    store = store_for(tmp_path)
    run_id = submit_run(store, spec, tmp_path / "runs", actor="test")
    stored = store.get_run(run_id)
    assert stored is not None and stored.spec["buffer"]["min_size"] == 40
    store.close()
    assert _counts(tmp_path) == (1, 0)
    state = {"observation.state": {"dtype": "float32", "shape": [39]}}
    settings = RunPlan.from_spec(spec).learner_settings(state, 4)
    assert settings.min_transitions == 40  # the learner's gate (cloud_learner.loop.Learner)
    assert parse_run_spec(_min_size_spec(1)).buffer.min_size == 1


@pytest.mark.parametrize("bad", [0, -5, 1.5, 40.0, "40", True, None, "many"])
def test_an_invalid_buffer_min_size_is_refused_by_name(bad: object) -> None:
    with pytest.raises(RunSpecError) as err:
        parse_run_spec(_min_size_spec(bad))
    assert set(err.value.errors) == {"buffer.min_size"}


def test_a_min_size_the_run_stops_before_is_refused_by_name(tmp_path: Path) -> None:
    _fleet(tmp_path, 1)
    store = store_for(tmp_path)
    spec = parse_run_spec(_min_size_spec(500, stop={"env_steps": 200}))
    with pytest.raises(RunSpecError) as err:
        submit_run(store, spec, tmp_path / "runs", actor="test")
    assert set(err.value.errors) == {"buffer.min_size"}
    assert "stop.env_steps ends the run at 200" in err.value.errors["buffer.min_size"]
    ok = parse_run_spec(_min_size_spec(200, stop={"env_steps": 200}))
    submit_run(store, ok, tmp_path / "runs", actor="test")
    store.close()
    assert _counts(tmp_path) == (1, 0)


def test_a_servable_spec_is_recorded_pending(tmp_path: Path) -> None:
    _fleet(tmp_path, 2)
    out = cli(tmp_path, "run", "launch", str(spec_file(tmp_path / "s.yaml", "ok", 2)), "--json")
    assert out.returncode == 0, out.stderr
    assert _counts(tmp_path) == (1, 0)  # pending; a cloud leases when it starts the run
    listed = cli(tmp_path, "run", "list", "--json")
    assert '"state": "pending"' in listed.stdout


def test_resume_and_stop_requests_follow_the_run_states(tmp_path: Path) -> None:
    from foundation.store.models import RunState
    from runs.run import set_state

    _fleet(tmp_path, 1)
    out = cli(tmp_path, "run", "launch", str(spec_file(tmp_path / "s.yaml", "r", 1)), "--json")
    run_id = out.stdout.strip().splitlines()[-1].split('"')[3]
    store = store_for(tmp_path)
    refused = cli(tmp_path, "resume", run_id)  # pending: nothing to resume
    assert refused.returncode == 2 and "while it is pending" in refused.stderr
    set_state(store, run_id, RunState.CRASHED, "test: learner crash loop")
    ok = cli(tmp_path, "resume", run_id)
    assert ok.returncode == 0, ok.stderr
    run = store.get_run(run_id)
    assert run is not None and run.state == RunState.RESUMING
    stopped = cli(tmp_path, "run", "stop", run_id)  # no cloud running: stopped at once
    assert stopped.returncode == 0 and f"stopped {run_id}" in stopped.stdout
    run = store.get_run(run_id)
    assert run is not None and run.state == RunState.STOPPED
    assert cli(tmp_path, "resume", "run-nope").returncode == 2
    store.close()


def _simulator_errors(tmp_path: Path, tasks: list[str], computer: dict[str, str] | None) -> dict:
    """The refusal of a simulator-evaluated run on one Sawyer whose computer says ``computer``."""
    url = f"sqlite:///{(tmp_path / 'robofleet.db').as_posix()}"
    upgrade(url)
    store = store_for(tmp_path)
    spec = {k: v for k, v in sawyer_spec().items() if k != "computer"}
    if computer is not None:
        spec["computer"] = computer
    with store.session() as s:
        s.add(
            Robot(name="sim-00", robot_type="metaworld-sawyer", status=RobotStatus.IDLE, spec=spec)
        )
    run = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": tasks,
            "robots": {"robot_type": "metaworld-sawyer", "count": 1},
            "evaluation": {"on": "simulator"},
        }
    )
    try:
        with pytest.raises(RunSpecError) as err:
            submit_run(store, run, tmp_path / "runs", actor="test")
    finally:
        store.close()
    return err.value.errors


def test_the_simulator_evaluates_only_tasks_the_robots_driver_runs(tmp_path: Path) -> None:
    errors = _simulator_errors(tmp_path, ["no-such-task-v3"], {"driver": "metaworld"})
    assert "no-such-task-v3" in errors["evaluation.on"]
    assert "evaluation.on: robots" in errors["evaluation.on"]


def test_the_simulator_needs_the_robots_driver_kind(tmp_path: Path) -> None:
    errors = _simulator_errors(tmp_path, ["reach-v3"], None)
    assert "described no driver kind" in errors["evaluation.on"]
    assert "sim-00" in errors["evaluation.on"]


def test_the_simulator_refuses_a_driver_it_cannot_build_alone(tmp_path: Path) -> None:
    # A Gymnasium robot needs its env_id: the run's episode options alone cannot build one.
    errors = _simulator_errors(tmp_path, ["reach-v3"], {"driver": "gymnasium"})
    assert "gymnasium" in errors["evaluation.on"]


@pytest.mark.parametrize(
    "args",
    [("run", "stop"), ("run", "pause"), ("run", "promote"), ("resume",)],
    ids=["stop", "pause", "promote", "resume"],
)
def test_an_unknown_run_is_named_as_such(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = cli(tmp_path, *args, "no-such-run")
    assert out.returncode == 2
    assert out.stderr.strip() == f"robofleet {' '.join(args)}: no run 'no-such-run'"


def test_a_yaml_syntax_error_in_the_spec_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("algorithm: sac\ntasks: [reach-v3]\nrobots: count: 1\n")
    out = subprocess.run(
        [*ROBOFLEET, "run", "launch", "bad.yaml"],
        cwd=tmp_path,
        env=cloud_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr == (
        "robofleet run launch: bad.yaml line 3, column 14: mapping values are not allowed here\n"
    )
