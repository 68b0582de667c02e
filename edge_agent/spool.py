"""Durable, bounded on-disk spool of step batches, and the owner of the robot's ``seq``.

Layout of the spool directory::

    state.json                      {"next_seq": int, "acked_seq": int, "dropped_steps": int, ...}
    batches/<first>-<last>.arrow    one Arrow IPC stream per batch, seq first..last (20 digits)
    dropped.jsonl                   one line per dropped batch: seq range, steps, reason, time

A batch is durable once :meth:`Spool.write` returns: the file is written to a temporary name,
fsynced, renamed into place and the directory fsynced; only then is ``next_seq`` advanced (and
``state.json`` replaced the same way). After a crash ``next_seq`` is the larger of the persisted
value and one past the highest seq on disk, so seq never repeats for data that left the robot.

**When full** (the batch files would exceed ``max_bytes``), the configured policy applies:

* ``drop_oldest`` - delete the oldest unacknowledged batches until the new one fits. The cloud
  will see a gap in seq exactly where the dropped ranges are; each is logged in
  ``dropped.jsonl`` and counted (``dropped_steps`` / ``dropped_batches``).
* ``drop_newest`` - refuse the new batch; its reserved seqs are given back so the cloud sees no
  gap, the refused steps are counted and logged the same way.

A batch bigger than ``max_bytes`` on its own is dropped under either policy.
The spool satisfies ``comms.robot.uploader.Spool`` (``entries_after`` / ``ack`` / ``wait``), so
comms' :class:`~comms.robot.uploader.Uploader` streams it to the cloud; every method is thread-safe.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa

from comms.robot.uploader import SpoolEntry as WireEntry
from foundation.durable import append_line, atomic_write_bytes, atomic_write_json

FullPolicy = Literal["drop_oldest", "drop_newest"]
_STATE = "state.json"
_DROPPED = "dropped.jsonl"


class SpoolError(RuntimeError):
    """The spool directory is unusable (bad state file, seq out of order)."""


@dataclass(frozen=True)
class SpoolEntry:
    """One durable batch: seq ``first..last`` inclusive, stored at ``path`` (``nbytes``)."""

    first: int
    last: int
    path: Path
    nbytes: int


class Spool:
    """The robot's durable outbox.

    Args:
        directory: created if missing; one spool per robot.
        max_bytes: bound of the batch files' total size.
        full_policy: ``"drop_oldest"`` or ``"drop_newest"`` (see module doc).

    Raises:
        SpoolError: ``state.json`` is unreadable or not the expected shape.
        ValueError: ``max_bytes`` <= 0 or an unknown ``full_policy``.
    """

    def __init__(
        self, directory: Path | str, max_bytes: int, full_policy: FullPolicy = "drop_oldest"
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be > 0, got {max_bytes}")
        if full_policy not in ("drop_oldest", "drop_newest"):
            raise ValueError(
                f"spool full_policy must be drop_oldest or drop_newest: {full_policy!r}"
            )
        self.directory = Path(directory)
        self.batch_dir = self.directory / "batches"
        self.batch_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.full_policy: FullPolicy = full_policy
        self.lock = threading.RLock()
        state = self._load_state()
        self.acked_seq: int = state.get("acked_seq", -1)
        self.dropped_steps: int = state.get("dropped_steps", 0)
        self.dropped_batches: int = state.get("dropped_batches", 0)
        # Dropped steps whose seqs were not given back (drop_oldest): gaps the cloud sees.
        self.gap_steps: int = state.get("gap_steps", 0)
        self._entries: dict[int, SpoolEntry] = {}
        for p in self.batch_dir.iterdir():
            if p.suffix == ".tmp" or p.name.endswith(".arrow.tmp"):
                p.unlink()  # a write that never became durable
                continue
            first_s, _, last_s = p.stem.partition("-")
            entry = SpoolEntry(int(first_s), int(last_s), p, p.stat().st_size)
            if entry.last <= self.acked_seq:
                p.unlink()
            else:
                self._entries[entry.first] = entry
        highest = max((e.last for e in self._entries.values()), default=-1)
        self.next_seq: int = max(int(state.get("next_seq", 0)), highest + 1, self.acked_seq + 1)
        self._reserved: int | None = None
        self._cond = threading.Condition(self.lock)

    # -- state -----------------------------------------------------------------------------

    def _load_state(self) -> dict[str, int]:
        path = self.directory / _STATE
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            return {k: int(data[k]) for k in data}
        except (ValueError, TypeError) as exc:
            raise SpoolError(f"{path}: unreadable spool state ({exc})") from None

    def _save_state(self) -> None:
        data = {
            "next_seq": self.next_seq,
            "acked_seq": self.acked_seq,
            "dropped_steps": self.dropped_steps,
            "dropped_batches": self.dropped_batches,
            "gap_steps": self.gap_steps,
        }
        atomic_write_json(self.directory / _STATE, data)

    # -- writing ---------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        with self.lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        with self.lock:
            return len(self._entries)

    def reserve(self, n: int) -> int:
        """Reserve ``n`` seqs for the next :meth:`write`; returns the first. Nothing persists."""
        if n <= 0:
            raise ValueError(f"reserve needs n > 0, got {n}")
        with self.lock:
            self._reserved = n
            return self.next_seq

    def advance_to(self, seq: int) -> None:
        """Never hand out a seq below ``seq`` (the cloud already holds up to ``seq - 1``)."""
        with self.lock:
            if seq > self.next_seq:
                self.next_seq = seq
                self._save_state()

    def write(self, batch: pa.RecordBatch) -> SpoolEntry | None:
        """Make ``batch`` (seq = the reserved range, in order) durable.

        Returns:
            The entry, or None when the full policy dropped this batch (it is counted).

        Raises:
            SpoolError: the batch's seq column is not exactly the reserved range.
        """
        with self.lock:
            n = batch.num_rows
            first = self.next_seq
            if self._reserved != n:
                raise SpoolError(f"write of {n} rows without a matching reserve({n})")
            seqs = batch.column("seq").to_pylist()
            if seqs != list(range(first, first + n)):
                raise SpoolError(
                    f"batch seq {seqs[0]}..{seqs[-1]} is not the reserved {first}..{first + n - 1}"
                )
            self._reserved = None
            last = first + n - 1
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            data = sink.getvalue()
            size = data.size
            if not self._make_room(size, first, last):
                return None
            path = self.batch_dir / f"{first:020d}-{last:020d}.arrow"
            atomic_write_bytes(path, data)
            entry = SpoolEntry(first, last, path, size)
            self._entries[first] = entry
            self.next_seq = last + 1
            self._save_state()
            self._cond.notify_all()
            return entry

    def _make_room(self, size: int, first: int, last: int) -> bool:
        total = sum(e.nbytes for e in self._entries.values())
        if total + size <= self.max_bytes:
            return True
        if self.full_policy == "drop_oldest" and size <= self.max_bytes:
            for key in sorted(self._entries):
                if total + size <= self.max_bytes:
                    break
                old = self._entries.pop(key)
                old.path.unlink(missing_ok=True)
                total -= old.nbytes
                self._count_drop(old.first, old.last, "spool full: dropped oldest")
            self._save_state()
            return True
        # drop_newest (or a batch that can never fit): give the reserved seqs back.
        self._count_drop(first, last, "spool full: dropped newest", seq_released=True)
        self._save_state()
        return False

    def _count_drop(self, first: int, last: int, reason: str, seq_released: bool = False) -> None:
        self.dropped_steps += last - first + 1
        self.dropped_batches += 1
        if not seq_released:
            self.gap_steps += last - first + 1
        line = {
            "first_seq": first,
            "last_seq": last,
            "steps": last - first + 1,
            "reason": reason,
            "seq_released": seq_released,
            "time": time.time(),
        }
        append_line(self.directory / _DROPPED, json.dumps(line))

    def dropped_log(self) -> list[dict[str, object]]:
        """Every drop so far (the lines of ``dropped.jsonl``)."""
        path = self.directory / _DROPPED
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    # -- reading / acknowledging -------------------------------------------------------------

    def pending(self, after_seq: int = -1) -> list[SpoolEntry]:
        """Durable batches holding any seq > ``after_seq``, in seq order."""
        with self.lock:
            return [
                self._entries[k] for k in sorted(self._entries) if self._entries[k].last > after_seq
            ]

    def read(self, entry: SpoolEntry) -> pa.RecordBatch | None:
        """The batch of ``entry``, or None when it was dropped (full policy) meanwhile."""
        try:
            with pa.OSFile(str(entry.path), "rb") as f:
                return pa.ipc.open_stream(f).read_next_batch()
        except FileNotFoundError:
            return None

    def ack(self, durable_seq: int) -> None:
        """The cloud holds every seq <= ``durable_seq`` durably: delete those batches.

        Also makes sure no later seq is ever handed out at or below ``durable_seq`` (a spool
        directory that was wiped must not reuse seqs the cloud already holds).
        """
        with self.lock:
            if durable_seq <= self.acked_seq:
                return
            self.acked_seq = durable_seq
            self.next_seq = max(self.next_seq, durable_seq + 1)
            gone = [k for k, e in self._entries.items() if e.last <= durable_seq]
            for k in gone:
                self._entries.pop(k).path.unlink(missing_ok=True)
            self._save_state()
            self._cond.notify_all()

    # -- comms.robot.uploader.Spool ------------------------------------------------------------------

    def entries_after(self, seq: int, limit: int) -> list[WireEntry]:
        """Up to ``limit`` batches with ``last_seq > seq``, oldest first, as Arrow IPC bytes."""
        out: list[WireEntry] = []
        for e in self.pending(after_seq=seq):
            if len(out) >= limit:
                break
            try:
                data = e.path.read_bytes()
            except FileNotFoundError:  # dropped by the full policy meanwhile
                continue
            out.append(WireEntry(e.last, data))
        return out

    def wait(self, after_seq: int, timeout: float) -> bool:
        """Block until a batch with ``last_seq > after_seq`` is spooled; returns whether one is."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(e.last > after_seq for e in self._entries.values()), timeout
            )

    def wait_acked(self, seq: int, timeout: float) -> bool:
        """Block until the cloud acknowledged ``seq``; returns whether it did in time."""
        with self._cond:
            return self._cond.wait_for(lambda: self.acked_seq >= seq, timeout)
