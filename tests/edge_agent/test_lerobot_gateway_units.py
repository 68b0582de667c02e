"""The gateway's readers on their own: LeRobot's chunk order, the restricted interactions
reader against pickles that name code, transitions that do not load with ``weights_only``,
and LeRobot's images."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from lerobot.transport.utils import (
    python_object_to_bytes,
    send_bytes_in_chunks,
    transitions_to_bytes,
)

from edge_agent.episodes import EpisodeLog
from edge_agent.lerobot_gateway.chunks import ChunkAssembler, ChunkError
from edge_agent.lerobot_gateway.features import actor_config
from edge_agent.lerobot_gateway.interactions import (
    InteractionRefused,
    as_metrics,
    read_interaction,
)
from edge_agent.lerobot_gateway.transitions import TransitionIntake, TransitionRefused


def test_lerobot_chunks_reassemble_and_disorder_is_refused() -> None:
    from lerobot.transport import services_pb2

    data = os.urandom(5 * 1024 * 1024)  # three of LeRobot's 2 MB chunks
    asm = ChunkAssembler(max_bytes=8 * 1024 * 1024)
    out = [
        asm.add(m.transfer_state, m.data)
        for m in send_bytes_in_chunks(data, services_pb2.Transition)
    ]
    assert out[:-1] == [None, None] and out[-1] == data
    single = next(iter(send_bytes_in_chunks(b"abc", services_pb2.Transition)))
    assert asm.add(single.transfer_state, single.data) == b"abc"  # a lone END
    with pytest.raises(ChunkError, match="MIDDLE"):
        asm.add(services_pb2.TransferState.TRANSFER_MIDDLE, b"x")
    small = ChunkAssembler(max_bytes=1024)
    with pytest.raises(ChunkError, match="over 1024"):
        for m in send_bytes_in_chunks(data, services_pb2.Transition):
            small.add(m.transfer_state, m.data)


class Reduce:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_interactions_reader_runs_no_code_and_reads_lerobot_stats(
    tmp_path: Path, protocol: int
) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(InteractionRefused, match="system"):
        read_interaction(pickle.dumps({"x": Reduce(marker)}, protocol=protocol))
    with pytest.raises(InteractionRefused, match="bytes|_codecs"):  # protocol 0: a call
        read_interaction(pickle.dumps({"x": b"raw"}, protocol=protocol))
    with pytest.raises(InteractionRefused, match="top level"):
        read_interaction(pickle.dumps([1, 2], protocol=protocol))
    with pytest.raises(InteractionRefused, match="not a readable pickle"):
        read_interaction(b"\x80\x05garbage")
    assert not marker.exists()
    stats = {"Episodic reward": 1.0, "Interaction step": 7, "Policy frequency [Hz]": 30.5}
    assert read_interaction(python_object_to_bytes(stats)) == stats
    assert as_metrics(stats)["lerobot.policy_frequency_hz"] == 30.5


class Foreign:
    pass


def test_transitions_with_foreign_objects_do_not_load(tmp_path: Path) -> None:
    cfg = actor_config(
        {
            "policy": {
                "input_features": {
                    "observation.state": {"type": "STATE", "shape": [2]},
                    "observation.images.front": {"type": "VISUAL", "shape": [3, 4, 5]},
                },
                "output_features": {"action": {"type": "ACTION", "shape": [1]}},
            }
        }
    )
    intake = TransitionIntake(
        cfg.schema(), EpisodeLog(tmp_path), {"robot_id": "7", "run_id": "r", "task": "t"}, 10.0
    )
    buf = io.BytesIO()
    torch.save([{"state": Foreign()}], buf)
    with pytest.raises(TransitionRefused, match="weights_only"):
        intake.convert(buf.getvalue(), 0)

    image = torch.rand(1, 3, 4, 5)
    good = {
        "state": {"observation.state": torch.zeros(1, 2), "observation.images.front": image},
        "action": torch.zeros(1, 1),
        "reward": torch.tensor(0.5),
        "next_state": {"observation.state": torch.ones(1, 2), "observation.images.front": image},
        "done": torch.tensor(True),
        "truncated": False,
        "complementary_info": {"is_intervention": torch.tensor(True)},
    }
    bright = {**good, "state": {**good["state"], "observation.images.front": image * 3}}
    rows, refused = intake.convert(transitions_to_bytes([bright, good]), 4)
    assert len(refused) == 1 and "transition 0" in refused[0] and "images.front" in refused[0]
    (row,) = rows
    assert row["observation.images.front"].shape == (4, 5, 3)
    assert row["observation.images.front"].dtype.name == "uint8"
    assert row["is_intervention"] and row["terminated"] and row["policy_version"] == 4
    assert "next.observation.state" in row


def test_a_message_is_checked_once_and_a_schema_refusal_names_each_transition(
    tmp_path: Path,
) -> None:
    """The rows of a message are checked by the schema together; when that check fails each is
    checked alone and refused by name, and refused transitions take no frame."""
    cfg = actor_config(
        {
            "policy": {
                "input_features": {"observation.state": {"type": "STATE", "shape": [2]}},
                "output_features": {"action": {"type": "ACTION", "shape": [1]}},
            }
        }
    )

    def step(done: bool) -> dict[str, Any]:
        return {
            "state": {"observation.state": torch.zeros(1, 2)},
            "action": torch.zeros(1, 1),
            "reward": 0.0,
            "next_state": {"observation.state": torch.ones(1, 2)},
            "done": done,
            "truncated": False,
        }

    episode = transitions_to_bytes([step(False), step(False), step(True)])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ok = TransitionIntake(
        cfg.schema(), EpisodeLog(tmp_path / "a"), {"robot_id": "7", "run_id": "r", "task": "t"}, 10
    )
    rows, refused = ok.convert(episode, 1)
    assert refused == [] and [r["frame_index"] for r in rows] == [0, 1, 2]
    assert [r["timestamp"] for r in rows] == [0.0, 0.1, 0.2]
    # An empty robot id passes the per-transition checks and fails the schema's: every row.
    bad = TransitionIntake(
        cfg.schema(), EpisodeLog(tmp_path / "b"), {"robot_id": "", "run_id": "r", "task": "t"}, 10
    )
    rows, refused = bad.convert(episode, 1)
    assert rows == [] and len(refused) == 3
    assert [line.split(":")[0] for line in refused] == [f"transition {i}" for i in range(3)]
    assert all("robot_id" in line for line in refused), refused
    # The episode ended (its last transition said done) though nothing of it was stored.
    rows, refused = bad.convert(transitions_to_bytes([step(True)]), 1)
    assert len(refused) == 1 and refused[0].startswith("transition 3")
