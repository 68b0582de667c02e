"""A run that ends promotes the version its evaluations speak best for (``runs.promotion``),
not its last one, and nothing without evaluations; each evaluation point carries who scored
its episodes into ``evals.jsonl``, the event and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from foundation.runspec import RunSpec, parse_run_spec
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Event, PolicyVersion, Robot, RobotStatus, Run
from runs.eval_record import EvaluationRecorder, Stamp
from runs.promotion import promote_best, wilson_lower
from runs.report import write_report
from runs.robot_evals import RobotEvaluations

RUN = "run-1"


@pytest.fixture
def store(tmp_path: Path) -> MetadataStore:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        s.add(Run(id=RUN, algorithm="sac"))
        s.flush()
        s.add(Robot(name="arm-1", robot_type="x", status=RobotStatus.IDLE, stats={}))
        for v in range(1, 8):
            s.add(PolicyVersion(run_id=RUN, version=v, learner_step=v, num_bytes=1))
    return store


def spec(on: str = "robots") -> RunSpec:
    return parse_run_spec(
        {
            "algorithm": "sac",
            "tasks": ["reach-v3"],
            "robots": {"robot_type": "x"},
            "evaluation": {"on": on},
        }
    )


def heartbeat(store: MetadataStore, counts: dict[str, float]) -> None:
    """The robot's cumulative evaluation counters, as its heartbeat stores them."""
    with store.session() as s:
        robot = s.scalars(select(Robot).where(Robot.name == "arm-1")).one()
        robot.stats = {**counts, "run_id": RUN, "state": "acting"}


def weights(version: int) -> bytes:
    return f"weights of v{version}".encode()


def evaluate(store: MetadataStore, run_dir: Path, points: list[tuple[int, int, int, str]]) -> None:
    """Record one point per (version, episodes, successes, scorer), through the robots'
    evaluation source and the recorder a run uses."""
    events: list[tuple[str, dict[str, Any]]] = []
    source = RobotEvaluations(store, RUN, ["reach-v3"], lambda: ["arm-1"])
    recorder = EvaluationRecorder(store, RUN, run_dir, source, lambda k, **d: events.append((k, d)))
    total: dict[str, float] = {}
    for version, episodes, successes, scorer in points:
        for key, n in (
            ("episodes", episodes),
            ("successes", successes),
            (f"by/{scorer}", episodes),
        ):
            total[f"eval/reach-v3/{key}"] = total.get(f"eval/reach-v3/{key}", 0.0) + n
        heartbeat(store, total)
        source.offer(
            version, weights(version), lambda v=version: Stamp(v * 10.0, 0.1, 100, 0), False
        )
        assert recorder.collect() is not None
    assert [d["scored_by"] for k, d in events] == [{p[3]: p[1]} for p in points]


def test_the_best_evaluated_version_is_promoted_not_the_last(
    tmp_path: Path, store: MetadataStore
) -> None:
    # v2: 8 of 10 by the operator; v5: 5 of 10; v7 (the last): 1 of 1 by the driver.
    evaluate(store, tmp_path, [(2, 10, 8, "operator"), (5, 10, 5, "driver"), (7, 1, 1, "driver")])
    assert wilson_lower(1.0, 1) < wilson_lower(0.8, 10)  # one success proves little
    got = promote_best(store, RUN, tmp_path, spec())
    assert got["version"] == 2 and got["by"] == "evaluation"
    evidence = got["evidence"]
    assert (evidence["success"], evidence["episodes"]) == (0.8, 10)
    assert evidence["scored_by"] == {"operator": 10}
    assert (tmp_path / "promoted.safetensors").read_bytes() == weights(2)
    promoted = json.loads((tmp_path / "promoted.json").read_text())
    assert promoted["version"] == 2 and promoted["evidence"] == evidence
    with store.session() as s:
        flags = {v.version for v in s.scalars(select(PolicyVersion)) if v.promoted}
    assert flags == {2}

    report_of = write_report(
        tmp_path, RUN, spec(), learner_restarts=0, accounts={}, elapsed_s=60.0, promotion=got
    )
    report = json.loads(Path(report_of["report"]).read_text())
    assert report["promoted_version"] == 2 and report["promotion"]["evidence"] == evidence
    assert [e["scored_by"] for e in report["evaluations"]] == [
        {"operator": 10},
        {"driver": 10},
        {"driver": 1},
    ]
    assert report["reward_source"] == "robot"
    text = (tmp_path / "report.txt").read_text()
    assert (
        "promoted: version 2: success 0.80 over 10 evaluation episodes (scored by operator 10)"
        in text
    )


def test_a_resumed_run_keeps_its_best_and_a_later_tie_wins(
    tmp_path: Path, store: MetadataStore
) -> None:
    evaluate(store, tmp_path, [(3, 10, 6, "operator")])
    # The cloud restarted: a new recorder, counters from zero again on the robot.
    heartbeat(store, {})
    evaluate(store, tmp_path, [(4, 10, 5, "classifier"), (6, 10, 6, "classifier")])
    got = promote_best(store, RUN, tmp_path, spec())
    assert got["version"] == 6 and got["evidence"]["scored_by"] == {"classifier": 10}


