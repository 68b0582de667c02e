"""A disk that fills up under a replay buffer, two ways (the ``full_disk`` fixture runs both):

* ``tmpfs``: a real file system of a few MiB mounted for the test (needs root, or the
  CAP_SYS_ADMIN a container may lack: then that variant is skipped, saying why) and filled
  with a ballast file until ``ENOSPC``; :meth:`free` deletes the ballast.
* ``injected``: the buffer's write-ahead log writes (``buffer.files.wal``'s ``os.writev`` /
  ``os.write``) fail with ``ENOSPC`` while the disk is "full", after writing half of what
  they were given, as a file system does when it runs out mid-write; ``cover`` adds another
  module's writes (the episode marks' ``foundation.durable``). It runs anywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import buffer.files.wal


class TmpfsDisk:
    """A ``size`` tmpfs mounted at ``mountpoint`` (unmounted by :meth:`close`)."""

    def __init__(self, mountpoint: Path, size: str = "8m") -> None:
        mountpoint.mkdir(parents=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        self.path = mountpoint
        self._ballast = mountpoint / f"ballast-{uuid.uuid4().hex}"

    def fill(self) -> None:
        """Write the ballast until the file system refuses (``ENOSPC``)."""
        fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        block = b"\0" * 4096
        try:
            while True:
                os.write(fd, block)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self._ballast.unlink(missing_ok=True)

    def cover(self, module: Any) -> None:
        """Every file of the mount is on the full disk already: nothing to add."""

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=True)


class _FullOs:
    """``os`` as ``buffer.files.wal`` sees it: writes fail with ENOSPC while ``full``."""

    def __init__(self) -> None:
        self.full = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _nospace(self) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writev(self, fd: int, buffers: list[Any]) -> int:
        if not self.full:
            return os.writev(fd, buffers)
        data = b"".join(bytes(b) for b in buffers)
        if len(data) < 2:
            raise self._nospace()
        return os.write(fd, data[: len(data) // 2])  # the space runs out mid-record

    def write(self, fd: int, data: Any) -> int:
        if self.full:
            raise self._nospace()
        return os.write(fd, data)


class InjectedDisk:
    """A directory under ``root`` whose buffer WAL writes fail while :meth:`fill` holds."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = root
        root.mkdir(parents=True)
        self._os = _FullOs()
        self._monkeypatch = monkeypatch
        self.cover(buffer.files.wal)

    def cover(self, module: Any) -> None:
        """Let ``module``'s writes (its ``os.write`` / ``os.writev``) fail while full too."""
        self._monkeypatch.setattr(module, "os", self._os)

    def fill(self) -> None:
        self._os.full = True

    def free(self) -> None:
        self._os.full = False

    def close(self) -> None:
        pass


Disk = TmpfsDisk | InjectedDisk


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Disk]:
    """A disk that the test fills and frees (see the module docstring)."""
    disk: Disk
    if request.param == "tmpfs":
        disk = TmpfsDisk(tmp_path / "tmpfs")
    else:
        disk = InjectedDisk(tmp_path / "injected", monkeypatch)
    try:
        yield disk
    finally:
        disk.close()
