"""Launch refuses a run its robots give nothing to learn or measure success from, naming the
robots and the spec key to set, before anything is recorded or leased (``runs.signals``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from foundation.runspec import RunSpecError, parse_run_spec
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Lease, Robot, RobotStatus, Run
from runs.manager import submit_run
from tests.dashboard.helpers import sawyer_spec
from tests.fakes.cloud import store_for


def arm_spec(reward: str, detects_success: bool, operator: str) -> dict[str, Any]:
    """A Sawyer's enrolled spec declaring the given signals, as an arm's computer would."""
    spec = copy.deepcopy(sawyer_spec())  # cached: never modified in place
    caps = {**spec["capabilities"], "reward": reward, "detects_success": detects_success}
    return {**spec, "capabilities": caps, "computer": {**spec["computer"], "operator": operator}}


def fleet(data_dir: Path, robots: dict[str, dict[str, Any]]) -> MetadataStore:
    upgrade(f"sqlite:///{(data_dir / 'robofleet.db').as_posix()}")
    store = store_for(data_dir)
    with store.session() as s:
        for name, spec in robots.items():
            s.add(
                Robot(
                    name=name,
                    robot_type="metaworld-sawyer",
                    status=RobotStatus.IDLE,
                    tags={"lab": "a"},
                    spec=spec,
                )
            )
    return store


def refusal(store: MetadataStore, data_dir: Path, **fields: Any) -> dict[str, str]:
    spec = parse_run_spec(
        {
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
            **fields,
        }
    )
    with pytest.raises(RunSpecError) as err:
        submit_run(store, spec, data_dir / "runs", actor="test")
    with store.session() as s:  # nothing recorded, nothing leased
        assert s.scalar(select(func.count()).select_from(Run)) == 0
        assert s.scalar(select(func.count()).select_from(Lease)) == 0
    return err.value.errors


def test_sac_on_robots_that_report_no_reward_is_refused_naming_them_and_the_key(
    tmp_path: Path,
) -> None:
    store = fleet(
        tmp_path,
        {
            "arm-1": arm_spec("none", False, "keyboard"),
            "arm-2": arm_spec("none", False, "keyboard"),
            "sim-1": arm_spec("dense", True, "keyboard"),
        },
    )
    errors = refusal(store, tmp_path, algorithm="sac")
    why = errors["reward.source"]
    assert "['arm-1', 'arm-2']" in why and "sim-1" not in why
    assert "reward.source: labels" in why and "reward.source: classifier" in why
    # Operators label the same robots: labels is accepted.
    spec = parse_run_spec(
        {
            "algorithm": "sac",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
            "reward": {"source": "labels"},
        }
    )
    assert submit_run(store, spec, tmp_path / "runs", actor="test")


def test_hg_dagger_learns_from_interventions_not_the_reward(tmp_path: Path) -> None:
    store = fleet(tmp_path, {f"arm-{i}": arm_spec("none", False, "keyboard") for i in (1, 2)})
    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
        }
    )
    assert submit_run(store, spec, tmp_path / "runs", actor="test")


def test_recap_needs_episode_outcomes_from_detection_or_an_operator(tmp_path: Path) -> None:
    store = fleet(
        tmp_path,
        {"arm-1": arm_spec("none", False, "none"), "arm-2": arm_spec("sparse", True, "none")},
    )
    errors = refusal(store, tmp_path, algorithm="recap")
    assert "['arm-1']" in errors["reward.source"] and "arm-2" not in errors["reward.source"]
    assert "detects_success" in errors["reward.source"]


@pytest.mark.parametrize("source", ["labels", "classifier"])
def test_labels_or_a_classifier_without_operators_are_refused_by_robot(
    tmp_path: Path, source: str
) -> None:
    store = fleet(
        tmp_path,
        {"arm-1": arm_spec("none", True, "none"), "arm-2": arm_spec("none", True, "gamepad")},
    )
    errors = refusal(store, tmp_path, algorithm="sac", reward={"source": source})
    why = errors["reward.source"]
    assert f"reward.source: {source}" in why and "['arm-1']" in why and "arm-2" not in why
    assert "--operator none" in why


def test_evaluation_on_robots_without_a_success_source_is_refused(tmp_path: Path) -> None:
    store = fleet(
        tmp_path,
        {"arm-1": arm_spec("dense", False, "none"), "arm-2": arm_spec("dense", False, "none")},
    )
    errors = refusal(store, tmp_path, algorithm="sac")
    why = errors["evaluation.on"]
    assert "['arm-1', 'arm-2']" in why
    for option in ("operator", "reward.source: classifier", "evaluation.on: simulator"):
        assert option in why
    assert "reward.source" not in errors  # they report a reward: SAC has one to learn from
    # No success measured at all: accepted, but nothing to stop at.
    errors = refusal(
        store, tmp_path, algorithm="sac", evaluation={"on": "none"}, stop={"target_success": 0.8}
    )
    assert set(errors) == {"stop.target_success"}
    spec = parse_run_spec(
        {
            "algorithm": "sac",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
            "evaluation": {"on": "none"},
        }
    )
    assert submit_run(store, spec, tmp_path / "runs", actor="test")


def test_a_spec_enrolled_before_the_signal_fields_reads_as_giving_none(tmp_path: Path) -> None:
    old = copy.deepcopy(sawyer_spec())
    old["capabilities"] = {"can_reset": True, "simulated": True, "multi_task": True}
    store = fleet(tmp_path, {"arm-1": old, "arm-2": old})
    errors = refusal(store, tmp_path, algorithm="sac")
    assert "['arm-1', 'arm-2']" in errors["reward.source"]
    # Its operator still scores evaluations and drives HG-DAgger.
    spec = parse_run_spec(
        {
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "metaworld-sawyer", "count": 2},
        }
    )
    assert submit_run(store, spec, tmp_path / "runs", actor="test")
