"""SAC/RLPD runs of the full system on blind Meta-World robots, one per reward source.

Part of ``robofleet bench rewards``. Each run is what ``robofleet bench efficiency`` runs
(a fresh local cloud, :class:`robofleet.cloud.CloudService`, with simulated robot computers,
``robofleet.sim.computers``) with ``algorithm: sac`` and one ``reward.source``:

* ``robot``: robots that report the simulator's true sparse reward (1.0 on each solved step)
  and its success;
* ``labels``: robots that report neither; the simulated person (``edge_agent.simulated_person``)
  labels every episode from the scene and the verdict is the reward;
* ``classifier``: the same blind robots; the person labels the first ``labelled_episodes``
  episodes of each robot (``edge.scripted_labelled_episodes``), the reward classifier trained
  on them gives the reward after that (the person still reviews its proposals);
* ``none`` (the control): the same blind robots with ``reward.source: labels`` and a person
  who labels nothing, so no reward reaches the learner: what the demonstrations and SAC's
  behaviour term teach alone. A source's rise above this line is what its reward taught.

Nothing else differs: the same demonstrations (the scripted expert), no operator takeovers
(the gate's threshold is out of reach, so only the reward and the demonstrations teach), the
same SAC knobs and wall-clock budget. Ground-truth success over time comes from
``evaluation.on: simulator``: the cloud evaluates each policy snapshot on fixed seeds with the
simulator's own success (measurement only; nothing of it reaches the learner).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SOURCES = ("robot", "labels", "classifier", "none")
# The last third of a run's evaluation points: its "late" success (one point is noisy).
LATE_FRACTION = 1 / 3
# No takeovers: the scripted operator's gate opens when |policy - expert| exceeds this.
NO_TAKEOVER_GATE = 1e6
# SAC's knobs for a 0/1 reward (SACOptions; reward_scale 0.1 is for Meta-World's 0-10 dense).
SAC_KNOBS: dict[str, float | int] = {
    "reward_scale": 1.0,
    "bc_weight": 1.0,
    "critic_warmup_updates": 400,
    "init_temperature": 0.01,
}
# Rows sampled per robot row inserted: 2 updates per env step at batch 128 (RLPD's point is a
# high update-to-data ratio; the demo's 0.5 leaves the learner idle at a fleet of two).
SAMPLES_PER_INSERT = 256.0


def driver_options(source: str) -> dict[str, Any]:
    """The robots' ``MetaWorldDriver`` options of a source: the true sparse reward with
    success reported for ``robot``, nothing of either for ``labels`` and ``classifier``.

    Raises:
        ValueError: an unknown source.
    """
    if source == "robot":
        return {"reward": "sparse", "detects_success": True}
    if source in ("labels", "classifier", "none"):
        return {"reward": "none", "detects_success": False}
    raise ValueError(f"unknown reward source {source!r}; known: {list(SOURCES)}")


def run_spec(
    source: str,
    *,
    task: str,
    robots: int,
    minutes: float,
    eval_every_s: float,
    eval_episodes: int,
    demonstrations: int,
    labelled_episodes: int,
    control_hz: float,
    knobs: Mapping[str, float | int],
    samples_per_insert: float = SAMPLES_PER_INSERT,
) -> Any:
    """The SAC run spec of one source (``robofleet.commands.demo.sim_fleet_spec`` with
    ``reward``, ``demonstrations.episodes_per_task`` and ``knobs`` as hyper-parameters).

    Raises:
        foundation.runspec.RunSpecError: the spec is invalid (e.g. an unknown knob).
    """
    from foundation.runspec import parse_run_spec
    from robofleet.commands.demo import sim_fleet_spec

    base = sim_fleet_spec(
        f"bench-rewards-{source}",
        "sac",
        [task],
        robots,
        minutes=minutes,
        eval_every_s=eval_every_s,
        eval_episodes=eval_episodes,
        control_hz=control_hz,
        samples_per_insert=samples_per_insert,
        eval_on="simulator",
    )
    doc = base.model_dump(mode="json", exclude_none=True)
    doc["hyperparameters"] = {**doc.get("hyperparameters", {}), **dict(knobs)}
    doc["demonstrations"] = {**doc.get("demonstrations", {}), "episodes_per_task": demonstrations}
    # The classifier's first version waits for the labelled episodes of the whole fleet.
    min_labelled = max(2, labelled_episodes * robots)
    reward_source = "labels" if source == "none" else source  # nobody labels: no reward
    doc["reward"] = {
        "source": reward_source,
        "classifier": {"min_labelled_episodes": min_labelled},
    }
    return parse_run_spec(doc)


def run_source(
    source: str,
    *,
    task: str = "reach-v3",
    robots: int = 2,
    minutes: float = 3.0,
    eval_every_s: float = 20.0,
    eval_episodes: int = 10,
    demonstrations: int = 10,
    labelled_episodes: int = 10,
    control_hz: float = 40.0,
    knobs: Mapping[str, float | int] = SAC_KNOBS,
    samples_per_insert: float = SAMPLES_PER_INSERT,
    config: str | None = None,
    keep: Path | None = None,
) -> dict[str, Any]:
    """One SAC run of ``source`` (module docstring) in a fresh cloud in a temporary
    ``data_dir`` (``keep/<source>`` when ``keep`` is given: the run's files stay there for
    inspection); ``minutes`` is the run's wall-clock budget (its stop condition).

    Returns:
        ``source``, ``history`` (the run's evals.jsonl rows: wall_s, env_steps,
        success_mean, ...), ``initial_success`` / ``final_success`` / ``best_success`` /
        ``late_success`` (ground truth, 0..1; :func:`late_success`), ``env_steps``,
        ``episodes`` (the robots' own count, demonstrations included), ``endings``
        (:func:`episode_endings`), ``classifier`` (:func:`classifier_figures`), ``minutes``.

    Raises:
        RuntimeError: the cloud did not start or the run left no result.
    """
    from robofleet.bench.efficiency import run_in_fresh_cloud
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robots

    spec = run_spec(
        source,
        task=task,
        robots=robots,
        minutes=minutes,
        eval_every_s=eval_every_s,
        eval_episodes=eval_episodes,
        demonstrations=demonstrations,
        labelled_episodes=labelled_episodes,
        control_hz=control_hz,
        knobs=knobs,
        samples_per_insert=samples_per_insert,
    )
    with tempfile.TemporaryDirectory(prefix=f"bench-rewards-{source}-") as tmp:
        data_dir = Path(tmp) if keep is None else keep / source
        settings = load_settings(config, data_dir=data_dir)
        edge = settings.edge.model_copy(
            update={
                "weight_apply_at": "chunk_boundary",
                "gating_threshold": NO_TAKEOVER_GATE,
                "scripted_labelled_episodes": _labelled(source, labelled_episodes),
                "scripted_ready_after_s": 0.0,
            }
        )
        settings = settings.model_copy(update={"edge": edge})
        t0 = time.monotonic()
        fleet = sim_robots(robots, driver_options=driver_options(source))
        run = run_in_fresh_cloud(settings, fleet, spec, "bench-rewards")
        run_dirs = sorted((data_dir / "runs").glob("*/"))
        endings = episode_endings(run_dirs[-1]) if run_dirs else {}
        classifier = classifier_figures(run_dirs[-1]) if run_dirs else {}
    if not run.result:
        raise RuntimeError(f"the {source} run left no result")
    history = run.history
    episodes = sum(int(r.get("episodes", 0)) for r in run.robot_stats.values())
    return {
        "source": source,
        "history": history,
        "initial_success": run.result.get("initial_success"),
        "final_success": run.result.get("final_success"),
        "best_success": max((float(h["success_mean"]) for h in history), default=None),
        "late_success": late_success(history),
        "endings": endings,
        "classifier": classifier,
        "env_steps": int(run.result.get("env_steps") or 0),
        "episodes": episodes,
        "minutes": round(float(run.result.get("minutes") or (time.monotonic() - t0) / 60), 2),
    }


def _labelled(source: str, labelled_episodes: int) -> int | None:
    """Episodes each robot's simulated person labels: the first ``labelled_episodes`` for the
    classifier, none for the control, every one (None) otherwise."""
    return {"classifier": labelled_episodes, "none": 0}.get(source)


def late_success(history: list[dict[str, Any]]) -> float | None:
    """Mean ground-truth success (0..1) over the last :data:`LATE_FRACTION` of the run's
    evaluation points after the first (the initial policy's, used only when it is the only
    one); None without evaluations."""
    points = [float(h["success_mean"]) for h in history]
    if not points:
        return None
    later = points[1:] or points
    n = max(1, round(len(later) * LATE_FRACTION))
    return round(sum(later[-n:]) / n, 3)


def episode_endings(run_dir: Path) -> dict[str, int]:
    """How the run's episodes ended, from its buffer's ``episode_marks.jsonl``: counts keyed
    ``<kind> by <reason>`` (``success by classifier``; ``failure by SimulatedPerson``: the
    person's verdicts and overrules; ``failure by driver``: the step limit)."""
    path = run_dir / "buffer" / "episode_marks.jsonl"
    if not path.exists():
        return {}
    marks = (json.loads(line) for line in path.read_text().splitlines() if line)
    return dict(Counter(f"{m.get('kind')} by {m.get('reason')}" for m in marks))


def classifier_figures(run_dir: Path) -> dict[str, float]:
    """The run's last reward-classifier training (``metrics.jsonl`` rows with prefix
    ``classifier``): ``version``, ``train_episodes``, ``holdout_episodes``, and held-out
    per-episode ``precision`` / ``recall``; empty when the run trained none."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    last: dict[str, float] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line) if '"classifier"' in line else {}
        if row.get("prefix") == "classifier":
            last = {k.removeprefix("classifier_"): v for k, v in row.items()
                    if k.startswith("classifier_")}  # fmt: skip
    return last
