"""Payload storage in tiers: the open tail, hot chunks in RAM, cold chunks memory-mapped.

A *chunk* holds the payload columns (``observation.*``, ``action``, ``action.policy``,
``action.operator``) of a contiguous row range. The open *tail* receives new rows. A tail of
a writable buffer keeps only its small columns in RAM and reads its large ones (camera
frames) from its WAL files (``buffer.table.tail_reads``: no copy into fresh memory); sealed, it is a *cold* chunk, promoted into RAM once sampling makes
it hot. A tail whose schema has no large column holds every column and, sealed, stays in
RAM as a *hot* chunk. When the hot tier exceeds its
byte budget the least-heated hot chunk turns *cold*: its segment is memory-mapped (Arrow reads
the schema, footer and column offsets from the map), its small columns (under a page per row:
states, actions) are copied into RAM, and its large columns (camera frames) are read row by
row with ``pread`` at the offsets the map gives. Touching the map directly would fault whole
page-cache folios into this process (far more than the row), which no byte budget
survives; ``pread`` copies exactly the row, so resident payload memory stays
inside ``memory_budget_bytes`` (hot chunks + open tail + spare tail + small cold columns).

Hot arrays live in anonymous mmaps (not the malloc heap) so an evicted chunk's memory goes back
to the OS at once instead of lingering in allocator arenas.

Heat: each sampled row adds one to its chunk's heat, which decays by half every second. The
prefetch thread promotes the hottest cold chunk when it is hotter than the coldest hot chunk
(or there is room), and serves explicit prefetch requests from cache-aware samplers.
"""

from __future__ import annotations

import mmap
import threading
import time
import weakref
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.columns import fixed_list_slots, valid_mask
from buffer.errors import SegmentGoneError
from buffer.table.chunks import Chunk, ColdArrays, Segment, decode_finals, out_arrays
from buffer.table.features import FINAL_PREFIX
from buffer.table.memory import anon_array, anon_arrays
from buffer.table.row_groups import Successors, chunk_groups, read_with_successors, runs_of
from buffer.table.schema import StepSchema
from buffer.table.tail_reads import WalTailReader

_PAGE = mmap.PAGESIZE
_FAULT_WINDOW = 64 * 1024  # the kernel's default fault-around: cached pages mapped per fault


