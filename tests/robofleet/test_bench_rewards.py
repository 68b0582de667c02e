"""``robofleet bench rewards``: its command line, and the precision/recall pieces on tiny
known cases (a fake classifier with known answers; the real one on a tiny separable case; no
system run)."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from robofleet.bench import reward_pr
from robofleet.bench.reward_pr import Recorded, measure, step_precision_recall
from robofleet.bench.reward_runs import (
    _labelled,
    classifier_figures,
    driver_options,
    episode_endings,
    late_success,
    run_spec,
)
from robofleet.bench.rewards import summary
from robofleet.cli import main

STATE = reward_pr.STATE_KEY


def test_help_describes_the_bench(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "rewards", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "precision" in out and "--labels" in out and "--quick" in out


def test_step_precision_recall_counts_every_step() -> None:
    probs = [np.array([0.1, 0.6, 0.9]), np.array([0.7, 0.2])]
    truth = [np.array([False, False, True]), np.array([True, True])]
    # predicted positive: steps 1, 2 of the first; step 0 of the second -> tp 2, fp 1, fn 1
    assert step_precision_recall(probs, truth, 0.5) == (2 / 3, 2 / 3, 5)
    # nothing predicted: precision undefined; no true step: recall undefined
    assert step_precision_recall([np.zeros(2)], [np.array([True, False])], 0.5) == (None, 0.0, 2)
    assert step_precision_recall([np.ones(2)], [np.zeros(2, bool)], 0.5) == (0.0, None, 2)
    with pytest.raises(ValueError, match="shape"):
        step_precision_recall([np.zeros(3)], [np.zeros(2, bool)], 0.5)


def _episode(first: int | None, steps: int = 6) -> Recorded:
    """A synthetic episode whose state's first column is 1.0 exactly on the solved steps
    (solved from ``first`` on), so a classifier reading that column is always right."""
    success = np.zeros(steps, bool)
    if first is not None:
        success[first:] = True
    state = np.zeros((steps, 3), np.float32)
    state[:, 0] = success
    return Recorded("reach-v3", {STATE: state}, success, first)


@dataclass
class _Labelled:
    frames: dict[str, np.ndarray]
    verdict: str
    verdict_frame: int
    task: int = 0


class _ColumnModel:
    """P(success) = the state's first column, plus ``bias``."""

    def __init__(self, bias: float) -> None:
        self.bias = bias

    def success_probability(self, frames: dict[str, np.ndarray]) -> np.ndarray:
        return np.clip(frames[STATE][:, 0] + self.bias, 0.0, 1.0)


@pytest.fixture
def fake_classifier(monkeypatch):
    """``cloud_learner.reward_classifier`` replaced by a known model; records what it saw."""
    seen: dict[str, Any] = {"fits": []}
    mod = types.ModuleType("cloud_learner.reward_classifier")

    def fit(episodes, features, *, seed=0, **kwargs):
        seen["fits"].append(list(episodes))
        return _ColumnModel(seen.get("bias", 0.0))

    def episode_pr(model, episodes, threshold):
        seen["evaluated"] = list(episodes)
        return 1.0, 1.0, len(episodes)

    mod.LabelledEpisode = _Labelled  # type: ignore[attr-defined]
    mod.fit_reward_classifier = fit  # type: ignore[attr-defined]
    mod.episode_precision_recall = episode_pr  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cloud_learner.reward_classifier", mod)
    return seen


