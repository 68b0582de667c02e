"""A record batch as one Arrow IPC message, in pieces that share the batch's memory.

``RecordBatch.serialize()`` copies the whole batch into a freshly allocated buffer; for
camera frames that is a megabyte-sized allocation per append whose first touch page-faults
(most of the durable ingest's CPU). The
WAL needs the message's bytes only to checksum and ``writev`` them, so here an Arrow stream
writer writes into a sink that keeps what it is handed: the small metadata and padding pieces
as bytes and the body buffers as zero-copy ``pyarrow.Buffer`` views of the batch's columns.
Their concatenation is byte for byte ``batch.serialize()`` (the stream writer writes each
batch as the same encapsulated message; ``tests/buffer/test_encoding.py`` checks it), so the
on-disk format does not change.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.columns import values_address

type Piece = bytes | memoryview | pa.Buffer
_SMALL = 64 * 1024  # pieces below this are joined (copied); larger ones are written in place


class _Keep:
    """A write-only file object that keeps the pieces written to it (no copy)."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.pieces.append(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Encoder:
    """One stream writer for ``schema`` whose schema message is already written."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.sink = _Keep()
        self.writer = ipc.new_stream(self.sink, schema)
        empty = pa.record_batch([pa.array([], type=f.type) for f in schema], schema=schema)
        self.writer.write_batch(empty)  # the stream's schema message goes out with it
        self.sink.pieces.clear()

    def encode(self, batch: pa.RecordBatch) -> list[Piece]:
        """The message's pieces as the stream writer handed them (not yet coalesced)."""
        self.writer.write_batch(batch)
        pieces, self.sink.pieces = self.sink.pieces, []
        return pieces


def _coalesced(pieces: list[Piece]) -> list[Piece]:
    """Runs of small pieces joined into one bytes object (a copy of a few KiB), so the
    checksum and ``writev`` see a handful of pieces instead of dozens; large ones (camera
    frames) stay views."""
    out: list[Piece] = []
    small: list[Piece] = []
    for p in pieces:
        if (p.size if isinstance(p, pa.Buffer) else len(p)) < _SMALL:
            small.append(p)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(p)
    if small:
        out.append(b"".join(small))
    return out


_local = threading.local()


def ipc_pieces(batch: pa.RecordBatch) -> list[Piece]:
    """``batch`` as one IPC record batch message (no schema), in pieces.

    Returns:
        Bytes-like pieces whose concatenation equals ``batch.serialize()``; the body pieces
        are views of the batch's buffers, so they are valid while the batch (or the pieces)
        are alive. Thread-safe (one writer per thread and schema).
    """
    return _coalesced(_encoder(batch.schema).encode(batch))


def ipc_message(
    batch: pa.RecordBatch, names: Sequence[str]
) -> tuple[list[Piece], list[int] | None]:
    """:func:`ipc_pieces` of ``batch``, and where in the message each fixed-size-list column
    of ``names`` has its row 0 values (byte offsets from the message's start; row ``i``'s
    values follow at ``i`` times the row's width), so the rows can be read back from the
    written message (``buffer.table.tail_reads``) without parsing it.

    The offsets come from the body pieces: the stream writer hands each column's values
    buffer over as a zero-copy view, so the piece holding the column's row 0 address is
    that buffer. None when one is not found (the writer copied it); the caller then parses
    the message it wrote.
    """
    raw = _encoder(batch.schema).encode(batch)
    spans: list[tuple[int, int, int]] = []  # (address, size, offset in the message)
    pos = 0
    for p in raw:
        size = p.size if isinstance(p, pa.Buffer) else memoryview(p).nbytes
        if isinstance(p, pa.Buffer):
            spans.append((p.address, size, pos))
        pos += size
    offsets: list[int] = []
    for name in names:
        col = batch.column(name)
        at = values_address(col)
        need = len(col) * col.type.list_size * col.values.type.byte_width
        found = next((o + at - a for a, n, o in spans if a <= at and at + need <= a + n), None)
        if found is None:
            return _coalesced(raw), None
        offsets.append(found)
    return _coalesced(raw), offsets


def _encoder(schema: pa.Schema) -> _Encoder:
    """This thread's stream writer for ``schema``."""
    # Found by ``Schema.equals`` (a pointer walk), not by hashing the schema (slower).
    encoders: list[_Encoder] | None = getattr(_local, "encoders", None)
    if encoders is None:
        encoders = _local.encoders = []
    enc = next((e for e in encoders if e.schema is schema or e.schema.equals(schema)), None)
    if enc is None:
        enc = _Encoder(schema)
        encoders[:] = [enc, *encoders[:7]]  # a buffer has one schema; a few at most
    return enc


def pieces_size(pieces: Sequence[Piece]) -> int:
    """Total bytes of ``pieces``."""
    return sum(int(p.size) if isinstance(p, pa.Buffer) else len(p) for p in pieces)
