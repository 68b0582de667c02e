"""Opening a directory: rebuild the row index from what is on disk and make the WAL's
acknowledged rows sealed segments again.

Steps (``recover``): remove ``*.tmp``; finish an interrupted seal (stripes still under their
WAL name); map every segment and rebuild the row index from them; delete WAL files already
covered by a segment; replay the rest (merge stripes by row, keep the contiguous prefix, drop
torn tails) and seal what they hold in place (truncate or rewrite, fdatasync, rename); apply
the episode marks (``buffer.table.marks``); load the record of what retention deleted
(``buffer.table.retired``). A read-only open (a mount) changes nothing: replayed WAL
rows are served from RAM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.columns import NUMERIC, STRINGS
from buffer.files.sealed import WalSegment, list_sealed, seal_files
from buffer.files.segments import MappedSegment, list_segments
from buffer.files.wal import SPARE_GLOB, WalRecord, keep_only, list_wals, scan_wal
from buffer.table import marks
from buffer.table.chunks import Segment
from buffer.table.index import RowIndex
from buffer.table.retention import Retention
from buffer.table.state import TableState
from foundation.durable import fsync_dir

# The index columns a sealed segment's rows are indexed from (no payload is read).
INDEX_COLUMNS = [*NUMERIC, *STRINGS]

# (first row, rows, files, is a sealed WAL) of a segment found on disk.
_Found = tuple[int, int, list[Path], bool]


@dataclass
class RecoveryReport:
    """What an open found: ``recovered_rows`` replayed from the WAL and sealed, and
    ``torn_bytes_dropped`` (torn tails, never acknowledged)."""

    recovered_rows: int = 0
    torn_bytes_dropped: int = 0


def recover(state: TableState, retention: Retention) -> RecoveryReport:
    """Rebuild ``state`` (index, storage, visible rows) and ``retention``'s segment list from
    ``state.directory``; see the module docstring.

    Raises:
        CorruptDataError: a sealed segment is unreadable, or a line of the retired record
            other than its last.
        UnsupportedFormatError: a WAL or segment file has another format version.
    """
    d = state.directory
    if not state.read_only:
        for tmp in [*d.glob("*.tmp"), *d.glob(SPARE_GLOB)]:  # neither holds a record
            tmp.unlink()
    live: dict[int, list[Path]] = {}
    for first, path in list_wals(d):
        live.setdefault(first, []).append(path)
    found = _segments_on_disk(d, live, state.read_only)
    _load_segments(state, retention, found)
    report = RecoveryReport()
    _replay_wals(state, retention, live, bool(found), report)
    if state.index.end == state.index.base and not found:
        state.index = RowIndex(base=0)
    marks.apply_stored(state)
    state.retired.load({first for first, _, _ in retention.segments})
    state.visible = state.index.end
    state.transitions_inserted = int(state.index.publish(state.index.base, state.index.end))
    return report


def stripe_of(path: Path) -> int:
    """The stripe number of a WAL (``wal-<first>-<stripe>.log``) or sealed file name."""
    return int(path.name.split(".")[0].split("-")[-1])


def _segments_on_disk(d: Path, live: dict[int, list[Path]], read_only: bool) -> list[_Found]:
    """Version-1 Arrow segments and version-2 sealed WAL files, by first row.

    A crash in the middle of a seal's renames leaves some of its stripes under their WAL name:
    they are complete (fdatasynced before the first rename), so the seal is finished here
    (and those files leave ``live``).
    """
    found: list[_Found] = [(first, rows, [path], False) for first, rows, path in list_segments(d)]
    for (first, rows), paths in list_sealed(d).items():
        sealed_stripes = {stripe_of(p) for p in paths}
        # A stripe listed under both names was renamed meanwhile (a live writer while
        # this is a read-only mount): the sealed name wins.
        rest = []
        for p in live.pop(first, []):
            if stripe_of(p) not in sealed_stripes:
                rest.append(p)
            elif not read_only:
                p.unlink()  # a stale copy of a stripe that is sealed already
        if rest and not read_only:
            paths = sorted(set(paths) | set(seal_files(d, first, rows, rest)))
        elif rest:
            paths = paths + rest
        found.append((first, rows, paths, True))
    found.sort(key=lambda f: f[0])
    return found


def _load_segments(state: TableState, retention: Retention, found: list[_Found]) -> None:
    """Map each segment (cold) and index its rows; skip overlaps (an interrupted version-1
    seal of rows recovered already)."""
    if found:
        state.index = RowIndex(base=found[0][0])
    expected = found[0][0] if found else None
    for first, rows, paths, is_wal in found:
        if expected is not None and first < expected:
            continue
        seg: Segment
        if is_wal:
            seg = WalSegment(paths, first, rows, state.schema.arrow_schema)
        else:
            seg = MappedSegment(paths[0], rows)
        state.index_rows(seg.scalar_batch(INDEX_COLUMNS))
        state.storage.add_cold(seg, first)
        retention.add(first, rows, seg)
        expected = first + rows


def _replay_wals(
    state: TableState,
    retention: Retention,
    live: dict[int, list[Path]],
    have_segments: bool,
    report: RecoveryReport,
) -> None:
    """Replay unsealed WAL files: keep the contiguous prefix of their records after the
    sealed rows, drop the rest (torn tails, records after a gap: never acknowledged), and
    seal what is kept in place (truncate, fdatasync, rename: nothing is rewritten)."""
    d = state.directory
    records, files, in_file = _scan_wals(live, state.index.end, report)
    if records and not have_segments:
        state.index = RowIndex(base=min(records))
    pending, end = _contiguous_prefix(state, records)
    if not pending:
        if not state.read_only:
            for _, p in files:
                p.unlink()
            if files:
                fsync_dir(d)
        return
    if state.read_only:
        # Serve WAL rows from RAM without writing anything.
        batch = pa.Table.from_batches([b for _, b in pending]).combine_chunks().to_batches()[0]
        tail = state.storage.new_tail(end - batch.num_rows, batch.num_rows)
        state.storage.write_rows(tail, batch, 0)
        tail.n = batch.num_rows
        tail.sealed = True
        return
    _seal_replayed(state, retention, files, in_file, pending, end, report)


def _scan_wals(
    live: dict[int, list[Path]], end: int, report: RecoveryReport
) -> tuple[dict[int, bytes], list[tuple[int, Path]], dict[Path, list[WalRecord]]]:
    """Complete records of every live WAL file: ``(payload by first row at or after end,
    (generation, path) of each file read, complete records of each file in file order)``."""
    records: dict[int, bytes] = {}
    files: list[tuple[int, Path]] = []
    in_file: dict[Path, list[WalRecord]] = {}
    for first, paths in sorted(live.items()):
        for path in paths:
            try:
                scan = scan_wal(path)
            except FileNotFoundError:  # read-only mount of a live directory: just sealed
                continue
            report.torn_bytes_dropped += scan.file_bytes - scan.good_bytes
            in_file[path] = scan.records
            for rec in scan.records:
                if rec.first_row >= end:  # rows below ``end`` are sealed already
                    records[rec.first_row] = rec.payload
            files.append((first, path))
    return records, files, in_file


def _contiguous_prefix(
    state: TableState, records: dict[int, bytes]
) -> tuple[list[tuple[int, pa.RecordBatch]], int]:
    """Merge the stripes by row id from the index's end and index the contiguous prefix;
    returns its batches by first row and the row after it. A gap means a record that never
    became durable; nothing after it was acknowledged (the watermark rule)."""
    end = state.index.end
    pending: list[tuple[int, pa.RecordBatch]] = []
    while end in records:
        batch = ipc.read_record_batch(pa.py_buffer(records.pop(end)), state.schema.arrow_schema)
        pending.append((end, batch))
        state.index_rows(batch)
        end += batch.num_rows
    return pending, end


def _seal_replayed(
    state: TableState,
    retention: Retention,
    files: list[tuple[int, Path]],
    in_file: dict[Path, list[WalRecord]],
    pending: list[tuple[int, pa.RecordBatch]],
    end: int,
    report: RecoveryReport,
) -> None:
    """Each WAL generation (files sharing a first row) becomes one segment of the rows kept
    from it; files with nothing kept are deleted."""
    d = state.directory
    kept = {r for r, _ in pending}
    gens = sorted({first for first, _ in files})
    for i, first in enumerate(gens):
        stop = gens[i + 1] if i + 1 < len(gens) else end
        rows = [r for r, b in pending if first <= r < stop]
        paths = [p for f, p in files if f == first]
        if not rows:
            for p in paths:
                p.unlink()
            continue
        n = sum(b.num_rows for r, b in pending if first <= r < stop)
        seg_first = rows[0]
        for p in paths:
            keep_only(p, in_file.get(p, []), kept)
        sealed = seal_files(d, seg_first, n, paths)
        seg = WalSegment(sealed, seg_first, n, state.schema.arrow_schema)
        state.storage.add_cold(seg, seg_first)
        retention.add(seg_first, n, seg)
        report.recovered_rows += n
    fsync_dir(d)
