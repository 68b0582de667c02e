"""Durable writes: what must survive a crash or a power cut is written through these helpers.

A file is durable once its data and the directory entry naming it are on disk: write a
temporary file beside it, fsync it, rename it over the target (atomic on POSIX: a reader sees
the old file or the new one, never a mix), then fsync the directory. Appended lines are
fsynced before the call returns. Every function raises ``OSError`` as the OS reports it (a
full disk is ``ENOSPC``); the target is then unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a file created, renamed or removed in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync one file's data and metadata."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` and every directory, bottom-up."""
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fsync_file(Path(root) / name)
        fsync_dir(Path(root))


def replace_durably(tmp: Path, final: Path) -> None:
    """Rename the already-fsynced ``tmp`` over ``final`` and fsync the directory."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


def atomic_write_bytes(path: Path, data: bytes | bytearray | memoryview, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably; the file gets ``mode``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.chmod(tmp, mode)  # the process umask may have narrowed it at creation
    replace_durably(tmp, path)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode(), mode)


def atomic_write_json(path: Path, data: Any, mode: int = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``data`` as JSON."""
    atomic_write_bytes(path, json.dumps(data).encode(), mode)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (a newline is added) to ``path`` and fsync before returning.

    Whole or not at all: when the write fails part-way (a full disk), the file is cut back to
    its size before, so no torn line sits under the next one.

    Raises:
        OSError: the line could not be written (the file is as it was).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        end = os.fstat(fd).st_size
        data = (line + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)