def test_measure_labels_as_the_person_and_scores_every_held_out_step(fake_classifier) -> None:
    pool = [_episode(None), _episode(None), _episode(2), _episode(4)]
    heldout = [_episode(3), _episode(None)]
    rows = measure(pool, heldout, [STATE], {}, [2, 4], threshold=0.5)
    # the first two labelled episodes are both failures: no classifier, said why
    assert rows[0]["labelled"] == 2 and rows[0]["error"] == "one verdict only"
    assert rows[0]["step_precision"] is None and len(fake_classifier["fits"]) == 1
    # four: a success is cut at its verdict step, a failure kept whole
    train = fake_classifier["fits"][0]
    assert [(e.verdict, e.verdict_frame, len(e.frames[STATE])) for e in train] == [
        ("failure", 5, 6),
        ("failure", 5, 6),
        ("success", 2, 3),
        ("success", 4, 5),
    ]
    assert [e.verdict_frame for e in fake_classifier["evaluated"]] == [3, 5]
    # the column model is right on every one of the 12 held-out steps
    r = rows[1]
    assert (r["successes"], r["step_precision"], r["step_recall"], r["steps"]) == (2, 1.0, 1.0, 12)


def test_measure_counts_false_alarms_per_step(fake_classifier) -> None:
    fake_classifier["bias"] = 0.6  # every step >= 0.5: the 9 unsolved held-out steps are false
    pool = [_episode(None), _episode(1)]
    rows = measure(pool, [_episode(3), _episode(None)], [STATE], {}, [2], threshold=0.5)
    assert (rows[0]["step_precision"], rows[0]["step_recall"]) == (round(3 / 12, 3), 1.0)
    with pytest.raises(ValueError, match="exceed"):
        measure(pool, [], [STATE], {}, [3])


def test_collect_records_the_hidden_verdict_of_each_step() -> None:
    (ep,) = reward_pr.collect("reach-v3", [0], steps=12, rng_seed=0)
    assert ep.frames[STATE].shape == (12, 39) and ep.success.shape == (12,)
    if ep.first_success is None:
        assert not ep.success.any()
    else:
        assert ep.success[ep.first_success] and not ep.success[: ep.first_success].any()


def test_runs_differ_only_in_the_reward_they_see() -> None:
    assert driver_options("robot") == {"reward": "sparse", "detects_success": True}
    assert driver_options("classifier") == {"reward": "none", "detects_success": False}
    with pytest.raises(ValueError, match="sky"):
        driver_options("sky")
    common = dict(task="reach-v3", robots=2, minutes=1.0, eval_every_s=10.0, eval_episodes=2,
                  demonstrations=3, labelled_episodes=5, control_hz=20.0,
                  knobs={"reward_scale": 1.0})  # fmt: skip
    a, c = run_spec("robot", **common), run_spec("classifier", **common)
    assert (a.algorithm, a.reward.source, c.reward.source) == ("sac", "robot", "classifier")
    assert c.reward.classifier.min_labelled_episodes == 10  # 5 per robot, 2 robots
    assert a.demonstrations.episodes_per_task == 3 and a.evaluation.on == "simulator"
    assert a.hyperparameters["reward_scale"] == 1.0


def test_summary_compares_late_ground_truth_success() -> None:
    pr = [{"task": "reach-v3", "observation": "state", "labelled": 5, "episode_precision": 0.5,
           "episode_recall": 1.0, "step_precision": 0.4, "step_recall": 0.9}]  # fmt: skip
    runs = [
        {
            "source": s,
            "initial_success": 0.1,
            "final_success": f,
            "best_success": f,
            "late_success": f,
            "env_steps": 10,
            "episodes": 3,
        }  # fmt: skip
        for s, f in (("robot", 0.8), ("labels", 0.7), ("classifier", 0.6), ("none", 0.2))
    ]
    out = summary(pr, runs)
    assert out["classifier_vs_robot_late"] == 0.75
    assert out["classifier_minus_none_late"] == 0.4
    assert out["precision_recall"]["reach-v3"]["state"]["5"]["step_recall"] == 0.9
    assert out["runs"]["labels"]["final_success"] == 0.7
    # without the control or the robot's run there is nothing to compare with
    alone = summary([], runs[2:3])
    assert alone["classifier_vs_robot_late"] is None and alone["classifier_minus_none_late"] is None


