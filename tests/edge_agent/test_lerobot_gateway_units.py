"""The gateway's readers on their own: LeRobot's chunk order, the restricted interactions
reader against pickles that name code, transitions that do not load with ``weights_only``,
and LeRobot's images."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

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
