"""The on-disk format version of a buffer directory, and how each file carries it.

Version 2 (the one written): WAL files start with ``b"RFWAL002"``; a segment is sealed by
renaming the WAL files themselves (``seg-<first>-<rows>-<stripe>.wal``, see
``buffer.files.sealed``), so each row is written once. Version 1 files are still read: a version-1
WAL has the same record layout, and version-1 Arrow segments are read as Arrow IPC files.

Version 1: WAL files start with the marker ``b"RFWAL001"`` (``RFWAL`` + three digits of the
version); sealed segments are Arrow IPC files whose schema metadata holds
``robofleet.buffer.format_version = b"1"`` (segments written before the key existed have
none and are version 1: the layout is the same). A file of another version, or with a marker
that is not ours, is refused on open (:class:`~buffer.errors.UnsupportedFormatError`), never
read as empty: guessing would drop or misread acknowledged rows.
"""

from __future__ import annotations

FORMAT_VERSION = 2
SUPPORTED_FORMAT_VERSIONS = (1, 2)
WAL_MARKER_PREFIX = b"RFWAL"
SEGMENT_VERSION_KEY = b"robofleet.buffer.format_version"


def wal_marker(version: int = FORMAT_VERSION) -> bytes:
    """The 8-byte marker a WAL file of ``version`` starts with."""
    return WAL_MARKER_PREFIX + f"{version:03d}".encode()
