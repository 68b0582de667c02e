"""Episode marks: a robot's verdict on one of its episodes, by name and on the wire."""

from __future__ import annotations

from dataclasses import dataclass

from comms.proto import robofleet_pb2 as pb

# A mark's kind by name (what the buffer stores) -> on the wire.
MARK_KINDS = {
    "discard": pb.EpisodeMark.DISCARD,
    "rerecord": pb.EpisodeMark.RERECORD,
    "success": pb.EpisodeMark.SUCCESS,
    "failure": pb.EpisodeMark.FAILURE,
}
OUTCOME_KINDS = ("success", "failure")


@dataclass(frozen=True)
class EpisodeMark:
    """One mark on episode ``episode_index`` of the robot in ``run_id``.

    Attributes:
        kind: ``discard`` or ``rerecord`` (never trained on; a rerecorded task is recorded
            again), or the kept episode's outcome, ``success`` or ``failure``.
        reason: who said so (``keyboard``, ``gamepad``, ``cloud: <actor>``, ``driver``...),
            for the record.
    """

    run_id: str
    episode_index: int
    kind: str
    reason: str = ""
