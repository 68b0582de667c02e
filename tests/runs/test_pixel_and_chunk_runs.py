"""Runs that train on camera frames and act in chunks, on a real ``robofleet cloud`` whose
simulated robot computers render a Meta-World camera (real Ray, gRPC, buffer, learner
process): a CNN policy, a flow-matching chunk policy and LeRobot's ACT each train through a run
and their versions drive the robots; then a second run mounts the first run's successful
episodes and starts from its promoted version, and a run whose hidden sizes do not fit that
version is refused naming the tensor and the spec key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from buffer import ReplayBuffer
from cloud_learner.metrics import read_metrics
from comms.cloud.weight_file import weight_file_name
from edge_agent.policy_build import CardPolicy
from foundation.rows import RowFilter
from foundation.store.models import RunState
from tests.fakes.cloud import RobofleetCloud, store_for
from tests.runs.helpers import launch, run_dir, spec_file, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CAM = "observation.images.corner"
SIZE = 32
ENDED = (RunState.FINISHED, RunState.STOPPED, RunState.CRASHED)
FAST = {
    "bc_updates": 20,
    "max_episode_steps": 40,
    "eval_max_steps": 40,
    "updates_per_s": 10,
    "checkpoint_every_updates": 40,
    "batch_size": 32,
    "control_hz": 10,
}
RUNS: dict[str, dict[str, Any]] = {
    "cnn": {"kind": "cnn", "hidden_sizes": [64, 32]},
    "flow": {"kind": "flow-chunk", "chunk_size": 4, "hidden_sizes": [64, 64]},
    "act": {
        "kind": "lerobot-act",
        "chunk_size": 4,
        "config": {
            "dim_model": 32,
            "n_heads": 2,
            "dim_feedforward": 64,
            "n_encoder_layers": 1,
            "n_decoder_layers": 1,
        },
    },
}


def write_spec(data_dir: Path, name: str, policy: dict[str, Any], **extra: Any) -> Path:
    return spec_file(
        data_dir / f"{name}.yaml",
        name,
        1,
        hyperparameters=FAST,
        policy=policy,
        evaluation={"on": "robots", "every_episodes": 3, "every_seconds": 10},
        publish={"every_updates": 10},
        stop={"env_steps": 240},
        demonstrations={"episodes_per_task": 1},  # with frames, on the robot
        **extra,
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RobofleetCloud, Path]]:
    data_dir = tmp_path_factory.mktemp("pixels")
    cloud = RobofleetCloud(data_dir, sim_robots=3, cameras="corner", image_size=SIZE)
    try:
        yield cloud, data_dir
    finally:
        cloud.stop()


@pytest.fixture(scope="module")
def first_runs(lab: tuple[RobofleetCloud, Path]) -> dict[str, str]:
    cloud, data_dir = lab
    ids = {name: launch(data_dir, write_spec(data_dir, name, p)) for name, p in RUNS.items()}
    store = store_for(data_dir)
    for run_id in ids.values():
        wait_until(lambda r=run_id: state(store, r) in ENDED, 600, cloud.fail_text)
    return ids


def state(store: Any, run_id: str) -> RunState:
    run = store.get_run(run_id)
    assert run is not None
    return run.state


def robot_steps(directory: Path) -> dict[str, np.ndarray]:
    buf = ReplayBuffer.open(directory / "buffer", read_only=True)
    try:
        return buf.read_transitions(buf.select(), count=False)
    finally:
        buf.close()


def finished(data_dir: Path, run_id: str) -> Path:
    store = store_for(data_dir)
    run = store.get_run(run_id)
    assert run is not None and run.state == RunState.FINISHED, run and run.reason
    return run_dir(store, run_id)


def test_a_cnn_policy_trains_on_frames_and_robots_act_with_its_versions(
    lab: tuple[RobofleetCloud, Path], first_runs: dict[str, str]
) -> None:
    directory = finished(lab[1], first_runs["cnn"])
    steps = robot_steps(directory)
    frames = steps[CAM]
    assert frames.dtype == np.uint8 and frames.shape[1:] == (SIZE, SIZE, 3)
    assert frames.std() > 0  # rendered scenes, not blank frames
    versions = steps["policy_version"]
    on_disk = [
        v
        for v in sorted(set(versions.tolist()))
        if (directory / "weights" / weight_file_name(v)).exists()
    ]
    assert on_disk and max(on_disk) >= 2, (sorted(set(versions.tolist())), on_disk)
    # The novice's proposals the robot recorded are exactly what the published version's
    # network gives on the stored frames: frames reached the buffer bit-exact and the robot
    # ran the CNN of that version.
    torch.set_num_threads(1)
    robot = CardPolicy(39, 4, 1, hidden=64, stochastic=False, cameras={CAM: (SIZE, SIZE)})
    checked = 0
    for version in on_disk:
        robot.set_weights(load_file(str(directory / "weights" / weight_file_name(version))))
        assert (
            robot.kind == "mlp" and robot.card is not None and robot.card.spec.image_keys == [CAM]
        )
        for i in np.flatnonzero(versions == version)[:5]:
            obs = {"observation.state": steps["observation.state"][i], CAM: frames[i]}
            assert np.allclose(robot.act(obs, 0), steps["action.policy"][i], atol=1e-5)
            checked += 1
    assert checked >= 5
    # Other frames, other actions: the policy looks at the camera.
    obs = {"observation.state": steps["observation.state"][0], CAM: frames[0]}
    dark = {**obs, CAM: np.zeros_like(frames[0])}
    assert not np.allclose(robot.act(obs, 0), robot.act(dark, 0), atol=1e-4)


def _changes_off_chunk_starts(steps: dict[str, np.ndarray], chunk: int) -> list[tuple[int, int]]:
    """(frame_index, new version) where a robot episode's version changes at a step that does
    not start a chunk. A chunk starts at an episode's first step, ``chunk`` steps after the
    last start, and at the step after an operator's takeover step (a takeover ends the
    chunk: ``edge_agent.agent``)."""
    out = []
    order = np.lexsort((steps["frame_index"], steps["episode_index"]))
    ep, fr, ver, op = (
        steps[k][order]
        for k in ("episode_index", "frame_index", "policy_version", "is_intervention")
    )
    start = 0
    for i in range(1, len(order)):
        if ep[i] != ep[i - 1]:
            start = i
            continue
        if op[i - 1] or i - start >= chunk:
            start = i
        if ver[i] != ver[i - 1] and ver[i] >= 0 and ver[i - 1] >= 0 and start != i:
            out.append((int(fr[i]), int(ver[i])))
    return out


@pytest.mark.parametrize("name", ["flow", "act"])
def test_chunk_policies_train_and_robots_change_versions_only_at_chunk_boundaries(
    lab: tuple[RobofleetCloud, Path], first_runs: dict[str, str], name: str
) -> None:
    directory = finished(lab[1], first_runs[name])
    report = json.loads((directory / "report.json").read_text())
    assert report["acked_lost"] == 0 and report["versions_published"] >= 2
    rows = [r for r in read_metrics(directory) if "loss" in r]
    assert rows and all(np.isfinite(r["loss"]) for r in rows)
    steps = robot_steps(directory)
    assert int(steps["policy_version"].max()) >= 2  # robots acted with trained versions
    # A new version starts only with a new chunk of 4 (or the episode, or after a takeover).
    assert _changes_off_chunk_starts(steps, 4) == []
    assert int(steps["policy_version"][steps["policy_version"] >= 0].min()) < int(
        steps["policy_version"].max()
    )  # versions did change within the run


def test_a_second_run_mounts_the_first_runs_successes_and_starts_from_its_version(
    lab: tuple[RobofleetCloud, Path], first_runs: dict[str, str]
) -> None:
    cloud, data_dir = lab
    first = first_runs["cnn"]
    first_dir = finished(data_dir, first)
    store = store_for(data_dir)
    promoted = json.loads((first_dir / "promoted.json").read_text())["version"]
    buf = ReplayBuffer.open(first_dir / "buffer", read_only=True)
    try:
        successes = len(buf.select(RowFilter(success_only=True)))
    finally:
        buf.close()
    spec = write_spec(
        data_dir,
        "second",
        {**RUNS["cnn"], "init_from_run": first},
        buffer={"offline_data": [{"source": first, "success_only": True}]},
    )
    second = launch(data_dir, spec)
    wait_until(lambda: state(store, second) in ENDED, 600, cloud.fail_text)
    directory = finished(data_dir, second)
    report = json.loads((directory / "report.json").read_text())
    assert report["started_from"] == {"run": first}
    [source] = report["offline_data"]
    assert source["found_as"] == "run" and source["copied"] is False
    assert source["filters"] == {"success_only": True} and source["rows"] == successes
    if successes:  # its rows reached the learner's batches
        shares = [r["offline_share"] for r in read_metrics(directory) if "offline_share" in r]
        assert shares and max(shares) > 0
    assert promoted >= 1


def test_starting_weights_that_do_not_fit_end_the_run_naming_tensor_and_key(
    lab: tuple[RobofleetCloud, Path], first_runs: dict[str, str]
) -> None:
    cloud, data_dir = lab
    store = store_for(data_dir)
    first = first_runs["cnn"]
    finished(data_dir, first)
    spec = write_spec(
        data_dir, "misfit", {"kind": "cnn", "hidden_sizes": [48], "init_from_run": first}
    )
    run_id = launch(data_dir, spec)
    wait_until(lambda: state(store, run_id) in ENDED, 300, cloud.fail_text)
    run = store.get_run(run_id)
    assert run is not None and run.state == RunState.CRASHED
    assert "head.0.weight" in run.reason and "policy.hidden_sizes" in run.reason, run.reason


def record_lerobot_dataset(root: Path, episodes: int = 3, steps: int = 30) -> dict[str, Any]:
    """A LeRobotDataset v3 recorded with LeRobot's own API from a Meta-World robot with the
    robots' camera, driven by the scripted expert: PNG frames, ``next.reward``/``next.done``,
    HIL-SERL's ``complementary_info.is_intervention`` (every third frame) and a task sentence
    that is not a run task name."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    driver = MetaWorldDriver(
        "recorder", tasks=["reach-v3"], cameras=["corner"], image_size=(SIZE, SIZE)
    )
    features = {
        "observation.state": {"dtype": "float32", "shape": (39,), "names": None},
        CAM: {"dtype": "image", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "complementary_info.is_intervention": {"dtype": "float32", "shape": (1,), "names": None},
    }
    ds = LeRobotDataset.create(
        "local/reach", 10, features, root=root, use_videos=False, video_backend="pyav"
    )
    expert = expert_policy("reach-v3")
    flags = 0
    driver.connect()
    try:
        for e in range(episodes):
            obs = driver.reset(task="reach-v3", seed=500 + e)
            for i in range(steps):
                action = np.clip(expert(obs), -1, 1).astype(np.float32)
                driver.send_action({"action": action})
                flag = i % 3 == 0
                flags += flag
                ds.add_frame(
                    {
                        "observation.state": obs["observation.state"],
                        CAM: obs[CAM],
                        "action": action,
                        "next.reward": np.array([driver.episode.reward], np.float32),
                        "next.done": np.array([i == steps - 1]),
                        "complementary_info.is_intervention": np.array([float(flag)], np.float32),
                        "task": "reach the red target",
                    }
                )
                obs = driver.get_observation()
            ds.save_episode()
    finally:
        driver.disconnect()
    ds.finalize()
    return {"frames": episodes * steps, "interventions": flags}


def test_a_lerobot_dataset_is_refused_by_task_then_mixed_into_a_run_at_its_share(
    lab: tuple[RobofleetCloud, Path], first_runs: dict[str, str], tmp_path: Path
) -> None:
    from tests.fakes.cloud import cli

    cloud, data_dir = lab
    store = store_for(data_dir)
    dataset = tmp_path / "reach-dataset"
    written = record_lerobot_dataset(dataset)
    # Without the task it names, its sentence is no run task: refused before any lease.
    spec = write_spec(data_dir, "no-task", RUNS["cnn"], buffer={"offline_data": [str(dataset)]})
    out = cli(data_dir, "run", "launch", str(spec), "--json")
    assert out.returncode != 0 and "buffer.offline_data[0]" in out.stderr, out.stderr
    assert "reach the red target" in out.stderr
    # Another robot's dataset: each feature that differs is named, nothing is leased.
    from tests.lab_data.lerobot_data import hil_serl_dataset

    hil_serl_dataset(tmp_path / "other-robot")
    other = {"source": str(tmp_path / "other-robot"), "task": "reach-v3"}
    spec = write_spec(data_dir, "misfit-data", RUNS["cnn"], buffer={"offline_data": [other]})
    out = cli(data_dir, "run", "launch", str(spec), "--json")
    assert out.returncode != 0, out.stdout
    for feature in ("observation.state", "observation.images.front", CAM, "action"):
        assert feature in out.stderr, out.stderr
    source = {"source": str(dataset), "task": "reach-v3"}
    spec = write_spec(
        data_dir,
        "from-dataset",
        RUNS["cnn"],
        buffer={"offline_data": [source], "online_fraction": 0.25},
    )
    run_id = launch(data_dir, spec)
    wait_until(lambda: state(store, run_id) in ENDED, 600, cloud.fail_text)
    directory = finished(data_dir, run_id)
    report = json.loads((directory / "report.json").read_text())
    [mounted] = report["offline_data"]
    assert mounted["format"] == "lerobot" and mounted["copied"] is True
    assert mounted["rows"] == written["frames"] and mounted["tasks"] == ["reach-v3"]
    # Imported once into the run's offline store: frames uint8, interventions intact.
    steps = robot_steps(directory / "offline" / "0")
    assert steps[CAM].dtype == np.uint8 and len(steps[CAM]) == written["frames"]
    assert int(steps["is_intervention"].sum()) == written["interventions"]
    # The learner's batches had the configured share of dataset rows (3/4 offline).
    shares = [r["offline_share"] for r in read_metrics(directory) if "offline_share" in r]
    assert shares and abs(float(np.mean(shares)) - 0.75) < 0.1, shares
    assert report["online_share_per_task"] == {"reach-v3": 0.25}
