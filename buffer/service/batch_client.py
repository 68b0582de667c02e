"""The client side of the batch service: :class:`RemoteBuffer`, a learner's view of one
:class:`~buffer.service.batches.BatchServer` in another process, and the refusal it raises
when the server finds nothing to sample. It has its own module so a learner's side of the wire
reads apart from the server that shares the cloud with the buffer; the requests, the frames and
the shared-memory slots are those of ``buffer.service.batches`` (its module docstring).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from buffer.service.batch_token import TOKEN_FIELD, BatchRefused, checked_token
from buffer.service.payload import arrays_in_place
from buffer.service.shm_batches import BatchSlots, Slot, boot_id

log = logging.getLogger(__name__)


class RemoteNothingToSample(RuntimeError):
    """The server's sampler found no transition to draw (``buffer.errors.NothingToSample``
    there); a ``RuntimeError`` like every server-side refusal."""


class RemoteBuffer:
    """A :class:`~buffer.service.batches.BatchServer`'s buffer, seen from another process: a
    ``foundation.contracts.TransitionSource``.

    Args:
        address: the server's ``tcp://`` address.
        timeout_s: longest wait for one reply.
        layout: what each row carries (``images``, ``next_images``, ``chunk``:
            ``buffer.service.batches``'s module docstring); None = the state columns alone.
        shared_memory: take batches through shared memory when the server reports this
            machine's boot id (``buffer.service.shm_batches``); False: always as frames.
        token: the server's batch token (every request carries it).

    ``slots``: the shared-memory slots its batches go into (its own unless a
    ``ShardedRemoteBuffer`` shares one set among its shards). ``stats`` (name -> float) travels with the next ``sample`` or ``size`` request.

    Raises (from every request): ``RuntimeError`` with the server's reason
    (``batch_token.BatchRefused`` when it refused the token), or ``TimeoutError`` when the
    server does not answer within ``timeout_s`` (the cloud is gone); the constructor
    ``ValueError`` for an empty or non-ASCII ``token``.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        layout: Mapping[str, Any] | None = None,
        shared_memory: bool = True,
        *,
        token: str,
    ) -> None:
        self.address = address
        self._token = checked_token(token)
        self.layout = dict(layout) if layout else None
        self.shared_memory = shared_memory
        self.slots: BatchSlots | None = None
        self._own_slots = False
        self._shm: bool | None = None  # None: not known until the server's first batch
        self._asked: tuple[Slot, int] | None = None
        self.timeout_ms = int(timeout_s * 1000)
        self.stats: dict[str, float] = {}
        self._size = 0
        self._online = 0
        self._size_at = float("-inf")
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
        sock.connect(self.address)
        return sock

    def _call(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], list[memoryview] | None]:
        try:
            self._sock.send(json.dumps({**req, TOKEN_FIELD: self._token}).encode())
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not answer") from None
        return self._receive()

    def _receive(self) -> tuple[dict[str, Any], list[memoryview] | None]:
        """The reply's header and its payload frames' memory, received in place: a camera
        batch's tensors are read where ZeroMQ put them (``buffer.service.payload``)."""
        try:
            frames = self._sock.recv_multipart(copy=False)
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not answer") from None
        header = json.loads(frames[0].bytes)
        if header.get("refused"):
            raise BatchRefused(f"batch server {self.address}: {header['error']}")
        if header.get("nothing_to_sample"):
            raise RemoteNothingToSample(f"batch server: {header['error']}")
        if "error" in header:
            raise RuntimeError(f"batch server: {header['error']}")
        return header, ([f.buffer for f in frames[1:]] if len(frames) > 1 else None)

    def demonstrations(self) -> dict[str, int]:
        """Completed demonstration episodes per task in the run's buffer (now)."""
        header, _ = self._call({"op": "demonstrations", "stats": self.stats})
        self._note_sizes(header)
        return {str(k): int(v) for k, v in dict(header.get("episodes", {})).items()}

    def labelled_episodes(self) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """(episodes, arrays): the episodes people labelled and their steps concatenated
        (:meth:`buffer.service.batches.BatchServer.labelled_episodes`)."""
        header, payload = self._call({"op": "labelled_episodes"})
        arrays = arrays_in_place(payload) if payload is not None else {}
        return list(header.get("episodes", [])), arrays

    def policy_episodes(
        self, limit: int = 100
    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """(episodes, arrays): the latest ended episodes a policy acted in and their steps
        concatenated (:meth:`buffer.service.batches.BatchServer.policy_episodes`)."""
        header, payload = self._call({"op": "policy_episodes", "limit": int(limit)})
        arrays = arrays_in_place(payload) if payload is not None else {}
        return list(header.get("episodes", [])), arrays

    def _reconnect(self) -> None:
        self._sock.close(0)
        self._sock = self._connect()  # a REQ socket that missed a reply is unusable

    def num_transitions(self) -> int:
        """Transitions in the buffer's window, at most 1 s old (every sample refreshes it)."""
        if time.monotonic() - self._size_at > 1.0:
            header, _ = self._call({"op": "size", "stats": self.stats})
            self._note_sizes(header)
        return self._size

    def online_transitions(self) -> int:
        """Rows from robots (the buffer without its offline rows), at most 1 s old; asking
        also hands the server the learner's latest ``stats``."""
        self.num_transitions()
        return self._online

    def _note_sizes(self, header: Mapping[str, Any]) -> None:
        self._size = int(header.get("size", 0))
        self._online = int(header.get("online", self._size))
        self._size_at = time.monotonic()

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` rows with the keys of ``buffer.service.batches``'s module docstring;
        waits (polling every 0.1 s) while the buffer is empty."""
        while True:
            self.ask_sample(batch_size)
            batch = self.take_sample()
            if batch is not None:
                return batch
            time.sleep(0.1)

    @property
    def shm_usable(self) -> bool:
        """The server shares this machine's ``/dev/shm`` (as far as its replies tell)."""
        return bool(self._shm)

    def ask_sample(self, batch_size: int, into: tuple[Slot, int] | None = None) -> None:
        """Send a ``sample`` request; :meth:`take_sample` receives its reply (so a caller can
        have several servers draw at once: ``ShardedRemoteBuffer``). ``into``: the slot and
        row the batch is written to (by default, this client's own free slot, once the
        server is known to share the machine)."""
        req: dict[str, Any] = {
            "op": "sample",
            "batch_size": batch_size,
            "stats": self.stats,
            "layout": self.layout,
            TOKEN_FIELD: self._token,
        }
        if into is None and self.shm_usable and self._own_slots and self.slots is not None:
            slot = self.slots.take(batch_size)
            into = None if slot is None else (slot, 0)
        self._asked = into
        if into is not None:
            req["into"] = into[0].spec(into[1])
        try:
            self._sock.send(json.dumps(req).encode())
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not take the request") from None

    def take_sample(self) -> dict[str, np.ndarray] | None:
        """The reply to :meth:`ask_sample`: the batch, or None when the buffer was empty (a
        batch in a slot: arrays over the slot's rows)."""
        asked, self._asked = self._asked, None
        header, payload = self._receive()
        self._note_sizes(header)
        if self._shm is None and "boot_id" in header:
            self._shm = (
                self.shared_memory and bool(header["boot_id"]) and (header["boot_id"] == boot_id())
            )
            if self._shm and self.slots is None:
                self.slots, self._own_slots = BatchSlots(), True
        if "into" in header and asked is not None:
            slot, row0 = asked
            return slot.arrays(row0, row0 + int(header["into"]))
        if "shm_refused" in header and not header.get("shm_layout"):
            log.warning(
                "batch server %s cannot write into this learner's shared memory (%s): "
                "batches come over the socket",
                self.address,
                header["shm_refused"],
            )
            self._shm = False
        if payload is None:
            return None
        batch = arrays_in_place(payload)
        if self.slots is not None:
            self.slots.learn(batch)
        return batch

    def sampler_state(self) -> dict[str, Any]:
        """``{"sampler": the server sampler's state_dict}`` (for the learner's checkpoint)."""
        header, _ = self._call({"op": "sampler_state"})
        return {"sampler": header["state"]}

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        self._call({"op": "load_sampler_state", "state": state.get("sampler") or {}})

    def close(self) -> None:
        self._sock.close(0)
        if self._own_slots and self.slots is not None:
            self.slots.close()