@pytest.mark.parametrize("on", ["robots", "none"])
def test_without_evaluations_nothing_is_promoted_and_the_report_says_why(
    tmp_path: Path, store: MetadataStore, on: str
) -> None:
    got = promote_best(store, RUN, tmp_path, spec(on))
    assert got["version"] is None
    assert ("measured no success" if on == "none" else "no evaluation point") in got["why"]
    assert not (tmp_path / "promoted.json").exists()
    with store.session() as s:
        assert not any(v.promoted for v in s.scalars(select(PolicyVersion)))
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.run_id == RUN))]
    assert "run.not_promoted" in kinds and "run.promoted" not in kinds
    write_report(
        tmp_path, RUN, spec(on), learner_restarts=0, accounts={}, elapsed_s=1.0, promotion=got
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["promoted_version"] is None and report["promotion"]["why"] == got["why"]
    assert f"promoted: none ({got['why']})" in (tmp_path / "report.txt").read_text()


@pytest.mark.parametrize(
    ("epochs", "first_episodes"),
    [((1.0, 2.0), 2), ((None, None), 2), ((None, None), 3)],
    ids=["epoch", "no-epoch", "no-epoch-fell"],
)
def test_a_robot_that_counts_from_zero_again_gives_whole_counts(
    store: MetadataStore, epochs: tuple[float | None, float | None], first_episodes: int
) -> None:
    # The robot's first agent evaluates 2 episodes, 0 successes; it is released and assigned
    # again, and its new agent reports 2 episodes, 2 successes. Taken as differences counter by
    # counter, that was "0 new episodes, 2 new successes": a rate of infinity and a run that
    # failed at its final report. With the tally's epoch the new counts are taken whole; without
    # one (an older robot computer) more new successes than new episodes say the same.
    source = RobotEvaluations(store, RUN, ["reach-v3"], lambda: ["arm-1"])
    first, second = epochs
    for epoch, episodes, successes, version in ((first, first_episodes, 0, 1), (second, 2, 2, 2)):
        counts = {"eval/reach-v3/episodes": episodes, "eval/reach-v3/successes": successes}
        if epoch is not None:
            counts["tally_epoch"] = epoch
        heartbeat(store, counts)
        source.offer(version, weights(version), lambda: Stamp(1.0, 0.1, 10, 0), False)
    points = [source.poll(False), source.poll(False)]
    assert [p.success["reach-v3"] for p in points if p is not None] == [0.0, 1.0]
    assert [p.extra["episodes"]["reach-v3"] for p in points if p is not None] == [first_episodes, 2]


def test_a_rate_outside_zero_to_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="success rate must lie in"):
        wilson_lower(2.0, 3)
    assert wilson_lower(1.0 + 1e-12, 3) == wilson_lower(1.0, 3)


def test_a_count_that_fell_under_one_epoch_adds_nothing_and_keeps_the_rate_in_bounds(
    store: MetadataStore,
) -> None:
    # Robot computer crashes lose what its agent counted after its last save: under the same
    # epoch the counts fall (5 -> 4 episodes), then a success follows (5 episodes, 4
    # successes). Nothing is counted twice and no point has more successes than episodes.
    source = RobotEvaluations(store, RUN, ["reach-v3"], lambda: ["arm-1"])
    seen: list[tuple[int, int, int]] = []
    for version, (episodes, successes) in enumerate([(5, 3), (4, 3), (5, 4), (7, 5)], 1):
        heartbeat(
            store,
            {
                "eval/reach-v3/episodes": episodes,
                "eval/reach-v3/successes": successes,
                "tally_epoch": 7.0,
            },
        )
        source.offer(version, weights(version), lambda: Stamp(1.0, 0.1, 10, 0), False)
        point = source.poll(False)
        if point is not None:
            n = point.extra["episodes"]["reach-v3"]
            seen.append((version, n, round(point.success["reach-v3"] * n)))
    # v1: 5 episodes, 3 successes; v2: nothing new (no point); v3: one episode whose success
    # is within it; v4: 2 more episodes, 1 success.
    assert seen == [(1, 5, 3), (3, 1, 1), (4, 2, 1)]


def test_a_resumed_run_counts_on_from_its_last_point(tmp_path: Path, store: MetadataStore) -> None:
    # The robots' counts cover the whole run (edge_agent.run_counts); a run that resumes after
    # a crash must not take them whole again: it counts on from what its last point took.
    def point(source: RobotEvaluations, version: int, episodes: int, successes: int) -> Any:
        counts = {
            "eval/reach-v3/episodes": episodes,
            "eval/reach-v3/successes": successes,
            "tally_epoch": 3.0,
        }
        heartbeat(store, counts)
        source.offer(version, weights(version), lambda: Stamp(1.0, 0.1, 10, 0), False)
        return source.poll(False)

    first = RobotEvaluations(store, RUN, ["reach-v3"], lambda: ["arm-1"], tmp_path)
    got = point(first, 1, 3, 1)
    assert got is not None and got.extra["episodes"]["reach-v3"] == 3
    resumed = RobotEvaluations(store, RUN, ["reach-v3"], lambda: ["arm-1"], tmp_path)
    assert point(resumed, 2, 3, 1) is None  # nothing new since the last point
    got = point(resumed, 3, 5, 2)
    assert got is not None
    assert (got.extra["episodes"]["reach-v3"], got.success["reach-v3"]) == (2, 0.5)
