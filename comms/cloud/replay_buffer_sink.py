"""The :class:`~comms.cloud.step_sink.StepSink` of a run: uploads go into its
:class:`buffer.ReplayBuffer`.

The buffer acknowledges after fdatasync and reports the highest durable ``seq`` per robot; its
rate limiter's refusal becomes :class:`~comms.cloud.step_sink.Backpressure`, a full disk
:class:`~comms.cloud.step_sink.SinkFull`, an invalid batch or episode mark
:class:`~comms.cloud.step_sink.SinkRejected`, a closed buffer (its run stopping)
:class:`~comms.cloud.step_sink.SinkClosed`. Robots are keyed in the buffer by ``str(robot_id)``.
"""

from __future__ import annotations

import pyarrow as pa

from buffer import (
    BackpressureError,
    BufferClosedError,
    DiskFullError,
    ReplayBuffer,
    StepValidationError,
)
from comms.cloud.step_sink import Backpressure, SinkClosed, SinkFull, SinkRejected
from comms.wire.steps import NO_SEQ


class ReplayBufferSink:
    """Adapter from the transport to one run's replay buffer.

    Args:
        buffer: an open, writable replay buffer (or a sharded run's shards,
            ``buffer.service.shard_client.ShardActors``: the same calls).
        append_timeout_s: how long an append may wait for the rate limiter before the robot is
            told to back off (0 = answer at once).
    """

    def __init__(self, buffer: ReplayBuffer, append_timeout_s: float = 0.0) -> None:
        self.buffer = buffer
        self.append_timeout_s = append_timeout_s

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        key = str(robot_id)
        if pa.types.is_integer(batch.schema.field("robot_id").type):
            # Robots may send integer ids; the buffer's column is the id as a string.
            i = batch.schema.get_field_index("robot_id")
            batch = batch.set_column(i, "robot_id", pa.array([key] * batch.num_rows, pa.string()))
        try:
            result = self.buffer.append(batch, timeout=self.append_timeout_s)
        except BackpressureError as exc:
            raise Backpressure(str(exc), exc.retry_after_s) from None
        except DiskFullError as exc:
            raise SinkFull(str(exc)) from None
        except StepValidationError as exc:
            raise SinkRejected(str(exc)) from None
        except BufferClosedError as exc:
            raise SinkClosed(str(exc)) from None
        return int(result.acked.get(key, self.durable_seq(robot_id)))

    def durable_seq(self, robot_id: int) -> int:
        # Durable rows only: the index also holds rows of appends still in flight, or failed
        # (a full disk) and not yet dropped, and those must never be acknowledged.
        try:
            last = self.buffer.durable_seq(robot_id)
        except BackpressureError as exc:  # a buffer shard that is away for now
            raise Backpressure(str(exc), exc.retry_after_s) from None
        except BufferClosedError as exc:
            raise SinkClosed(str(exc)) from None
        return NO_SEQ if last is None else int(last)

    def mark_episode(
        self, robot_id: int, run_id: str, episode_index: int, kind: str, reason: str = ""
    ) -> int:
        try:
            return self.buffer.mark_episode(str(robot_id), run_id, episode_index, kind, reason)
        except DiskFullError as exc:
            raise SinkFull(str(exc)) from None
        except ValueError as exc:
            raise SinkRejected(str(exc)) from None
        except BackpressureError as exc:
            raise Backpressure(str(exc), exc.retry_after_s) from None
        except BufferClosedError as exc:
            raise SinkClosed(str(exc)) from None
