"""``reward.source: classifier`` on blind Meta-World robots, as one whole run of the real parts:
a local cloud (:class:`robofleet.cloud.CloudService`: Ray, gRPC, the batch service, the learner
process) and a simulated robot computer (a ``robofleet edge`` process, ``robofleet.sim.computers``)
whose Meta-World driver reports no reward and no success. The simulated person at the robot
(``edge_agent.simulated_person``) labels its first episodes from the simulator's hidden ground
truth and then only reviews what the classifier proposes.

Overrules come from how the classifier learns, not from the test: the person says ``success`` at
the first solved frame and the classifier's positives are that frame and the one before it
(``cloud_learner.reward_classifier``), which is not yet solved, so an early version fires just
short of the goal and the person overrules it; each overrule is a failure label of the next
retraining, until a proposal lands on a solved frame and the person lets it stand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from buffer import ReplayBuffer
from buffer.table.labels import labelled_episodes
from cloud_learner.metrics import read_metrics
from foundation.runspec import RunSpec, parse_run_spec
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot
from robofleet.cloud import CloudService
from robofleet.settings import load_settings
from robofleet.sim.computers import sim_robots
from tests.runs.helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

LABELLED = 10  # episodes the person labels (the scripted expert solves some goals, not others)
STEPS = 45  # the episode limit: at 100 Hz the expert solves about half the goals within it
PERSON = "SimulatedPerson"  # the reason of the person's marks (the operator's class name)


def _spec() -> RunSpec:
    return parse_run_spec(
        {
            "version": 1,
            "name": "classifier-reward",
            "algorithm": "sac",
            "tasks": ["reach-v3"],
            "hyperparameters": {
                "bc_updates": 40,
                "max_episode_steps": STEPS,
                "eval_max_steps": STEPS,
                "updates_per_s": 20,
                "checkpoint_every_updates": 40,
                "batch_size": 64,
                "control_hz": 100,
            },
            "policy": {"kind": "gaussian", "hidden_sizes": [64, 64]},
            "buffer": {"min_size": 64},
            "robots": {"robot_type": "metaworld-sawyer", "tags": {"simulated": "true"}, "count": 1},
            "demonstrations": {"episodes_per_task": 1},
            "learner": {"num_cpus": 0.5},
            "publish": {"every_updates": 20},
            "evaluation": {"on": "none"},
            "reward": {
                "source": "classifier",
                "classifier": {
                    "min_labelled_episodes": LABELLED,
                    "every_updates": 20,
                    "holdout_fraction": 0.0,  # every label trains: the run is short
                    "threshold": 0.8,
                },
            },
            "stop": {"minutes": 3.0},  # a backstop: the test stops it once it has seen enough
        }
    )


def _robot_report(store: MetadataStore) -> dict[str, Any]:
    """The acting robot's last heartbeat report (empty before its agent runs)."""
    with store.session() as s:
        for robot in s.scalars(select(Robot)):
            if (robot.stats or {}).get("steps"):
                return dict(robot.stats)
    return {}


def _accepted_after_overrule(report: dict[str, Any]) -> bool:
    """The robot's classifier proposed success, the person overruled one and let one stand."""
    proposals, overrules = report.get("reward_proposals", 0), report.get("reward_overrules", 0)
    return bool(overrules >= 1 and proposals > overrules)


def _run(data_dir: Path) -> tuple[Path, str, dict[str, Any]]:
    """Run :func:`_spec` in a fresh cloud on ``data_dir`` until the robot reports an accepted
    proposal after an overrule (or the run's own stop); its run directory, id and the robot's
    final report."""
    settings = load_settings(None, data_dir=data_dir)
    edge = settings.edge.model_copy(
        update={"scripted_labelled_episodes": LABELLED, "scripted_ready_after_s": 0.0}
    )
    settings = settings.model_copy(update={"edge": edge})
    robots = sim_robots(1, driver_options={"reward": "none", "detects_success": False})
    cloud = CloudService(
        settings, robots=robots, dashboard_port=None, grpc_port=0, auto_resume=False
    )
    try:
        cloud.start()
        assert cloud.manager is not None
        run_id = cloud.manager.launch(_spec(), actor="test")
        driver = cloud.manager.drivers[run_id]
        wait_until(
            lambda: not driver.alive or _accepted_after_overrule(_robot_report(cloud.store)),
            200,
            "the robot's classifier proposals",
        )
        if driver.alive:
            cloud.manager.stop(run_id, actor="test")
        wait_until(lambda: not driver.alive, 120, "the run's end")
        reports = dict(driver.robot_reports)
        assert len(reports) == 1, reports
        return Path(driver.run_dir), run_id, next(iter(reports.values()))
    finally:
        cloud.close()


def test_a_classifier_trained_from_labels_ends_episodes_and_an_overrule_is_a_label(
    tmp_path: Path,
) -> None:
    run_dir, run_id, report = _run(tmp_path)

    # (1) Versions trained from the person's labels alone, the first from LABELLED episodes.
    trained = read_metrics(run_dir, prefix="classifier")
    assert trained, f"no classifier version in {run_dir / 'metrics.jsonl'}"
    assert trained[0]["classifier_version"] == 1.0
    assert trained[0]["classifier_train_episodes"] >= LABELLED

    marks = [
        json.loads(line)
        for line in (run_dir / "buffer" / "episode_marks.jsonl").read_text().splitlines()
    ]
    buf = ReplayBuffer.open(run_dir / "buffer", read_only=True)
    try:
        steps = buf.read_transitions(buf.select(), count=False)
        labels = {
            item.key[2]: (item.verdict, item.reason) for item in labelled_episodes(buf, run_id)
        }
    finally:
        buf.close()

    def episode(index: int) -> dict[str, np.ndarray]:
        """The episode's stored rows in step order."""
        mine = steps["episode_index"] == index
        order = np.argsort(steps["frame_index"][mine], kind="stable")
        keys = ("reward", "terminated", "truncated", "frame_index")
        return {k: steps[k][mine][order] for k in keys}

    # (2) Shipped beside the policy and run on the robot: an episode its proposal ended, with
    # reward 1.0 on that step alone; not a label of the classifier's own training.
    by_classifier = [m for m in marks if m["reason"] == "classifier"]
    assert by_classifier, f"no episode ended by the classifier: {report}"
    for mark in by_classifier:
        assert mark["kind"] == "success"
        rows = episode(int(mark["episode_index"]))
        assert rows["terminated"][-1] and not rows["terminated"][:-1].any()
        assert rows["reward"][-1] == 1.0 and not rows["reward"][:-1].any()
        assert int(mark["episode_index"]) not in labels

    # (3) Overrules: the person's failure before the step limit (a verdict of the person's own
    # comes at the last step); reward 0 throughout, the attempt truncated (no absorbing state:
    # the critic bootstraps from it), and a label the trainer reads.
    person_failures = [m for m in marks if m["reason"] == PERSON and m["kind"] == "failure"]
    overruled = [
        int(m["episode_index"])
        for m in person_failures
        if len(episode(int(m["episode_index"]))["reward"]) < STEPS
    ]
    assert overruled and report["reward_overrules"] >= len(overruled), report
    for index in overruled:
        rows = episode(index)
        assert rows["truncated"][-1] and not rows["terminated"].any()
        assert not rows["reward"].any()
        assert labels[index] == ("failure", PERSON)
    assert report["human/reach-v3/labels"] >= LABELLED + len(overruled)
