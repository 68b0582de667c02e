"""Feeds a :class:`~comms.receiver.WeightReceiver` from the Weights service (cloud or relay).

A background thread holds a Subscribe stream, assembles each version, re-fetches chunks that
failed their sha256 check or never came (a truncated stream), applies complete versions only,
acknowledges each version so the server sends the next (newest) one (flow control: a slow robot
skips versions instead of queueing them), and re-subscribes with exponential backoff and jitter
when the stream breaks.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from comms.backoff import Backoff
from comms.client import EdgeClient
from comms.proto import robofleet_pb2 as pb
from comms.receiver import VersionAssembler, WeightReceiver
from comms.weight_codec import WeightFormatError

log = logging.getLogger(__name__)


class GrpcWeightSource:
    """Keeps ``receiver`` at the latest version of ``run_id``.

    Attributes:
        versions_applied, chunks_refused, refetches, bytes_received: counters.
    """

    def __init__(self, client: EdgeClient, run_id: str, receiver: WeightReceiver) -> None:
        self._client = client
        self._run_id = run_id
        self._rx = receiver
        self._stop = threading.Event()
        self._call: Any = None
        self.versions_applied = 0
        self.chunks_refused = 0
        self.refetches = 0
        self.bytes_received = 0
        self._thread = threading.Thread(target=self._run, name=f"weights-rx-{run_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def refetch(self, version: int, base: int, indices: list[int]) -> Iterable[pb.WeightMessage]:
        """Fetch chunks of a version again (bounded by the call deadline)."""
        self.refetches += 1
        msgs = self._client.fetch_chunks(self._run_id, version, base, indices)
        self.bytes_received += sum(len(m.chunk.data) for m in msgs if m.HasField("chunk"))
        return msgs

    def _finish(self, asm: VersionAssembler) -> bool:
        """Repair and apply; returns False when the version could not be applied."""
        if not asm.complete:
            asm.repair(self.refetch)
        self.chunks_refused += asm.rejected
        asm.rejected = 0
        if asm.complete and self._rx.apply(asm):
            self.versions_applied += 1
            return True
        log.warning("version %d not applied (missing %d chunks)", asm.key[0], len(asm.missing))
        return False

    def _run(self) -> None:
        s = self._client.settings
        backoff = Backoff(s.reconnect_initial_s, s.reconnect_max_s)
        while not self._stop.is_set():
            asm: VersionAssembler | None = None
            acks: queue.SimpleQueue[pb.SubscribeRequest | None] = queue.SimpleQueue()
            try:
                call = self._client.weights.Subscribe(
                    _requests(
                        pb.SubscribeRequest(run_id=self._run_id, have_version=self._rx.version),
                        acks,
                    ),
                    metadata=self._client.metadata,
                )
                self._call = call
                expected = seen = 0
                version = -1
                for msg in call:
                    if msg.HasField("manifest"):
                        if asm is not None and not self._finish(asm):
                            break  # the server assumes we hold it: re-subscribe to re-sync
                        asm, seen = None, 0
                        version = int(msg.manifest.version)
                        expected = len(msg.manifest.chunk_sha256)
                        if self._rx.wants(msg.manifest):
                            try:
                                asm = VersionAssembler(msg.manifest)
                            except WeightFormatError as exc:
                                log.error("manifest refused: %s", exc)
                        if expected == 0:  # nothing follows
                            if asm is not None and not self._finish(asm):
                                break
                            asm = None
                            acks.put(_ack(self._rx.version, version))
                        elif asm is None:
                            seen = -1  # the chunks that follow are skipped
                        continue
                    self.bytes_received += len(msg.chunk.data)
                    if seen < 0:
                        # A version held already or refused: ack once its last chunk passed.
                        if msg.chunk.index == expected - 1:
                            acks.put(_ack(self._rx.version, version))
                        continue
                    seen += 1
                    assert asm is not None
                    asm.add_async(msg.chunk)
                    if seen == expected:
                        backoff.reset()
                        ok = self._finish(asm)
                        asm = None
                        if not ok:
                            break
                        # Flow control: the server sends the next (newest) version only now.
                        acks.put(_ack(self._rx.version, version))
                # The stream ended: a half-received version is completed by Fetch or dropped.
                if asm is not None:
                    self._finish(asm)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                code = exc.code() if hasattr(exc, "code") else None
                log.info("weight stream lost (%s)", code)
                if asm is not None and code != grpc.StatusCode.CANCELLED:
                    try:
                        self._finish(asm)
                    except Exception:  # the source is unreachable; the version stays unapplied
                        pass
            finally:
                acks.put(None)  # ends the request stream
                if self._call is not None:
                    self._call.cancel()
            if backoff.sleep(self._stop):
                return


def _ack(have: int, done: int) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(have_version=have, done_version=done)


def _requests(
    first: pb.SubscribeRequest, acks: queue.SimpleQueue[pb.SubscribeRequest | None]
) -> Iterator[pb.SubscribeRequest]:
    """The Subscribe request stream: the opening request, then one ack per version received."""
    yield first
    while (ack := acks.get()) is not None:
        yield ack