def test_late_success_is_the_mean_of_the_last_third_after_the_start() -> None:
    def h(*points: float) -> list[dict[str, float]]:
        return [{"success_mean": p} for p in points]

    assert late_success(h(0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7)) == 0.65  # last 2 of 6
    assert late_success(h(0.4, 0.9)) == 0.9
    assert late_success(h(0.4)) == 0.4  # only the initial policy was evaluated
    assert late_success([]) is None


def test_the_control_run_reaches_the_learner_no_reward() -> None:
    common = dict(task="reach-v3", robots=2, minutes=1.0, eval_every_s=10.0, eval_episodes=2,
                  demonstrations=3, labelled_episodes=5, control_hz=20.0,
                  knobs={"reward_scale": 1.0})  # fmt: skip
    control = run_spec("none", **common)
    # blind robots, labels as the source, and nobody labels: no verdict, so no reward
    assert control.reward.source == "labels"
    assert driver_options("none") == {"reward": "none", "detects_success": False}
    assert (_labelled("none", 5), _labelled("classifier", 5), _labelled("labels", 5)) == (
        0,
        5,
        None,
    )


def test_episode_endings_and_classifier_figures_read_the_run_dir(tmp_path) -> None:
    (tmp_path / "buffer").mkdir()
    marks = [{"kind": "success", "reason": "classifier"}, {"kind": "failure", "reason": "SimulatedPerson"},
             {"kind": "success", "reason": "classifier"}]  # fmt: skip
    (tmp_path / "buffer" / "episode_marks.jsonl").write_text(
        "".join(json.dumps(m) + "\n" for m in marks)
    )
    rows = [{"step": 10, "prefix": "learner", "critic_loss": 0.1},
            {"step": 20, "prefix": "classifier", "classifier_version": 1.0, "classifier_recall": 0.5},
            {"step": 40, "prefix": "classifier", "classifier_version": 2.0, "classifier_recall": 0.75}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert episode_endings(tmp_path) == {
        "success by classifier": 2,
        "failure by SimulatedPerson": 1,
    }
    assert classifier_figures(tmp_path) == {"version": 2.0, "recall": 0.75}
    empty = tmp_path / "nothing"
    assert episode_endings(empty) == {} and classifier_figures(empty) == {}


def test_measure_with_the_real_classifier_on_a_separable_case() -> None:
    # the state's first column says "solved": the classifier must find it from 4 labels
    pool = [_episode(None, 20), _episode(8, 20), _episode(None, 20), _episode(12, 20)]
    heldout = [_episode(10, 20), _episode(None, 20)]
    features = {STATE: {"dtype": "float32", "shape": (3,), "names": None}}
    (row,) = measure(pool, heldout, [STATE], features, [4], threshold=0.5, epochs=60)
    assert row["successes"] == 2 and row["episodes"] == 2 and row["steps"] == 40
    assert row["episode_precision"] == 1.0 and row["episode_recall"] == 1.0
    assert row["step_precision"] == 1.0 and row["step_recall"] == 1.0


class _Session:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def scalar(self, _query):
        return None  # not enrolled yet


class _Store:
    def session(self):
        return _Session()

    def create_enrollment_token(self, *args, **kwargs):
        return "tok"


def test_sim_robot_computers_pass_driver_options_as_json(tmp_path) -> None:
    from robofleet.sim.computers import SimRobotComputers

    settings = types.SimpleNamespace(data_dir=tmp_path)
    options = {"reward": "none", "detects_success": False}
    computers = SimRobotComputers(settings, _Store(), "127.0.0.1:1", ["sim-00"],
                                  driver_options=options)  # type: ignore[arg-type]  # fmt: skip
    argv = computers._argv("sim-00", tmp_path / "edge.yaml", seed=0)
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "--driver-option"]
    assert given == ['reward="none"', "detects_success=false"]
    assert argv[-1] == "--token=tok"
