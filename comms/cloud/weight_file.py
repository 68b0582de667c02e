"""The learner -> cloud weight handoff: a directory of versions, one copy each side.

A learner that shares a process with the gRPC server competes with it for the GIL and the CPU,
which slows its training steps while versions are pushed. So the learner process only writes
each version into a file and the cloud process publishes it: hashing, deltas and every byte
sent to robots cost the learner nothing.

The directory (a run's ``weights/``; the format this module owns)::

    v00000007.safetensors   one version's weights, safetensors layout (comms.wire.tensors),
                            fsynced
    latest.json             {"version": 7, "file": "v00000007.safetensors"}: the newest
                            version, replaced atomically once the file it names is durable

A learner restarted after a crash reads its newest version back from ``latest.json``
(:func:`latest_version`), so it never reuses a version number; the newest files are kept.

Learner (a ``foundation.contracts.WeightPublisher``)::

    WeightDirectory(run_dir / "weights", keep=5).publish(version, policy.state_dict())

Cloud (once per loop turn, or on its own thread with :meth:`WeightFileFeed.start`)::

    feed = WeightFileFeed(server.distributor(run_id), run_dir / "weights")
    got = feed.poll()   # (version, safetensors bytes) of a newer version, else None
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from comms.cloud.distributor import WeightDistributor
from comms.cloud.priority import lower_this_thread
from comms.wire import tensors as T
from foundation.durable import atomic_write_json, fsync_file, replace_durably

log = logging.getLogger(__name__)

POINTER = "latest.json"
_NAME = re.compile(r"^v(\d+)\.safetensors$")


def weight_file_name(version: int) -> str:
    """``v<version, 8 digits or more>.safetensors``.

    Raises:
        ValueError: a negative version.
    """
    if version < 0:
        raise ValueError(f"version {version} is negative")
    return f"v{version:08d}.safetensors"


def _write_file(path: Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` (name -> torch tensor or numpy array) as a safetensors file, atomically
    and durably: the tensors' buffers go straight into a temporary file beside ``path`` (no
    serialized copy in memory), which is fsynced and renamed over ``path``.

    Raises:
        TypeError: a value is not a tensor or its dtype cannot travel.
        OSError: the file cannot be written (``path`` is then unchanged).
    """
    arrays = {k: T.as_array(v) for k, v in state.items()}
    head, _offsets = T.layout({k: (dt, tuple(a.shape)) for k, (a, dt) in arrays.items()})
    # The layout packs the tensors right after the header in this order: write them so.
    parts = [memoryview(head)] + [
        memoryview(a.reshape(-1).view(np.uint8)) for a, _ in arrays.values()
    ]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb", buffering=0) as f:
            for view in parts:
                while view:  # a raw write may be partial
                    view = view[f.write(view) :]
        fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    replace_durably(tmp, path)


def read_weights(path: Path) -> memoryview:
    """The bytes of a weight file (checked to be a safetensors blob).

    Raises:
        TensorFormatError: the file is not a valid safetensors blob.
        OSError: it cannot be read.
    """
    with path.open("rb", buffering=0) as f:
        view = T.byte_buffer(os.fstat(f.fileno()).st_size)
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise T.TensorFormatError(f"{path} shrank while being read")
            got += n
    T.decode(view)
    return view


def latest_version(directory: Path) -> int:
    """The newest version written to ``directory``; 0 before any."""
    pointer = _pointer(directory)
    return 0 if pointer is None else pointer[0]


def _pointer(directory: Path) -> tuple[int, str] | None:
    """``latest.json``'s (version, file name), None when there is none yet."""
    try:
        meta = json.loads((directory / POINTER).read_text())
    except FileNotFoundError:
        return None
    return int(meta["version"]), str(meta["file"])


class WeightDirectory:
    """The learner's :class:`foundation.contracts.WeightPublisher`: each version becomes a file
    of ``directory`` (see the module docstring), the last ``keep`` of them are kept.

    Args:
        directory: created when missing.
        keep: versions kept on disk (>= 1); older files are removed after each publish.
    """

    def __init__(self, directory: Path | str, keep: int = 3) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = max(1, keep)

    def latest_version(self) -> int:
        return latest_version(self.directory)

    def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        """Write ``weights`` (name -> torch tensor or numpy array) as ``version``, durably,
        then point ``latest.json`` at it.

        Raises:
            ValueError: ``version`` is not above :meth:`latest_version`.
            TypeError: a value is not a tensor or its dtype cannot travel.
        """
        last = self.latest_version()
        if version <= last:
            raise ValueError(f"version {version} is not above the last published ({last})")
        name = weight_file_name(version)
        _write_file(self.directory / name, weights)
        atomic_write_json(self.directory / POINTER, {"version": version, "file": name})
        for _v, old in self._versions()[: -self.keep]:
            old.unlink(missing_ok=True)

    def _versions(self) -> list[tuple[int, Path]]:
        out = []
        for entry in os.scandir(self.directory):
            m = _NAME.match(entry.name)
            if m:
                out.append((int(m.group(1)), Path(entry.path)))
        return sorted(out)


class WeightFileFeed:
    """The cloud side: hands the newest version of a :class:`WeightDirectory` to a run's
    :class:`~comms.cloud.distributor.WeightDistributor`.

    Call :meth:`poll` (the run driver does, once per loop turn) or let :meth:`start` poll on a
    thread. A file that is not valid safetensors is logged and skipped, never published.

    Args:
        after_version: versions up to this one are never read (e.g. a previous learner's,
            when only those of the learner started now may reach the robots).

    Attributes:
        published: versions handed to the distributor; ``refused``: files skipped.
    """

    def __init__(
        self, distributor: WeightDistributor, directory: Path, after_version: int = 0
    ) -> None:
        self.distributor = distributor
        self.directory = directory
        self.published = 0
        self.refused = 0
        self.last_version = after_version  # the newest version read (or skipped)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> tuple[int, memoryview] | None:
        """Read the newest version if it is newer than the last one read, and publish it
        unless the distributor already holds it (one kept across a restart may be ahead).

        Returns:
            (version, its safetensors bytes, owned by the distributor: do not modify), or
            None when there is nothing newer (or its file was just replaced: the next poll
            reads the next one).

        Raises:
            OSError: the directory or the file cannot be read.
        """
        try:
            pointer = _pointer(self.directory)
        except json.JSONDecodeError:  # a pointer that does not parse: read it next poll
            return None
        if pointer is None or pointer[0] <= self.last_version:
            return None
        version, name = pointer
        try:
            blob = read_weights(self.directory / name)
        except FileNotFoundError:  # removed by newer versions meanwhile
            return None
        except T.TensorFormatError as exc:
            self.last_version = version
            self.refused += 1
            log.error("weight file %s not published: %s", name, exc)
            return None
        self.last_version = version
        if version > self.distributor.last_version:
            self.distributor.publish_safetensors(blob, version=version)
            self.published += 1
        return version, blob

    def start(self, poll_s: float = 0.05, thread_nice: int = 10) -> WeightFileFeed:
        """Poll every ``poll_s`` on a thread whose OS priority is lowered by ``thread_nice``
        (reading a version is bulk work, :mod:`comms.cloud.priority`); :meth:`close` stops it."""
        self._thread = threading.Thread(
            target=self._run, args=(poll_s, thread_nice), name="weight-file-feed", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, poll_s: float, thread_nice: int) -> None:
        lower_this_thread(thread_nice)
        while not self._stop.wait(poll_s):
            try:
                self.poll()
            except OSError as exc:  # the directory vanished or is unreadable: keep trying
                log.warning("weight directory %s: %s", self.directory, exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
