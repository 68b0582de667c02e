"""Feeds a :class:`~comms.receiver.WeightReceiver` from the Weights service (cloud or relay).

A background thread holds a Subscribe stream, assembles each version, re-fetches chunks that
failed their sha256 check or never came (a truncated stream), applies complete versions only,
and re-subscribes with exponential backoff and jitter when the stream breaks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
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
            seen = 0
            try:
                call = self._client.weights.Subscribe(
                    pb.SubscribeRequest(run_id=self._run_id, have_version=self._rx.version),
                    metadata=self._client.metadata,
                )
                self._call = call
                for msg in call:
                    if msg.HasField("manifest"):
                        if asm is not None and not self._finish(asm):
                            break  # the server assumes we hold it: re-subscribe to re-sync
                        asm, seen = None, 0
                        if self._rx.wants(msg.manifest):
                            try:
                                asm = VersionAssembler(msg.manifest)
                            except WeightFormatError as exc:
                                log.error("manifest refused: %s", exc)
                        continue
                    seen += 1
                    self.bytes_received += len(msg.chunk.data)
                    if asm is None:
                        continue
                    asm.add_async(msg.chunk)
                    if seen == len(asm.manifest.chunk_sha256):
                        backoff.reset()
                        ok = self._finish(asm)
                        asm = None
                        if not ok:
                            break
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
                if self._call is not None:
                    self._call.cancel()
            if backoff.sleep(self._stop):
                return
