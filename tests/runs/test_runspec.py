from pathlib import Path

import pytest

from cloud_learner.run_plan import parse_spec
from foundation.runspec import RunSpecError, load_run_spec, parse_run_spec

GOOD = {
    "algorithm": "hg-dagger",
    "tasks": ["reach-v3", "push-v3"],
    "robots": {"robot_type": "metaworld-sawyer", "count": 4, "min_count": 2},
    "stop": {"minutes": 10, "target_success": 0.9},
}


def test_valid_spec_round_trips() -> None:
    spec = parse_run_spec(GOOD)
    assert spec.version == 1
    assert spec.robots.minimum == 2
    assert parse_run_spec(spec.model_dump()) == spec


def test_every_bad_field_is_named_and_the_algorithm_by_the_learners_registry() -> None:
    bad = {
        "algorithm": "ppo",
        "tasks": [],
        "robots": {"robot_type": "x", "count": 2, "min_count": 3},
        "buffer": {"online_fraction": 1.5},
        "stop": {"minutes": -1},
        "colour": "red",
    }
    with pytest.raises(RunSpecError) as err:
        parse_spec(bad)  # the launch path: the floor's checks and the learner's names at once
    errors = err.value.errors
    assert set(errors) == {
        "algorithm",
        "tasks",
        "robots",
        "buffer.online_fraction",
        "stop.minutes",
        "colour",
    }
    assert "min_count (3) exceeds count (2)" in errors["robots"]
    assert errors["colour"] == "unknown field"
    assert "'hg-dagger'" in errors["algorithm"]
    # The floor keeps plain names; the launch path refuses an unknown one, naming the known.
    assert parse_run_spec({**GOOD, "algorithm": "ppo"}).algorithm == "ppo"
    with pytest.raises(RunSpecError) as err:
        parse_spec({**GOOD, "algorithm": "ppo"})
    assert err.value.errors == {
        "algorithm": "Input should be 'hg-dagger', 'recap', 'sac' or 'lerobot-sac'"
    }
    with pytest.raises(RunSpecError) as err:
        parse_spec({**GOOD, "policy": {"kind": "transformer"}})
    assert set(err.value.errors) == {"policy.kind"}
    assert "unknown policy kind 'transformer' (known: mlp, cnn" in err.value.errors["policy.kind"]


def test_robot_demand_needs_type_or_tags() -> None:
    with pytest.raises(RunSpecError, match="give robot_type or tags"):
        parse_run_spec({**GOOD, "robots": {"count": 1}})


def test_repeated_task_refused() -> None:
    with pytest.raises(RunSpecError, match="must not repeat"):
        parse_run_spec({**GOOD, "tasks": ["reach-v3", "reach-v3"]})


def test_load_from_yaml(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text("algorithm: sac\ntasks: [reach-v3]\nrobots: {tags: {site: lab1}, count: 1}\n")
    assert load_run_spec(p).algorithm == "sac"
    with pytest.raises(RunSpecError, match="not found"):
        load_run_spec(tmp_path / "missing.yaml")
    p.write_text("algorithm: sac\ntasks: [reach-v3]\nrobots: {count: 1\n")
    with pytest.raises(RunSpecError) as err:
        load_run_spec(p)
    assert str(err.value) == (
        f"{p} line 4, column 1: expected ',' or '}}', but got '<stream end>'"
        " (while parsing a flow mapping at line 3, column 9)"
    )
    p.write_text("- just\n- a list\n")
    with pytest.raises(RunSpecError, match="must be a mapping"):
        load_run_spec(p)


def test_policy_kind_defaults_to_the_algorithms_own() -> None:
    assert parse_spec(GOOD).policy.kind == "mlp"
    sac = parse_spec({**GOOD, "algorithm": "sac", "policy": {"hidden_sizes": [64, 64]}})
    assert sac.policy.kind == "gaussian" and sac.policy.hidden_sizes == [64, 64]
    assert parse_spec({**GOOD, "algorithm": "sac", "policy": {"kind": ""}}).policy.kind == (
        "gaussian"
    )
    named = parse_spec({**GOOD, "algorithm": "sac", "policy": {"kind": "mlp"}})
    assert named.policy.kind == "mlp"  # what the spec names stays (the run manager judges it)
    assert parse_spec(sac.model_dump()) == sac  # round-trips
    assert parse_run_spec(GOOD).policy.kind == ""  # the floor leaves it to the learner


def test_bad_task_names_are_named() -> None:
    with pytest.raises(RunSpecError) as err:
        parse_run_spec({**GOOD, "tasks": ["reach-v3", "bad task!", "reach-v3"]})
    msg = err.value.errors["tasks"]
    assert "'bad task!'" in msg and "listed twice" in msg and "reach-v3" in msg


def test_help_section_defaults_and_bad_values_named() -> None:
    spec = parse_run_spec(GOOD)
    assert (spec.help.risk, spec.help.while_waiting) == ("none", "hold")
    ok = parse_spec({**GOOD, "help": {"risk": "probe", "threshold": 0.8, "timeout_s": 30}})
    assert (ok.help.risk, ok.help.threshold, ok.help.timeout_s) == ("probe", 0.8, 30.0)
    bad = {"risk": "critic", "threshold": 1.5, "while_waiting": "wander", "timeout_s": 0}
    with pytest.raises(RunSpecError) as err:
        parse_run_spec({**GOOD, "help": {**bad, "colour": 1}})
    assert set(err.value.errors) == {
        "help.risk",
        "help.threshold",
        "help.while_waiting",
        "help.timeout_s",
        "help.colour",
    }
    with pytest.raises(RunSpecError) as err:  # the probe reads a robofleet head
        parse_spec({**GOOD, "help": {"risk": "probe"}, "policy": {"kind": "lerobot-act"}})
    assert set(err.value.errors) == {"help.risk"}


def test_buffer_shards_default_to_one_and_a_bad_count_is_refused_by_name() -> None:
    assert parse_run_spec(GOOD).buffer.shards == 1
    assert parse_run_spec({**GOOD, "buffer": {"shards": 4}}).buffer.shards == 4
    for bad in (0, -2, 65, 2.5, "two", True):
        with pytest.raises(RunSpecError) as err:
            parse_run_spec({**GOOD, "buffer": {"shards": bad}})
        assert set(err.value.errors) == {"buffer.shards"}, bad
