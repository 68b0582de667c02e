"""Weights handed from a learner process to the cloud process through files, one copy each side.

A learner that shares a process with the gRPC server competes with it for the GIL and the CPU;
on two cores that alone made training steps three times slower while versions were pushed.
So the learner only writes each version into a safetensors file (in ``/dev/shm`` this is one
``memcpy``) and the cloud process publishes it: hashing, deltas and every byte sent to robots
cost the learner nothing.

Learner::

    write_weights(directory / weight_file_name(version), policy.state_dict())

Cloud::

    feed = WeightFileFeed(server.distributor(run_id), directory)   # polls, publishes, cleans up
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from comms import tensors as T
from comms.distributor import WeightDistributor
from comms.priority import lower_this_thread

log = logging.getLogger(__name__)

_NAME = re.compile(r"^v(\d{12})\.safetensors$")


def weight_file_name(version: int) -> str:
    """``v<version, 12 digits>.safetensors`` (sorts by version)."""
    if not 0 <= version < 10**12:
        raise ValueError(f"version {version} outside 0..10**12-1")
    return f"v{version:012d}.safetensors"


def write_weights(path: Path, state: Mapping[str, Any]) -> int:
    """Write ``state`` (name -> torch tensor or numpy array) as a safetensors file, atomically.

    The tensors are copied once, straight into a memory map of a temporary file next to
    ``path``, which is then renamed over ``path``: a reader sees the whole file or none.

    Returns:
        The file size in bytes.

    Raises:
        TypeError: a value is not a tensor or its dtype cannot travel.
    """
    arrays = {k: T.as_array(v) for k, v in state.items()}
    head, offsets = T.layout({k: (dt, tuple(a.shape)) for k, (a, dt) in arrays.items()})
    size = len(head) + sum(a.nbytes for a, _ in arrays.values())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            mm[: len(head)] = head
            for name, (arr, _dt) in arrays.items():
                dst = np.frombuffer(mm, np.uint8, count=arr.nbytes, offset=offsets[name])
                dst[:] = arr.reshape(-1).view(np.uint8)
                del dst  # the map cannot close while a view of it exists
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return size


def read_weights(path: Path) -> bytearray:
    """The bytes of a weight file (checked to be a safetensors blob).

    Raises:
        TensorFormatError: the file is not a valid safetensors blob.
        OSError: it cannot be read.
    """
    with path.open("rb", buffering=0) as f:
        blob = bytearray(os.fstat(f.fileno()).st_size)
        view = memoryview(blob)
        got = 0
        while got < len(blob):
            n = f.readinto(view[got:])
            if not n:
                raise T.TensorFormatError(f"{path} shrank while being read")
            got += n
    T.decode(blob)
    return blob


class WeightFileFeed:
    """Publishes the newest ``v<version>.safetensors`` of ``directory`` through ``publisher``.

    Polls every ``poll_s``; a version is published once, older files are deleted after a newer
    one is published (the newest stays, for a restarted cloud). A file that is not valid
    safetensors is logged and skipped, never published.
    """

    def __init__(
        self,
        publisher: WeightDistributor,
        directory: Path,
        poll_s: float = 0.05,
        keep: int = 1,
        thread_nice: int = 10,
    ) -> None:
        self.publisher = publisher
        self.directory = directory
        self.poll_s = poll_s
        self.keep = max(1, keep)
        self.published = 0
        self.refused = 0
        self._thread_nice = thread_nice  # reading a version is bulk work (comms.priority)
        self._last = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-file-feed", daemon=True)
        self._thread.start()

    def _versions(self) -> list[tuple[int, Path]]:
        out = []
        for entry in os.scandir(self.directory):
            m = _NAME.match(entry.name)
            if m:
                out.append((int(m.group(1)), Path(entry.path)))
        return sorted(out)

    def poll(self) -> bool:
        """Publish the newest file if it is new; returns whether one was published."""
        files = self._versions()
        if not files or files[-1][0] <= self._last:
            return False
        version, path = files[-1]
        self._last = version
        try:
            self.publisher.publish_safetensors(read_weights(path), version=version)
        except (T.TensorFormatError, OSError, ValueError) as exc:
            self.refused += 1
            log.error("weight file %s not published: %s", path.name, exc)
            return False
        self.published += 1
        for _v, old in files[: -self.keep]:
            old.unlink(missing_ok=True)
        return True

    def _run(self) -> None:
        lower_this_thread(self._thread_nice)
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except OSError as exc:  # the directory vanished or is unreadable: keep trying
                log.warning("weight directory %s: %s", self.directory, exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
