"""An upload stream stores nothing after its first refusal.

A robot keeps several step batches in flight (the upload window). When the cloud refuses one
(a full disk, an invalid batch) the stream ends and the robot resends from its last
acknowledged seq; a later batch already on its way must not be stored meanwhile: the
acknowledgement of its seqs would cover the refused batch's seqs, and the robot would delete
steps the cloud never stored (the soak lost 11 steps so, under a full disk that the failed
write's truncation freed for the next batch)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from comms.cloud.services.experience import _Upload
from comms.cloud.step_sink import SinkFull, SinkRejected
from comms.wire import steps as S
from comms.wire.steps import NO_SEQ
from tests.comms.helpers import RUN, buffer_steps


class _ScriptedSink:
    """Stores every batch except the ones whose call number is in ``refuse`` (1-based),
    which raise the given refusal, as a buffer whose failed write freed space would."""

    def __init__(self, refuse: dict[int, Exception]) -> None:
        self.refuse = refuse
        self.calls = 0
        self.stored: list[int] = []

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        self.calls += 1
        if self.calls in self.refuse:
            raise self.refuse[self.calls]
        self.stored.extend(S.seq_numpy(batch).tolist())
        return max(self.stored)

    def durable_seq(self, robot_id: int) -> int:
        return max(self.stored) if self.stored else NO_SEQ


def _upload(sink: _ScriptedSink) -> _Upload:
    return _Upload(
        robot_id=7,
        run_id=RUN,
        sink=sink,  # type: ignore[arg-type]
        lock=threading.Lock(),
        durable=NO_SEQ,
        max_bytes=1 << 30,
    )


@pytest.mark.parametrize(
    "refusal", [SinkFull("buffer disk full (retry)"), SinkRejected("bad step")], ids=str
)
def test_batches_after_a_refused_one_are_not_stored_nor_acknowledged(refusal: Exception) -> None:
    sink = _ScriptedSink({2: refusal})
    up = _upload(sink)
    batches = [S.encode_batch(buffer_steps(7, first, 10)) for first in (0, 10, 20)]
    assert up.take(batches[0]).durable_seq == 9
    with pytest.raises(type(refusal)):
        up.take(batches[1])
    with pytest.raises(type(refusal)):  # in flight behind the refused batch
        up.take(batches[2])
    assert sink.stored == list(range(10)) and up.durable == 9


def test_take_all_stops_at_the_refusal_and_a_later_hop_stores_nothing() -> None:
    sink = _ScriptedSink({2: SinkFull("buffer disk full (retry)")})
    up = _upload(sink)
    batches = [S.encode_batch(buffer_steps(7, first, 10)) for first in (0, 10, 20, 30)]
    acks, refused, rows = up.take_all(batches[:2])
    assert isinstance(refused, SinkFull) and rows == 10
    assert [a.durable_seq for a, _ in acks] == [9]
    acks, refused, rows = up.take_all(batches[2:])  # the mailbox's next hop
    assert isinstance(refused, SinkFull) and rows == 0 and acks == []
    assert np.array_equal(sink.stored, np.arange(10))
