"""A run's buffer shards seen from the learner as one buffer: :class:`ShardedRemoteBuffer` asks
the batch server of every shard (``buffer.service.batches``) and draws across them in proportion
to their sizes, with an optional prefetch thread so one slow shard never stalls the learner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from buffer.service.batches import RemoteBuffer, RemoteNothingToSample
from buffer.service.shm_batches import BatchSlots, Slot
from buffer.table.reading import concat_parts, sample_across_shards


class ShardedRemoteBuffer:
    """The batch servers of a run's buffer shards (``buffer.service.shards``: one per shard process,
    on any node), seen from the learner as one ``foundation.contracts.TransitionSource``.

    A batch of B draws its rows per shard from a multinomial weighted by the shards' sizes
    (each at most 1 s old), so every transition is equally likely whichever shard holds it;
    the shards draw at once (every request is sent before any reply is read) and the parts
    are concatenated. A shard that turns out empty hands its share to the others. Shards on
    this machine write their parts side by side into one shared-memory slot
    (``buffer.service.shm_batches``): the batch is that slot's arrays, with no copy here.

    With ``prefetch`` a thread of its own (with sockets of its own) draws the next batch of
    the size last asked for while the learner trains on this one, so a slow shard delays
    that thread, not the learner; the batch handed out is then one draw older than the
    request (as a prefetching Reverb client's).

    Args:
        addresses: the shards' ``tcp://`` batch server addresses, shard ``k`` at ``k``.
        timeout_s / layout: as :class:`RemoteBuffer`, for every shard.
        seed: of the draw of rows per shard.
        prefetch: draw one batch ahead on a thread.
        shared_memory: as :class:`RemoteBuffer`.
        token: the shards' batch token (``ShardActors.token``: one for a run's shards).

    ``stats`` travel to every shard. Raises as :class:`RemoteBuffer`; the constructor also
    ``ValueError`` for no ``addresses``.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        timeout_s: float = 30.0,
        layout: Mapping[str, Any] | None = None,
        seed: int | None = None,
        prefetch: bool = False,
        shared_memory: bool = True,
        *,
        token: str,
    ) -> None:
        if not addresses:
            raise ValueError("a sharded buffer needs at least one shard address")
        self.shards = [
            RemoteBuffer(a, timeout_s, layout, shared_memory, token=token) for a in addresses
        ]
        self.slots = BatchSlots()
        for r in self.shards:
            r.slots = self.slots
        self._whole: tuple[Slot, int] | None = None  # one round filled a slot: (slot, rows)
        self._rounds = 0
        self._in_slots = 0
        self.stats: dict[str, float] = {}
        self._rng = np.random.default_rng(seed)
        self._ahead: _Prefetcher | None = None
        self.closing = False  # set: a wait for rows ends (the prefetch thread's)
        if prefetch:
            fetcher = ShardedRemoteBuffer(
                addresses, timeout_s, layout, seed, shared_memory=shared_memory, token=token
            )
            self._ahead = _Prefetcher(fetcher, lambda: self.stats)

    def _sizes(self) -> np.ndarray:
        for r in self.shards:
            r.stats = self.stats
        return np.array([r.num_transitions() for r in self.shards], dtype=np.float64)

    def num_transitions(self) -> int:
        return int(self._sizes().sum())

    def online_transitions(self) -> int:
        self._sizes()
        return sum(r.online_transitions() for r in self.shards)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` rows (the keys of :class:`RemoteBuffer`, plus ``shard`` int16);
        waits (polling every 0.1 s) while every shard is empty."""
        if self._ahead is not None:
            return self._ahead.take(batch_size)
        self._whole, self._rounds = None, 0
        return sample_across_shards(
            batch_size, self._sizes, self._rng, self._draw, self._nothing, self._join
        )

    @property
    def slot_batches(self) -> int:
        """Batches handed out as one shared-memory slot's arrays (no copy here)."""
        ahead = self._ahead.fetcher.slot_batches if self._ahead is not None else 0
        return self._in_slots + ahead

    def _join(self, parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The parts as one batch: the slot's arrays when one round wrote every row into it
        in order, else a concatenation."""
        whole = self._whole
        if whole is None or self._rounds != 1:
            return concat_parts(parts)
        slot, rows = whole
        self._in_slots += 1
        out = slot.arrays(0, rows)
        out["shard"] = np.concatenate([p["shard"] for p in parts])
        return out

    def _nothing(self, barren: bool) -> None:
        if self.closing:
            raise RuntimeError("the sharded buffer client is closing")
        _wait_for_rows(barren)

    def _draw(self, counts: np.ndarray) -> list[tuple[int, dict[str, np.ndarray] | None]]:
        """Ask every shard with a count for its rows, then take the replies (None from a
        shard whose sampler finds nothing: its share is drawn again from the others). On a
        failure the shards still owing a reply get fresh sockets (a REQ socket that missed
        one is unusable)."""
        asked = np.flatnonzero(counts).tolist()
        sent: list[int] = []
        out: list[tuple[int, dict[str, np.ndarray] | None]] = []
        total = int(counts.sum())
        self._rounds += 1
        slot = self.slots.take(total) if any(self.shards[k].shm_usable for k in asked) else None
        in_slot = 0  # rows the replies put into the slot
        try:
            row0 = 0
            for k in asked:
                r = self.shards[k]
                r.ask_sample(int(counts[k]), (slot, row0) if slot and r.shm_usable else None)
                sent.append(k)
                row0 += int(counts[k])
            while sent:
                k = sent[0]
                try:
                    part: dict[str, np.ndarray] | None = self.shards[k].take_sample()
                except RemoteNothingToSample:
                    part = None
                if part is not None and slot is not None and _over(part, slot):
                    in_slot += int(counts[k])
                out.append((sent.pop(0), part))
        except BaseException:
            for k in sent:
                self.shards[k]._reconnect()  # noqa: SLF001 - same module's client
            raise
        self._whole = (slot, total) if slot is not None and in_slot == total else None
        return out

    def demonstrations(self) -> dict[str, int]:
        """Completed demonstration episodes per task, over every shard."""
        out: dict[str, int] = {}
        for r in self.shards:
            r.stats = self.stats
            for task, n in r.demonstrations().items():
                out[task] = out.get(task, 0) + n
        return out

    def labelled_episodes(self) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """:meth:`RemoteBuffer.labelled_episodes` over every shard: the episodes in shard
        order, their arrays concatenated in the same order."""
        return _merge_episodes([r.labelled_episodes() for r in self.shards])

    def policy_episodes(
        self, limit: int = 100
    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """:meth:`RemoteBuffer.policy_episodes` over every shard: each shard's latest
        ``limit / shards`` (the remainder to the first shards), in shard order."""
        n = len(self.shards)
        replies = []
        for k, r in enumerate(self.shards):
            share = limit // n + (1 if k < limit % n else 0)
            replies.append(r.policy_episodes(share) if share else ([], {}))
        return _merge_episodes(replies)

    def sampler_state(self) -> dict[str, Any]:
        """``{"shards": [each shard's sampler state]}`` (for the learner's checkpoint)."""
        return {"shards": [r.sampler_state() for r in self.shards]}

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        for r, s in zip(self.shards, state.get("shards") or [], strict=False):
            r.load_sampler_state(s)

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        for r in self.shards:
            r.close()
        self.slots.close()


def _over(part: dict[str, np.ndarray], slot: Slot) -> bool:
    """Whether ``part``'s arrays lie in ``slot`` (the server wrote them there)."""
    arr = next(iter(part.values()), None)
    return arr is not None and arr.base is slot.root


class _Prefetcher:
    """One batch ahead of ``ShardedRemoteBuffer.sample``, drawn on a thread by ``fetcher``
    (its own sockets); ``stats()``: the learner's statistics to send along."""

    def __init__(self, fetcher: ShardedRemoteBuffer, stats: Any) -> None:
        self.fetcher = fetcher
        self._stats = stats
        self._want = 0  # the batch size to draw next; 0: none asked yet
        self._ready: tuple[int, dict[str, np.ndarray] | BaseException] | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="batch-prefetch", daemon=True)
        self._thread.start()

    def take(self, batch_size: int) -> dict[str, np.ndarray]:
        """The drawn batch of ``batch_size`` rows (waits for it); raises what the draw
        raised."""
        with self._cond:
            self._want = batch_size
            self._cond.notify_all()
            while self._ready is None or self._ready[0] != batch_size:
                if self._ready is not None:  # drawn for another size: draw again
                    self._ready = None
                    self._cond.notify_all()
                self._cond.wait()
            got = self._ready[1]
            self._ready = None
            self._cond.notify_all()
        if isinstance(got, BaseException):
            raise got
        return got

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self._want == 0 or self._ready is not None):
                    self._cond.wait()
                if self._stop:
                    return
                n = self._want
            self.fetcher.stats = self._stats()
            got: dict[str, np.ndarray] | BaseException
            try:
                got = self.fetcher.sample(n)
            except Exception as exc:  # the learner gets it with its next take
                got = exc
            with self._cond:
                self._ready = (n, got)
                self._cond.notify_all()
            if isinstance(got, BaseException):
                time.sleep(0.1)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self.fetcher.closing = True
            self._cond.notify_all()
        self._thread.join(35.0)
        self.fetcher.close()


def _merge_episodes(
    replies: Sequence[tuple[list[dict[str, Any]], dict[str, np.ndarray]]],
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Episode replies of several shards as one: the episodes in order, their step arrays
    concatenated in the same order."""
    episodes = [e for found, _ in replies for e in found]
    parts = [arrays for found, arrays in replies if found]
    if not parts:
        return episodes, {}
    return episodes, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _wait_for_rows(barren: bool) -> None:
    """While no shard can be drawn from: refuse when a shard's sampler found nothing, else
    (every shard empty) wait for rows."""
    if barren:
        raise RemoteNothingToSample("nothing to sample in any shard")
    time.sleep(0.1)