class TieredStorage:
    """Chunks of payload, with hot/cold tiering and a gather that reads across them.

    Thread-safety: mutation happens under ``lock`` (the buffer's lock); readers take a
    consistent snapshot with :meth:`snapshot` and read without it.
    """

    def __init__(
        self,
        schema: StepSchema,
        budget_bytes: int,
        hot_fraction: float,
        lock: threading.RLock,
    ) -> None:
        self.schema = schema
        self.specs = schema.payload
        # (name, position in a stored batch, spec): a validated batch has the stored schema
        index = schema.arrow_schema.get_field_index
        self._payload_positions = [(k, index(k), f) for k, f in self.specs.items()]
        self.row_bytes = sum(f.nbytes for f in self.specs.values())
        self.small_row_bytes = sum(f.nbytes for f in self.specs.values() if f.nbytes < _PAGE)
        # Columns of a page or more per row: a writer's tail reads them from its WAL files.
        self.large = [k for k, f in self.specs.items() if f.nbytes >= _PAGE]
        # What a writer's tail keeps in RAM per row (its small columns when it has large ones)
        self.tail_row_bytes = self.small_row_bytes if self.large else self.row_bytes
        self.budget = budget_bytes
        self.hot_limit = int(budget_bytes * hot_fraction)
        self.lock = lock
        self.chunks: list[Chunk] = []
        self.starts: np.ndarray = np.empty(0, dtype=np.int64)
        self.hits = 0
        self.misses = 0
        self.cold_touched = 0
        self.page_releases = 0
        self._heat_time = time.monotonic()
        self.prefetch_requests: dict[int, float] = {}  # chunk first_row -> request time
        self.prefetch_lag_s = 0.0
        self.promotions = 0
        self.evictions = 0
        self.small_drops = 0  # cold chunks whose small columns were let go (budget)
        self.spare_bytes = 0
        self.reserved_bytes = 0  # room taken by a promotion whose read is in flight
        self.retired_bytes = 0  # evicted hot arrays a reader still holds (not yet unmapped)
        self._retired_lock = threading.Lock()
        self.file_rss_base = _rss_file() or 0

    # -- construction -------------------------------------------------------------------
    def allocate(
        self, capacity: int, populate: bool = True, small: bool = False
    ) -> dict[str, np.ndarray]:
        """Payload arrays for a tail of ``capacity`` rows (pre-faulted by default); only the
        small columns with ``small`` (a writer's tail: see :meth:`new_tail`)."""
        if small:
            names = [k for k in self.specs if k not in self.large]
            specs = {k: ((capacity, *self.specs[k].shape), self.specs[k].dtype) for k in names}
            return anon_arrays(specs, populate)  # one mapping: a drop_small frees it all
        return {
            k: anon_array((capacity, *f.shape), f.dtype, populate) for k, f in self.specs.items()
        }

    def new_tail(
        self,
        first_row: int,
        capacity: int,
        arrays: dict[str, np.ndarray] | None = None,
        reader: WalTailReader | None = None,
    ) -> Chunk:
        """The open tail from ``first_row``: every column in ``arrays`` (new ones when None),
        or with ``reader`` (a writer's tail when the schema has large columns) only the small
        ones (:meth:`allocate` with ``small``), the large ones read from the WAL."""
        if reader is not None:
            cold = ColdArrays(reader)
            cold.update(arrays if arrays is not None else self.allocate(capacity, small=True))
            arrays = cold
        elif arrays is None:
            arrays = self.allocate(capacity)
        chunk = Chunk(
            first_row,
            capacity,
            arrays,
            row_bytes=self.tail_row_bytes if reader is not None else self.row_bytes,
            small_row_bytes=self.small_row_bytes,
        )
        self._add_chunk(chunk)
        return chunk

    def seal(self, chunk: Chunk, seg: Segment) -> None:
        """A full tail's segment is written (locked): a tail that read its large columns from
        its WAL turns cold, keeping its small columns and its heat (its rows are read from
        the segment now; the prefetch thread promotes it when sampling makes it hot)."""
        chunk.sealed = True
        chunk.path = seg.path
        chunk.mapped = seg
        chunk.finals = {}  # read from the segment from now on (a new dict: see finals_for)
        if isinstance(chunk.arrays, ColdArrays):
            cold = ColdArrays(seg)
            cold.update({k: v[: chunk.n] for k, v in chunk.arrays.items()})
            chunk.arrays = cold
            chunk.hot = False
            chunk.row_bytes = self.row_bytes

    def _cold_arrays(
        self, seg: Segment, hot: dict[str, np.ndarray] | None, small: bool = True
    ) -> ColdArrays:
        """Small columns (< 1 page per row: states, actions) copied into RAM when ``small``;
        large ones (camera frames) stay on disk.

        Small columns stay resident while the budget has room because a cold read of a row
        then costs one pread per large column instead of one per column; they count in the
        budget, and :meth:`enforce_budget` drops them (coldest first) once hot chunks are
        gone and they alone would overflow it, so resident memory stays bounded by the
        budget however much data the directory holds. Columns not in the dict are read with
        ``seg.read_rows`` (pread).
        """
        out = ColdArrays(seg)
        names = [k for k, f in self.specs.items() if f.nbytes < _PAGE] if small else []
        if not names:
            return out
        # One mmap for them all, so dropping them gives the memory back to the OS at once.
        specs = {k: ((seg.num_rows, *self.specs[k].shape), self.specs[k].dtype) for k in names}
        for k, arr in anon_arrays(specs).items():
            if hot is not None:
                arr[...] = hot[k][: seg.num_rows]
            else:
                seg.read_column(k, arr)
            out[k] = arr
        return out

    def add_cold(self, seg: Segment, first_row: int) -> Chunk:
        """A cold chunk for a segment found when opening; its small columns are read in
        only while they fit in the hot tier (its final observations stay on disk)."""
        fits = self.hot_bytes() + seg.num_rows * self.small_row_bytes <= self.hot_limit
        arrays = self._cold_arrays(seg, None, small=fits)
        chunk = Chunk(
            first_row,
            seg.num_rows,
            arrays,
            n=seg.num_rows,
            hot=False,
            sealed=True,
            path=seg.path,
            mapped=seg,
            row_bytes=self.row_bytes,
            small_row_bytes=self.small_row_bytes,
        )
        self._add_chunk(chunk)
        return chunk

    def _add_chunk(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.starts = np.array([c.first_row for c in self.chunks], dtype=np.int64)

    def remove_chunks(self, gone: list[Chunk]) -> None:
        """Forget chunks (an empty tail being replaced, or segments deleted by retention)."""
        self.chunks = [c for c in self.chunks if all(c is not g for g in gone)]
        self.starts = np.array([c.first_row for c in self.chunks], dtype=np.int64)

    # -- writing ------------------------------------------------------------------------
    def write_rows(self, tail: Chunk, batch: pa.RecordBatch, offset: int) -> None:
        """Copy a validated batch's payload into ``tail`` at local row ``offset``."""
        n = batch.num_rows
        action = None
        arrays = tail.arrays
        for name, pos, f in self._payload_positions:
            if name not in arrays:
                continue  # a large column of a writer's tail: read from its WAL
            col = batch.column(pos)
            dst = arrays[name][offset : offset + n]
            if col.null_count:
                # Absent policy/operator action means "same as the executed action".
                if action is None:
                    action = _fixed_to_numpy(batch.column("action"), self.specs["action"])
                dst[...] = _fixed_to_numpy(col, f, fill=action)
            else:
                dst[...] = _fixed_to_numpy(col, f)
        tail.finals.update(decode_finals(self.schema, batch, tail.first_row + offset))

    # -- tiering ------------------------------------------------------------------------
    def hot_bytes(self) -> int:
        """Resident payload bytes in RAM: hot chunks, the open tail, a pre-faulted spare,
        small columns of cold chunks, room reserved by a promotion in flight, and evicted
        arrays a reader still holds."""
        held = self.spare_bytes + self.reserved_bytes + self.retired_bytes
        return sum(c.resident_bytes for c in self.chunks) + held

    def _decay(self) -> None:
        now = time.monotonic()
        dt = now - self._heat_time
        if dt < 0.05:
            return
        factor = 0.5**dt
        for c in self.chunks:
            c.heat *= factor
        self._heat_time = now

    def make_cold(self, chunk: Chunk) -> None:
        """Swap a sealed hot chunk's arrays for mmap views of its segment (under lock).

        A reader may still hold the old arrays (a sample in flight took a snapshot); until
        their memory is really unmapped it stays counted (``retired_bytes``), so nothing is
        allocated into room that is not free yet.
        """
        assert chunk.sealed and chunk.mapped is not None
        old = chunk.arrays
        for arr in old.values():
            self._retire(arr)
        chunk.arrays = self._cold_arrays(chunk.mapped, old)
        chunk.hot = False
        chunk.touched_bytes = 0
        self.evictions += 1

    def _retire(self, arr: np.ndarray) -> None:
        """Count ``arr``'s anonymous mapping as resident until it is freed (weakref finalizer)."""
        base: Any = arr
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if isinstance(base, memoryview):  # np.frombuffer(mmap) holds a memoryview of it
            base = base.obj
        if not isinstance(base, mmap.mmap) or len(base) < _PAGE:
            return
        nbytes = len(base)
        with self._retired_lock:
            self.retired_bytes += nbytes
        weakref.finalize(base, self._retired_free, nbytes)

    def _retired_free(self, nbytes: int) -> None:
        with self._retired_lock:
            self.retired_bytes -= nbytes

    def enforce_budget(self) -> None:
        """Evict the coldest sealed hot chunks until the hot tier fits; when the small
        columns of cold chunks alone still overflow it, drop those of the coldest cold
        chunks (under lock). Nothing but the row index then grows with the data."""
        self._decay()
        total = self.hot_bytes()
        if total <= self.hot_limit:
            return

        def coldest(c: Chunk) -> tuple[float, int]:
            return c.heat, c.first_row

        for c in sorted((c for c in self.chunks if c.hot and c.sealed), key=coldest):
            if total <= self.hot_limit:
                return
            total -= c.resident_bytes
            self.make_cold(c)
            total += c.resident_bytes
        for c in sorted((c for c in self.chunks if not c.hot and c.arrays), key=coldest):
            if total <= self.hot_limit:
                return
            if c.mapped is None:
                continue  # rows served from RAM only (a read-only mount's WAL rows)
            total -= c.resident_bytes
            self.drop_small(c)

    def drop_small(self, chunk: Chunk) -> None:
        """Let a cold chunk's small columns go; they are read from its segment from now on
        (under lock; a reader holding the old arrays keeps them counted until it lets go)."""
        assert chunk.mapped is not None
        arrays = list(chunk.arrays.values())
        if arrays:
            self._retire(arrays[0])  # one mapping holds them all (_cold_arrays)
        chunk.arrays = ColdArrays(chunk.mapped)
        self.small_drops += 1

    def promote(self, chunk: Chunk) -> bool:
        """Read a cold chunk into RAM (not through its mmap, so no file pages stay resident).

        Called by the prefetch thread WITHOUT the lock for the read; swaps under the lock.
        Returns False when it does not fit even after evicting colder chunks.
        """
        if chunk.hot or chunk.mapped is None:
            return False
        # What the chunk adds once hot (its small columns may be resident already).
        need = chunk.n * self.row_bytes - chunk.resident_bytes
        with self.lock:
            self._decay()
            if chunk.hot or chunk not in self.chunks:
                return False
            room = self.hot_limit - self.hot_bytes()
            colder = sorted(
                (c for c in self.chunks if c.hot and c.sealed and c.heat < chunk.heat),
                key=lambda c: (c.heat, c.first_row),
            )
            freeable = sum(c.resident_bytes - c.n * self.small_row_bytes for c in colder)
            if room + freeable < need:
                return False
            # Evict BEFORE reading and reserve the room, so RSS never holds both the
            # evicted chunks and the promoted one (the peak stays inside the budget).
            for c in colder:
                if room >= need:
                    break
                room += c.resident_bytes - c.n * self.small_row_bytes
                self.make_cold(c)
            if self.hot_limit - self.hot_bytes() < need:
                return False  # a reader still holds evicted arrays: retry on the next round
            self.reserved_bytes += need
        try:
            seg = chunk.mapped
            arrays = {}
            for name, spec in self.specs.items():
                if name in chunk.arrays:  # small columns of a cold chunk, in RAM already
                    arrays[name] = chunk.arrays[name]
                    continue
                dst = anon_array((chunk.n, *spec.shape), spec.dtype)
                seg.read_column(name, dst)
                arrays[name] = dst
        finally:
            with self.lock:
                self.reserved_bytes -= need
        with self.lock:
            if chunk.hot or chunk not in self.chunks:
                return False
            chunk.arrays = arrays
            chunk.hot = True
            self.cold_touched -= chunk.touched_bytes
            chunk.touched_bytes = 0
            seg.release_pages()
            self.promotions += 1
            t = self.prefetch_requests.pop(chunk.first_row, None)
            if t is not None:
                self.prefetch_lag_s = time.monotonic() - t
        return True

    def prefetch_candidate(self) -> Chunk | None:
        """The cold chunk most worth promoting now, or None."""
        with self.lock:
            self._decay()
            cold = [c for c in self.chunks if not c.hot and c.mapped is not None]
            if not cold:
                self.prefetch_requests.clear()
                return None
            requested = [c for c in cold if c.first_row in self.prefetch_requests]
            if requested:
                return min(requested, key=lambda c: self.prefetch_requests[c.first_row])
            best = max(cold, key=lambda c: (c.heat, c.first_row))
            if best.heat <= 0:
                return None
            room = self.hot_limit - self.hot_bytes()
            if room >= best.n * self.row_bytes:
                return best
            hot = [c for c in self.chunks if c.hot and c.sealed]
            if hot and min(c.heat for c in hot) * 2 < best.heat:
                return best
            return None

    def request_prefetch(self, chunk: Chunk) -> None:
        self.prefetch_requests.setdefault(chunk.first_row, time.monotonic())

    def current_prefetch_lag(self) -> float:
        if not self.prefetch_requests:
            return 0.0
        return time.monotonic() - min(self.prefetch_requests.values())

    # -- reading ------------------------------------------------------------------------
    def snapshot(self) -> tuple[list[Chunk], np.ndarray, list[dict[str, np.ndarray]]]:
        """Chunks, their first rows and their current arrays, consistent with each other."""
        with self.lock:
            return list(self.chunks), self.starts, [c.arrays for c in self.chunks]

    def gather(
        self,
        rows: np.ndarray,
        names: list[str],
        snap: tuple[list[Chunk], np.ndarray, list[dict[str, np.ndarray]]] | None = None,
        count: bool = True,
        out: dict[str, np.ndarray] | None = None,
        then: Successors | None = None,
        skip: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Payload columns for global ``rows`` (any order), as arrays ``(len(rows), ...)``
        (new ones, or written into ``out``).

        ``then``: the rows' successors (next observations), read beside each row where a file
        read brings both (:class:`Successors`). ``skip``: bool ``(len(rows),)``, positions
        whose file reads an earlier ``then`` already made (RAM copies are made regardless).
        """
        chunks, starts, arrays = snap if snap is not None else self.snapshot()
        n = len(rows)
        if out is None:
            out = out_arrays({k: ((n, *self.specs[k].shape), self.specs[k].dtype) for k in names})
        if n == 0:
            return out
        which = np.searchsorted(starts, rows, side="right") - 1
        if which.min() < 0:  # below every chunk of the snapshot: retention deleted theirs
            lowest = int(starts[0]) if len(starts) else None
            raise SegmentGoneError(
                f"row {int(rows.min())} is no longer stored (first stored row: {lowest}): "
                "retention deleted its segment after it was picked"
            )
        groups = chunk_groups(which)
        big = [k for k in names if self.specs[k].nbytes >= _PAGE]
        cold_rows = sum(
            len(rows) if sel is None else len(sel)
            for c_i, sel in groups
            if not isinstance(arrays[c_i], ColdArrays)
            and (not chunks[c_i].hot or chunks[c_i].arrays is not arrays[c_i])
        )
        if cold_rows and big:
            # Make room BEFORE faulting pages in, so the peak stays inside the budget.
            per_row = sum(_FAULT_WINDOW * (self.specs[k].nbytes // _FAULT_WINDOW + 2) for k in big)
            self._account_cold(0, upcoming=cold_rows * per_row)
        touched = 0
        for c_i, sel in groups:
            chunk, arrs = chunks[c_i], arrays[c_i]
            local = rows - chunk.first_row if sel is None else rows[sel] - chunk.first_row
            if local.min() < 0 or local.max() >= chunk.capacity:
                raise IndexError(f"rows outside chunk [{chunk.first_row}, +{chunk.capacity})")
            mapped = arrs.seg if isinstance(arrs, ColdArrays) else None
            here = names
            if mapped is not None and then is not None:
                paired = [k for k in names if k in then.out and k not in arrs]
                for k in paired:
                    read_with_successors(mapped, k, chunk.first_row, local, sel, out, then)
                here = [k for k in names if k not in paired]
            self._copy_rows(arrs, mapped, local, sel, here, out, skip)
            # An open tail's large columns come from its WAL (tail_reads): not from RAM.
            hot = chunk.hot and chunk.arrays is arrs and (mapped is None or not big)
            if count:
                chunk.heat += len(local)
                if hot:
                    self.hits += len(local)
                else:
                    self.misses += len(local)
            if mapped is None and not hot and chunk.mapped is not None and big:
                per_row = sum(_pages(self.specs[k].nbytes) for k in big)
                chunk.touched_bytes += per_row * len(local)
                touched += per_row * len(local)
        if touched:
            self._account_cold(touched)
        return out

    def _copy_rows(
        self,
        arrs: dict[str, np.ndarray],
        mapped: Segment | WalTailReader | None,
        local: np.ndarray,
        sel: np.ndarray | None,
        names: list[str],
        out: dict[str, np.ndarray],
        skip: np.ndarray | None = None,
    ) -> None:
        """Copy one chunk's ``local`` rows of ``names`` into ``out`` at positions ``sel``
        (None: all of ``out``, in order): large columns of a cold chunk are read from its
        segment file (but at positions where ``skip`` is True), the rest taken from the
        chunk's arrays."""
        runs = None if sel is None else runs_of(sel)
        file_rows: tuple[np.ndarray, np.ndarray | None] = (local, sel)
        if skip is not None and mapped is not None:
            at = np.arange(len(skip)) if sel is None else sel
            keep = ~skip[at]
            file_rows = (local[keep], at[keep])
        for k in names:
            if mapped is not None and k not in arrs:
                mapped.read_rows(k, file_rows[0], out[k], at=file_rows[1])
            elif sel is None:
                np.take(arrs[k], local, axis=0, out=out[k], mode="clip")
            elif runs is not None:
                # Straight into ``out``: a scatter would copy every row twice, through a
                # temporary (fresh pages the kernel zero-fills when rows are camera frames).
                for a, b in runs:
                    to = int(sel[a])
                    np.take(arrs[k], local[a:b], axis=0, out=out[k][to : to + b - a], mode="clip")
            else:
                out[k][sel] = arrs[k][local]

    def _account_cold(self, touched: int, upcoming: int = 0) -> None:
        """Keep resident cold pages inside ``budget - hot bytes``.

        The kernel maps more than the rows touched (fault-around maps up to 64 KiB of cached
        file pages around each fault), so the real figure comes from the process's file-backed
        RSS (``RssFile`` in /proc/self/status) above its level when the buffer opened.
        """
        with self.lock:
            self.cold_touched += touched
            allowance = max(self.budget - self.hot_bytes(), 0)
            measured = _rss_file() - self.file_rss_base
            resident = max(measured, self.cold_touched if self.file_rss_base == 0 else 0)
            if resident + upcoming <= allowance:
                return
            for c in self.chunks:
                if c.mapped is not None and not c.hot and c.touched_bytes:
                    c.mapped.release_pages()
                    self.page_releases += 1
                    c.touched_bytes = 0
            self.cold_touched = 0
            # What stays file-resident now is not ours (libraries loaded meanwhile): rebase.
            self.file_rss_base = max(self.file_rss_base, _rss_file())

    def finals_for(
        self, rows: np.ndarray, chunks: list[Chunk], starts: np.ndarray
    ) -> dict[int, dict[str, np.ndarray]]:
        """``{row: {observation name: final observation}}`` of those global ``rows`` (done
        steps) that carry one: from RAM for the open tail, read from the segment (pread)
        for a sealed chunk, so no final observation of sealed data stays in memory."""
        if len(rows) == 0:
            return {}
        ci = np.searchsorted(starts, rows, side="right") - 1
        out: dict[int, dict[str, np.ndarray]] = {}
        for c in np.unique(ci).tolist():
            chunk = chunks[c]
            finals = chunk.finals  # before ``mapped``: a seal sets mapped, then a new dict
            seg = chunk.mapped
            mine = rows[ci == c]
            if seg is None:
                out.update({r: finals[r] for r in mine.tolist() if r in finals})
                continue
            for name, f in self.schema.observations.items():
                values = seg.read_finals(FINAL_PREFIX + name, mine - chunk.first_row)
                for r, v in zip(mine.tolist(), values, strict=True):
                    if v is not None:
                        arr = np.frombuffer(v, dtype=f.dtype).reshape(f.shape)
                        out.setdefault(r, {})[name] = arr
        return out


def _rss_file() -> int:
    """File-backed resident bytes of this process (Linux), or 0 where unknown."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _pages(nbytes: int) -> int:
    # A row straddles at most one extra page.
    return (nbytes // _PAGE + 2) * _PAGE


def _fixed_to_numpy(col: pa.Array, f: Any, fill: np.ndarray | None = None) -> np.ndarray:
    """A validated payload column as numpy ``(n, *f.shape)``; a null row (an absent policy
    or operator action) takes ``fill``'s row. A view of the column's buffer where it can be
    (no GIL release on the append path: ``buffer.columns``)."""
    slots = fixed_list_slots(col)
    if slots is None:
        values = col.values.slice(col.offset * f.size, len(col) * f.size)
        arr = values.to_numpy(zero_copy_only=False).reshape((len(col), *f.shape))
    else:
        arr = slots.reshape((len(col), *f.shape))
    if fill is not None and col.null_count:
        valid = valid_mask(col)
        arr = np.where(valid.reshape((-1,) + (1,) * len(f.shape)), arr, fill)
    return arr
