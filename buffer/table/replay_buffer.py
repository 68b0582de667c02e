"""The replay buffer: one directory's table and the parts that keep it (Reverb's shape).

:class:`ReplayBuffer` owns the parts (shared state, writer, sealer, retention, rate limiter)
and holds no logic of its own beyond opening, the window and closing; reads, marks and
lookups are their own modules. Open = lock the directory, recover (``buffer.table.recovery``),
start a fresh WAL and the threads; ``close`` seals the open tail. The directory layout and
the parts: docs/buffer.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import ArrayLike, NDArray

from buffer.config import BufferSettings
from buffer.errors import BufferClosedError
from buffer.sampling.rate_limiter import RateLimiter
from buffer.sampling.samplers import Sampler, UniformSampler
from buffer.sampling.view import SamplingView, Source, Table
from buffer.table import lookups, marks, reading
from buffer.table.claim import AppendResult
from buffer.table.index import RowIndex
from buffer.table.offline import OfflineView
from buffer.table.opening import SCHEMA_FILE, SHARDS_FILE, lock_directory, stored_schema
from buffer.table.prefetch import start_prefetcher
from buffer.table.recovery import recover
from buffer.table.retention import Retention
from buffer.table.schema import StepSchema
from buffer.table.sealer import Sealer
from buffer.table.state import TableState
from buffer.table.stats import buffer_stats
from buffer.table.storage import TieredStorage
from buffer.table.writer import Writer
from foundation.durable import atomic_write_text
from foundation.rows import RowFilter

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """A persistent, cache-aware replay buffer. Use :meth:`open`; see ``buffer/__init__``."""

    def __init__(
        self,
        directory: Path,
        schema: StepSchema,
        settings: BufferSettings,
        read_only: bool,
        rate_limiter: RateLimiter | None,
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.settings = settings
        self.read_only = read_only
        self.rate_limiter = rate_limiter
        self.state = TableState(directory, schema, settings, read_only)
        self.retention = Retention(directory, settings.retention_max_bytes, read_only)
        self.sealer = Sealer(self.state, self.retention)
        self.writer = Writer(self.state, self.sealer, rate_limiter)
        self.offline: list[OfflineView] = []
        self.recovery_seconds = 0.0
        self.recovered_rows = 0
        self.torn_bytes_dropped = 0
        self._lock_fd = -1
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ opening ------
    @classmethod
    def open(
        cls,
        directory: str | Path,
        schema: StepSchema | None = None,
        settings: BufferSettings | None = None,
        *,
        read_only: bool = False,
        rate_limiter: RateLimiter | None = None,
    ) -> ReplayBuffer:
        """Open (creating or recovering) the buffer in ``directory``.

        Args:
            directory: the buffer directory; created when missing (unless ``read_only``).
            schema: required for a new directory; for an existing one it must have the same
                columns, or may be None to use the stored one.
            settings: budgets, segment size, group commit delay (default ``BufferSettings()``).
            read_only: open without writing or locking (for mounting another run's data);
                a torn WAL tail is skipped, not truncated.
            rate_limiter: when given, appends and samples go through it.

        Raises:
            ValueError: no schema for a new directory, a schema that differs from the
                stored one, or the root of a sharded buffer (``buffer.service.shards``).
            BlockingIOError: another process holds the directory open for writing.
            CorruptDataError: a sealed segment is unreadable.
            UnsupportedFormatError: a WAL or segment file has another format version (or a
                marker that is not ours); nothing was changed (see ``buffer.files.format``).
        """
        directory = Path(directory)
        settings = settings or BufferSettings()
        if (directory / SHARDS_FILE).exists():
            raise ValueError(
                f"{directory} holds the shards of a buffer: open it with "
                "buffer.service.shards.ShardedBuffer.open (or one shard-<k> directory)"
            )
        schema = stored_schema(directory, schema, read_only)
        stored = directory / SCHEMA_FILE
        if not read_only:
            directory.mkdir(parents=True, exist_ok=True)
        buf = cls(directory, schema, settings, read_only, rate_limiter)
        if not read_only:
            buf._lock_fd = lock_directory(directory)
            if not stored.exists():
                atomic_write_text(stored, schema.to_json())
        try:
            buf._recover()
        except BaseException:
            if buf._lock_fd >= 0:  # a refused open must not keep the directory locked
                os.close(buf._lock_fd)
                buf._lock_fd = -1
            raise
        buf._start_threads()
        return buf

    def _recover(self) -> None:
        t0 = time.monotonic()
        report = recover(self.state, self.retention)
        self.recovered_rows = report.recovered_rows
        self.torn_bytes_dropped = report.torn_bytes_dropped
        if not self.read_only:
            self.writer.start()
        with self.state.lock:
            self.retention.apply(self.state)
        self.recovery_seconds = time.monotonic() - t0

    def _start_threads(self) -> None:
        if not self.read_only:
            self._threads.append(self.sealer.start())
        if self.settings.prefetch:
            self._threads.append(
                start_prefetcher(self.storage, self.state.stop, self.settings.prefetch_interval_s)
            )

    # ------------------------------------------------------------------ the table ----
    @property
    def index(self) -> RowIndex:
        """The row index (per-row scalar columns; ``buffer.table.index``)."""
        return self.state.index

    @property
    def storage(self) -> TieredStorage:
        """The payload chunks, hot and cold (``buffer.table.storage``)."""
        return self.state.storage

    @property
    def visible(self) -> int:
        """Rows below this global row are durable and readable."""
        return self.state.visible

    @property
    def transitions_inserted(self) -> int:
        """Transitions that became eligible since open."""
        return self.state.transitions_inserted

    @property
    def rows_per_segment(self) -> int:
        return self.state.rows_per_segment

    @property
    def sealed_segments(self) -> list[tuple[int, int, Path]]:
        """``(first row, rows, path)`` of each sealed segment, oldest first."""
        return self.retention.segments

    # ------------------------------------------------------------------ writing ------
    def can_accept(self, n: int = 1) -> bool:
        """Whether an append of ``n`` records would proceed now (for uplink backpressure)."""
        return self.writer.can_accept(n)

    def append(
        self,
        records: pa.RecordBatch | pa.Table | Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> AppendResult:
        """Validate, log durably, and store a batch of steps.

        All-or-nothing: the whole batch is validated before anything is written; one bad
        record rejects the batch and nothing of it is stored or acknowledged. Records whose
        ``(robot_id, seq)`` is already stored are duplicates: they are acknowledged and not
        stored again (the rest of the batch is stored). The call returns only after the
        fdatasync covering the new records (group commit shares one fdatasync among
        concurrent appends).

        Args:
            records: an Arrow record batch/table with the schema's columns (the wire format),
                or a list of step dicts (see :meth:`StepSchema.batch_from_records`).
            timeout: with a rate limiter, how long to wait for room; ``0`` fails at once.

        Raises:
            StepValidationError: a record is invalid (names record and field), or its seq is
                out of order (at or below its robot's highest stored seq but not stored).
            BackpressureError: the rate limiter did not admit the insert within ``timeout``
                (carries ``retry_after_s``).
            BufferClosedError: the buffer is closed or read-only.
            DiskFullError: the disk has no space; nothing of this batch was stored. Retry:
                appends are taken again once space is back (no reopen needed).
            OSError: the disk failed; nothing of this batch was acknowledged (later appends
                are tried again).
        """
        return self.writer.append(records, timeout)

    def flush(self) -> None:
        """Wait until every queued seal is written and the spare tail is ready (quiescent)."""
        self.sealer.flush()

    def mark_episode(
        self,
        robot_id: str | int,
        run_id: str,
        episode_index: int,
        kind: str = "discard",
        reason: str = "",
    ) -> int:
        """Mark a robot's episode, durably before returning (``buffer.table.marks``).

        ``discard`` / ``rerecord`` (an operator's verdict): its rows, stored now or later, are
        never eligible, so no sampler returns them, :meth:`select` and ``len`` leave them out
        and an export skips them. ``success`` / ``failure`` (its outcome): nothing is
        excluded; :meth:`select` and :meth:`mount` with ``RowFilter(success_only=True)`` take
        the rows of successful episodes. Marking an episode the same way twice changes nothing.
        ``reason``: who gave the mark (kept with it; :func:`buffer.table.labels`).

        Returns:
            How many of the episode's stored rows the mark excludes (or, for an outcome,
            labels) now.

        Raises:
            ValueError: an unknown ``kind`` (``buffer.table.marks.KINDS``), an empty ``run_id`` or
                ``robot_id``, or a negative ``episode_index``.
            BufferClosedError: the buffer is closed or read-only.
            DiskFullError: the disk has no space for the mark; nothing changed (retry).
            OSError: the mark could not be written otherwise; nothing changed.
        """
        if self.state.closed or self.read_only:
            raise BufferClosedError(f"{self.directory}: buffer is closed or read-only")
        return marks.record(self.state, str(robot_id), run_id, int(episode_index), kind, reason)

    def mark_episodes(self, items: Sequence[tuple[str, str, int, str]]) -> int:
        """:meth:`mark_episode` of several ``(robot_id, run_id, episode_index, kind)`` marks,
        durably with one fsync (an import's episode outcomes); all are checked first.

        Returns:
            The rows the marks apply to now, summed.

        Raises:
            ValueError, BufferClosedError, OSError: as :meth:`mark_episode`.
        """
        if self.state.closed or self.read_only:
            raise BufferClosedError(f"{self.directory}: buffer is closed or read-only")
        return marks.record_many(self.state, [(str(r), run, int(e), k) for r, run, e, k in items])

    # ------------------------------------------------------------------ lookups ------
    def durable_seq(self, robot_id: str | int) -> int | None:
        """Highest ``seq`` of ``robot_id`` stored durably (fdatasync'ed, so acknowledged), or
        None when this buffer never held any of its steps. ``robot_id`` is compared as a
        string (the ``robot_id`` column). Thread-safe; O(1) unless an append of this robot is
        in flight. Rows that retention deleted still count, across reopens too (the
        directory's record, ``buffer.table.retired``).
        """
        with self.state.lock:
            return lookups.last_seq(self.state, robot_id)

    def stored_seqs(self, robot_id: str | int, *, retired: bool = True) -> NDArray[np.int64]:
        """Every durable ``seq`` of ``robot_id``, ascending, as a new int64 array of shape
        (n,) (empty when none). Same scope as :meth:`durable_seq`; ``retired=False`` leaves
        out the seqs whose rows retention deleted (those still on disk only)."""
        with self.state.lock:
            return lookups.stored_seqs(self.state, robot_id, retired)

    def retired_seqs(self, robot_id: str | int) -> NDArray[np.int64]:
        """The durable seqs of ``robot_id`` whose rows retention deleted (since this
        directory was made), ascending, a new int64 array of shape (n,)."""
        with self.state.lock:
            return self.state.retired.seqs(str(robot_id))

    def contains(self, robot_id: str | int, seqs: ArrayLike) -> NDArray[np.bool_]:
        """Which of ``seqs`` (int array-like, shape (n,)) of ``robot_id`` are stored durably:
        a bool array of shape (n,). Binary search, O(n log stored); same scope as
        :meth:`durable_seq`.

        Raises:
            ValueError: ``seqs`` is not one-dimensional or not integral.
        """
        q = np.asarray(seqs)
        if q.ndim != 1 or (q.size and not np.issubdtype(q.dtype, np.integer)):
            raise ValueError(f"seqs must be a 1-D integer array, got {q.dtype} shape {q.shape}")
        q = q.astype(np.int64, copy=False)
        with self.state.lock:
            return lookups.contains(self.state, robot_id, q)

    # ------------------------------------------------------------------ the window ---
    @property
    def first_row(self) -> int:
        """First global row still stored (after retention)."""
        with self.state.lock:
            return self.storage.chunks[0].first_row if self.storage.chunks else self.visible

    def window(self) -> tuple[int, int]:
        """The online sampling window ``[lo, hi)`` of global rows (capacity, FIFO)."""
        with self.state.lock:
            hi = self.visible
            lo = self.first_row
            cap = self.settings.capacity_transitions
            if cap:
                lo = max(lo, hi - cap)
            cap_b = self.settings.capacity_bytes
            if cap_b:  # every row counts the schema's fixed payload size
                lo = max(lo, hi - cap_b // max(self.storage.row_bytes, 1))
            return lo, hi

    def __len__(self) -> int:
        """Transitions (steps with a known successor, or done) in the online window."""
        with self.state.lock:  # the window and the index's base, taken together
            lo, hi = self.window()
            b, cols = self.index.frame()
        return int(np.count_nonzero(cols["eligible"][lo - b : hi - b]))

    @property
    def num_steps(self) -> int:
        """Steps stored and visible (including ones still waiting for their successor)."""
        return self.visible - self.first_row

    def hot_ranges(self) -> list[tuple[int, int]]:
        """Global row ranges ``[first, first + capacity)`` of the chunks held in RAM."""
        with self.state.lock:
            return [(c.first_row, c.first_row + c.capacity) for c in self.storage.chunks if c.hot]

    # ------------------------------------------------------------------ sampling -----
    def view(self) -> SamplingView:
        """What a sampler sees now: the window and the mounted offline views; the online
        index's ``(base, cols)`` is taken with the window (compaction may move it after)."""
        with self.state.lock:
            lo, hi = self.window()
            frame = self.index.frame()
        sources = [  # each takes its own index's frame (``Source``)
            Source(v.buffer, v.rows, v.name, task=v.task, tasks=v.task_names) for v in self.offline
        ]
        return SamplingView(self, lo, hi, sources, frame=frame)

    def sample(
        self,
        batch_size: int,
        sampler: Sampler | None = None,
        *,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Sample ``batch_size`` transitions.

        Returns arrays with leading dimension ``batch_size``: ``observation.*`` and
        ``next.observation.*`` (the true successor's observation; for a terminated or truncated
        step its real final observation), ``action``, ``action.policy``, ``action.operator``,
        ``reward`` (float32), ``terminated``/``truncated``/``is_intervention`` (bool),
        ``policy_version``/``episode_index``/``frame_index`` (int64), ``timestamp``
        (float64, s), ``task``/``robot_id`` (str objects), ``index`` (global row, int64),
        ``source`` (int16: 0 online, k = k-th mounted offline view) and ``weight`` (float32
        importance weight; 1 unless the sampler is prioritized).

        Raises:
            ValueError: nothing to sample (no eligible transition for this sampler).
            RateLimiterTimeout: with a rate limiter, sampling was not allowed in ``timeout``.
        """
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size, timeout)
        return self._draw(
            sampler, batch_size, rng, lambda table, rows: table.read_transitions(rows)
        )

    def read_transitions(self, rows: np.ndarray, *, count: bool = True) -> dict[str, np.ndarray]:
        """Transitions at global ``rows`` (eligible rows; see :meth:`sample` for the keys)."""
        return reading.read_transitions(self.state, rows, count=count)

    def sample_sequences(
        self,
        batch_size: int,
        length: int,
        *,
        history: int = 0,
        sampler: Sampler | None = None,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Sample sequences for action chunks, n-step returns and frame stacks.

        Each sequence starts at a sampled step ``t`` and covers steps ``t - history`` ..
        ``t + length - 1`` of the SAME episode, following true successor/predecessor links
        (forward only through transitions whose successor is stored, so the newest step of a
        still-running episode never ends a sequence).
        Positions past either end of the episode repeat the nearest valid step and are marked
        ``False`` in ``mask`` (like LeRobot's ``action_is_pad``); nothing crosses an episode
        boundary.

        Returns:
            Per-step keys of :meth:`sample` with shape ``(B, history + length, ...)``, plus
            ``mask`` (bool ``(B, history + length)``), ``next.observation.*`` ``(B, ...)``
            (successor of the LAST valid step: what an n-step target bootstraps from),
            ``bootstrap_terminated`` (bool ``(B,)``, the last valid step terminated),
            ``index`` ``(B,)`` (start rows), ``source`` and ``weight`` ``(B,)``.

        Raises:
            ValueError: ``length < 1`` or ``history < 0``, or nothing to sample.
        """
        if length < 1 or history < 0:
            raise ValueError(f"need length >= 1 and history >= 0, got {length}, {history}")
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size, timeout)

        def read(table: Table, starts: np.ndarray) -> dict[str, np.ndarray]:
            return table.read_sequences(starts, length, history)

        return self._draw(sampler, batch_size, rng, read)

    def sample_chunks(
        self,
        batch_size: int,
        length: int,
        sampler: Sampler | None = None,
        *,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Transitions (the keys of :meth:`sample`) with the action chunk that starts at each:
        ``action_chunk`` ``(B, length, A)`` and ``action_chunk_is_pad`` ``(B, length)`` bool
        (past the episode's end; the last real action repeats). What chunking policies (ACT,
        Diffusion, flow-matching chunks) train on; only the actions of later steps are read.

        Raises:
            ValueError: ``length < 1`` or nothing to sample.
            RateLimiterTimeout: with a rate limiter, sampling was not allowed in ``timeout``.
        """
        if length < 1:
            raise ValueError(f"need length >= 1, got {length}")
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size, timeout)

        def read(table: Table, rows: np.ndarray) -> dict[str, np.ndarray]:
            return {**table.read_transitions(rows), **table.read_action_chunks(rows, length)}

        return self._draw(sampler, batch_size, rng, read)

    def _draw(
        self,
        sampler: Sampler | None,
        batch_size: int,
        rng: np.random.Generator | None,
        read: Callable[[Table, np.ndarray], dict[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """The picks of ``sampler`` read with ``read`` (``reading.gather``). Retention (the
        sealer's thread) may delete a segment between the picks and their read, and its
        files with it (``SegmentGoneError``, or ``FileNotFoundError`` from a file already
        gone): then the batch is drawn again from the window left (twice at most).

        Raises:
            FileNotFoundError: a segment file is gone and retention did not delete it.
        """
        rng = rng or _rng()
        for attempt in range(3):
            first = self.first_row
            picks = (sampler or _DEFAULT_SAMPLER).sample_indices(self.view(), batch_size, rng)
            try:
                return reading.gather(picks, read)
            except FileNotFoundError:
                if attempt == 2 or self.first_row == first:
                    raise
        raise AssertionError("unreachable")

    def read_action_chunks(self, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """Action chunks at sorted global ``starts`` (see :meth:`sample_chunks`)."""
        return reading.read_action_chunks(self.state, starts, length)

    def read_sequences(
        self, starts: np.ndarray, length: int, history: int
    ) -> dict[str, np.ndarray]:
        """Sequences at sorted global ``starts`` (see :meth:`sample_sequences`; no ``source``
        or ``weight``)."""
        return reading.read_sequences(self.state, starts, length, history)

    # ------------------------------------------------------------------ reuse --------
    def mount(
        self,
        source: str | Path | ReplayBuffer,
        rows: RowFilter | None = None,
        *,
        name: str | None = None,
        as_task: str | None = None,
    ) -> OfflineView:
        """Mount earlier data (another buffer directory, or this one) as offline data: its
        eligible steps that ``rows`` keeps (all by default).

        Nothing is copied: the other directory is opened read-only and its segments are
        memory-mapped. ``success_only`` keeps the rows of episodes marked ``success``
        (:meth:`mark_episode`). The view's ``filter`` records the filter (provenance).
        ``as_task``: every mounted row counts as this task in samples (a dataset whose task
        names are not this buffer's).

        Raises:
            ValueError: the source's columns differ from this buffer's.
        """
        rows = rows or RowFilter()
        other = source if isinstance(source, ReplayBuffer) else None
        if other is None:
            other = ReplayBuffer.open(
                source,  # type: ignore[arg-type]
                settings=self.settings.model_copy(update={"prefetch": False}),
                read_only=True,
            )
        if not other.schema.same_columns(self.schema):
            raise ValueError(f"{other.directory}: its step schema differs from this buffer's")
        lo, hi = other.first_row, other.visible
        kept = other.index.select(lo, hi, rows)
        view = OfflineView(name or str(other.directory), other, kept, rows, as_task)
        with self.state.lock:
            self.offline.append(view)
        return view

    def select(self, rows: RowFilter | None = None) -> np.ndarray:
        """Eligible global rows of this buffer (all stored, not just the window) that
        ``rows`` keeps (all by default), ascending."""
        return self.index.select(self.first_row, self.visible, rows or RowFilter())

    def index_summary(self) -> dict[str, Any]:
        """Episodes, tasks, robots, policy versions, intervention counts, segment offsets."""
        with self.state.lock:
            return self.index.summary(self.retention.summary())

    # ------------------------------------------------------------------ metrics ------
    def stats(self) -> dict[str, float | int]:
        """Metrics (``buffer.table.stats.buffer_stats``: sizes, cache, WAL, appends, ack
        latency by phase, recovery, episode marks)."""
        return buffer_stats(self)

    # ------------------------------------------------------------------ closing ------
    def close(self) -> None:
        """Finish queued seals, seal the open tail, stop threads, release the directory.

        After ``close`` every stored row is in a sealed segment (no WAL to replay on the next
        open); appends still waiting for their fdatasync complete first.
        """
        st = self.state
        if st.closed:
            return
        if not self.read_only:
            self.flush()
        with st.lock:
            st.closed = True
            self.writer.wait_written()  # appends given rows are still writing their record
        st.stop.set()
        with st.lock:
            st.cond.notify_all()
            self.sealer.stop()
        for t in self._threads:
            t.join(timeout=10)
        if self.writer.wal is not None:
            self.writer.close()
        if self.rate_limiter is not None:
            self.rate_limiter.close()
        for v in self.offline:
            if v.buffer is not self:
                v.buffer.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFAULT_SAMPLER = UniformSampler()
_thread_rng = threading.local()


def _rng() -> np.random.Generator:
    g = getattr(_thread_rng, "g", None)
    if g is None:
        g = _thread_rng.g = np.random.default_rng()
    return g
