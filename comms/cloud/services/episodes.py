"""The Episodes service: a robot's marks on its own episodes (discard, rerecord, and a kept
episode's outcome: success, failure) in, stored.

A mark changes only the calling robot's own steps (its id comes from the credential, never
from the message), so the robot's identity is all it needs: no lease is required, since a
robot released from a run right after an operator discarded an episode must still be able to
say so, or the run would train on that episode. The sink stores the mark durably before the
reply (:meth:`comms.cloud.step_sink.StepSink.mark_episode`).
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from comms.cloud.services.common import SINK_REFUSALS, ServerState, guarded, identify
from comms.cloud.step_sink import Backpressure, SinkClosed, SinkFull, SinkRejected
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire.marks import MARK_KINDS

KINDS = {wire: name for name, wire in MARK_KINDS.items()}


class EpisodesServicer(rpc.EpisodesServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Mark(
        self, request: pb.EpisodeMark, context: grpc.aio.ServicerContext
    ) -> pb.EpisodeMarkAck:
        """Store the mark in the run's sink; INVALID_ARGUMENT names a missing or bad field,
        NOT_FOUND an unknown run, RESOURCE_EXHAUSTED a full buffer disk and UNAVAILABLE a
        stopping run (both retryable: the robot keeps the mark)."""
        ident = await identify(self.s, context)
        kind = KINDS.get(request.kind)
        bad = _invalid(request)
        if bad is not None or kind is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"episode mark: {bad}")
        assert kind is not None
        sink = self.s.sinks(request.run_id)
        if sink is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run {request.run_id!r}")
        assert sink is not None
        try:
            steps = await asyncio.to_thread(
                sink.mark_episode,
                ident.robot_id,
                request.run_id,
                request.episode_index,
                kind,
                request.reason,
            )
        except (SinkRejected, SinkFull, SinkClosed) as exc:  # full, closed: the robot resends
            await context.abort(SINK_REFUSALS[type(exc)], f"episode mark: {exc}")
        except Backpressure as exc:  # a buffer shard away for now: the robot resends
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"episode mark: {exc}")
        return pb.EpisodeMarkAck(discarded_steps=steps)


def _invalid(mark: pb.EpisodeMark) -> str | None:
    """What is wrong with ``mark``'s fields, or None."""
    if not mark.run_id:
        return "run_id is empty"
    if mark.kind not in KINDS:
        return f"kind {mark.kind} is not DISCARD, RERECORD, SUCCESS or FAILURE"
    if mark.episode_index < 0:
        return f"episode_index {mark.episode_index} is negative"
    return None
