"""The cloud side of ``help.risk: probe``: the buffer gives the latest ended episodes a policy
acted in (not demonstrations, not running ones), the run's learner labels them (a takeover
within K steps), trains the probe on its policy's activations and ships it in the next
version, which a robot's policy still loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load

from buffer import ReplayBuffer, StepSchema
from buffer.service.batches import BatchServer
from buffer.table.labels import recent_policy_episodes
from cloud_learner.help_probe import CARD_KEY, HelpProbe
from cloud_learner.help_probe_training import SAVED, ProbeTrainer
from cloud_learner.metrics import read_metrics
from cloud_learner.process import RunLearner
from comms.cloud.weight_file import latest_version, read_weights, weight_file_name
from edge_agent.policy_build import CardPolicy
from foundation.runspec import HelpSpec
from tests.buffer.helpers import BATCH_TOKEN
from tests.cloud_learner.helpers import ACTION, STATE

STEPS, TAKEOVER = 20, 14  # a person takes over from step 14 of each policy episode


def _records(episodes: int) -> list[dict[str, Any]]:
    """Episodes drifting along state dim 0; a demonstration (policy version 0) and an
    episode still running (no done step) at the end."""
    out: list[dict[str, Any]] = []
    kinds = ["policy"] * episodes + ["demonstration", "running"]
    for e, kind in enumerate(kinds):
        for t in range(STEPS if kind != "running" else 5):
            state = np.zeros(39, np.float32)
            state[0] = t / STEPS
            last = t == STEPS - 1
            out.append(
                {
                    "seq": len(out),
                    "robot_id": "robot-1",
                    "run_id": "run-1",
                    "task": "reach-v3",
                    "episode_index": e,
                    "frame_index": t,
                    "timestamp": t / 20,
                    "reward": 0.0,
                    "terminated": False,
                    "truncated": last,
                    "is_intervention": kind == "demonstration" or t >= TAKEOVER,
                    "policy_version": 0 if kind == "demonstration" else 1,
                    "action": np.zeros(4, np.float32),
                    "observation.state": state,
                    **({"next.observation.state": state} if last else {}),
                }
            )
    return out


def test_learner_trains_the_probe_and_ships_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = {
        "version": 1,
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "policy": {"kind": "mlp", "hidden_sizes": [16, 16]},
        "robots": {"robot_type": "metaworld-sawyer", "count": 1},
        "hyperparameters": {"bc_updates": 2, "batch_size": 32, "updates_per_s": 0},
        "publish": {"every_updates": 10},
        "help": {"risk": "probe", "probe_every_updates": 5, "probe_horizon": 4},
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buf = ReplayBuffer.open(run_dir / "buffer", schema)
    buf.append(schema.batch_from_records(_records(6)))
    found = recent_policy_episodes(buf, 4)
    assert [e.key[2] for e in found] == [2, 3, 4, 5]  # the latest 4; no demo, no running one
    assert all(len(e.rows) == STEPS and not e.failed for e in found)
    server = BatchServer(buf, ["reach-v3"], token=BATCH_TOKEN)
    proc = RunLearner.open(run_dir, server.address, token=BATCH_TOKEN)
    try:
        assert proc.probe is not None
        proc.run(lambda: proc.learner.step >= 12, lambda: False)
    finally:
        proc.close()
        server.close()
        buf.close()
    rows = read_metrics(run_dir, prefix="help_probe")
    assert [r["step"] for r in rows] == [5]  # at update 10 the episodes were the same
    # autonomous steps of 6 episodes: 14 each; positives: steps 10..13 of each
    assert (rows[0]["help_probe_steps"], rows[0]["help_probe_positives"]) == (84, 24)
    weights = run_dir / "weights"
    assert latest_version(weights) == 2
    first = load(bytes(read_weights(weights / weight_file_name(1))))
    shipped = load(bytes(read_weights(weights / weight_file_name(2))))
    assert CARD_KEY not in first and CARD_KEY in shipped
    probe = HelpProbe.from_tensors(shipped)
    assert probe.version == 1 and probe.dim == 16
    CardPolicy(39, 4, 1, 16).set_weights(shipped)  # the robot's policy leaves the probe out
    assert (run_dir / SAVED).is_file() and ProbeTrainer(HelpSpec(), run_dir).version == 1
