"""Opening a buffer directory: its stored step schema and the one writer's lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from buffer.table.schema import StepSchema

SCHEMA_FILE = "schema.json"
SHARDS_FILE = "shards.json"  # a sharded buffer's root (buffer.service.shards), not a buffer itself


def stored_schema(directory: Path, schema: StepSchema | None, read_only: bool) -> StepSchema:
    """The schema of the buffer in ``directory``: the stored one, or ``schema`` for a new
    directory (which must then be given).

    Raises:
        ValueError: no schema for a new directory, or one that differs from the stored one.
        FileNotFoundError: ``read_only`` and ``directory`` holds no buffer.
    """
    stored = directory / SCHEMA_FILE
    if stored.exists():
        on_disk = StepSchema.from_json(stored.read_text())
        if schema is not None and not schema.same_columns(on_disk):
            raise ValueError(
                f"{directory}: the given schema differs from the stored one "
                f"({on_disk.arrow_schema.names})"
            )
        schema = schema or on_disk
    elif schema is None:
        raise ValueError(f"{directory}: no stored schema; pass schema= to create a buffer")
    elif read_only:
        raise FileNotFoundError(f"{directory}: not a buffer directory")
    return schema


def lock_directory(directory: Path) -> int:
    """Take the directory's ``LOCK`` (``flock``, exclusive) for this process; the descriptor
    that holds it (closing it lets go).

    Raises:
        BlockingIOError: another process has the buffer open for writing.
    """
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BlockingIOError(
            f"{directory}: another process has this buffer open for writing"
        ) from None
    return fd
