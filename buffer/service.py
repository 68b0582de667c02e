"""The buffer's service beside its table: batches of one buffer for a learner in another
process, over ZeroMQ (Reverb keeps its server next to its table the same way).

The replay buffer is opened for writing by exactly one process (the cloud, where uploads land).
The learner runs in its own supervised process so it can crash and restart without touching
acknowledged data; it asks the buffer's :class:`BatchServer` for batches through a
:class:`RemoteBuffer`, which implements ``robofleet.contracts.TransitionSource`` (numpy
columns; the learner converts them to tensors, ``cloud_learner.sources``).

Wire (REQ/REP on loopback): the request is one JSON frame
``{"op": "sample" | "size" | "sampler_state" | "load_sampler_state", ...}``; the reply is a JSON
frame and, for ``sample``, a second frame with the batch in the safetensors layout (raw
tensors plus a JSON header, never pickle). ``sample`` and ``size`` replies carry ``size`` (rows
in the buffer) and ``online`` (rows from robots, i.e. without the offline/demonstration rows
the run mounted: the learner's update-to-data ratio counts these); a ``sample`` reply for an
empty buffer carries ``empty: true`` and no batch. A ``sample`` or ``size`` request may carry
the learner's latest statistics (``stats``), which the run driver shows and stores as metrics;
a ``sample`` request may name the ``sampling`` its algorithm needs (absent: the server's own
sampler):

* ``{"kind": "intervention"}``: the server's sampler (HG-DAgger: operator-labelled steps);
* ``{"kind": "uniform"}``: every step alike (RECAP);
* ``{"kind": "symmetric", "online_fraction": 0.5}``: RLPD's symmetric sampling (Ball et al.
  2023) with HIL-SERL's prior data: ``1 - online_fraction`` of each batch from operator steps
  (demonstrations and takeovers, ``is_intervention``), the rest from autonomous steps
  (:class:`buffer.samplers.MixSampler` with ``prior="interventions"``).

Batch keys (B = batch size, D / A the state / action sizes): ``observation.state`` (B, D)
float32, ``next.observation.state`` (B, D) float32, ``action`` (B, A) float32, ``task_index``
(B,) int64 (position in the run's task list), ``is_intervention`` (B,) bool, ``reward`` (B,)
float32, ``terminated`` / ``truncated`` (B,) bool, ``episode_index`` / ``frame_index`` (B,)
int64, ``is_demonstration`` (B,) bool (a step of one of the server's
``demonstration_robots``) and ``success`` (B,) bool: the episode ended with the task solved at
this step. Robots of sparse-return runs end episodes at success (``terminated``); a
demonstration episode is an expert's and counts as a success where it ends (``truncated``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import zmq
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from buffer.replay_buffer import ReplayBuffer
from buffer.samplers import MixSampler, Sampler

log = logging.getLogger(__name__)

KEYS = (
    "observation.state",
    "next.observation.state",
    "action",
    "is_intervention",
    "reward",
    "terminated",
    "truncated",
    "episode_index",
    "frame_index",
)
SAMPLING_KINDS = ("intervention", "uniform", "symmetric")


class BatchServer:
    """Serves samples of one run's buffer to its learner (a daemon thread in the cloud).

    Args:
        buffer: the run's open buffer.
        tasks: the run's task list (``task_index`` = position).
        sampler: a ``buffer`` sampler (e.g. ``InterventionSampler()``), None for uniform;
            used for requests without ``sampling`` or with kind ``intervention``.
        offline_rows: rows of the buffer that are not robots' online steps (demonstrations,
            mounted data); ``online`` in replies is ``len(buffer) - offline_rows``.
        demonstration_robots: ``robot_id`` s whose steps are demonstrations (the batch's
            ``is_demonstration``, and their episodes' ends count as successes).

    ``requests`` counts every request answered: the run's hang watchdog reads it, so a learner
    that waits for data (its update-to-data ratio reached) and polls ``size`` is alive.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        tasks: Sequence[str],
        sampler: Sampler | None = None,
        offline_rows: int = 0,
        demonstration_robots: Iterable[str] = (),
    ) -> None:
        self.buffer = buffer
        self.offline_rows = offline_rows
        self.requests = 0
        self.tasks = {t: i for i, t in enumerate(tasks)}
        self.demonstration_robots = frozenset(str(r) for r in demonstration_robots)
        self.sampler = sampler
        self._samplers: dict[tuple[str, float], Sampler | None] = {}
        self.learner_stats: dict[str, float] = {}
        self.samples = 0
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="batch-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            request = self._sock.recv()
            self.requests += 1
            try:
                header, payload = self._handle(json.loads(request))
            except Exception as exc:  # the learner gets the reason; the server keeps serving
                header, payload = {"error": f"{type(exc).__name__}: {exc}"}, None
            frames = [json.dumps(header).encode()]
            if payload is not None:
                frames.append(payload)
            self._sock.send_multipart(frames)

    def sampler_for(self, sampling: Mapping[str, Any] | None) -> Sampler | None:
        """The buffer sampler a request's ``sampling`` names (see the module docstring).

        Raises:
            ValueError: an unknown kind or a bad ``online_fraction``, named.
        """
        if not sampling:
            return self.sampler
        kind = sampling.get("kind")
        if kind not in SAMPLING_KINDS:
            raise ValueError(f"sampling kind {kind!r} is unknown (known: {SAMPLING_KINDS})")
        if kind == "intervention":
            return self.sampler
        fraction = float(sampling.get("online_fraction", 0.5))
        key = (str(kind), fraction)
        if key not in self._samplers:
            self._samplers[key] = (
                None if kind == "uniform" else MixSampler(fraction, prior="interventions")
            )
        return self._samplers[key]

    def _handle(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], bytes | None]:
        op = req.get("op")
        stats = req.get("stats")
        if op in ("size", "sample") and isinstance(stats, dict):
            self.learner_stats = {str(k): float(v) for k, v in stats.items()}
        if op == "size":
            return self._sizes(), None
        sampler = self.sampler_for(req.get("sampling"))
        if op == "sampler_state":
            get = getattr(sampler, "state_dict", None)
            return {"state": dict(get()) if callable(get) else {}}, None
        if op == "load_sampler_state":
            load = getattr(sampler, "load_state_dict", None)
            if callable(load) and req.get("state"):
                load(dict(req["state"]))
            return {}, None
        if op == "sample":
            n = int(req["batch_size"])
            if len(self.buffer) == 0:
                return {"empty": True, **self._sizes()}, None
            arrays = self.buffer.sample(n, sampler=sampler, timeout=1.0)
            return self._sizes(), st_save(self._batch(arrays))
        raise ValueError(f"unknown op {op!r}")

    def _sizes(self) -> dict[str, int]:
        size = len(self.buffer)
        return {"size": size, "online": max(0, size - self.offline_rows)}

    def _batch(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: np.ascontiguousarray(arrays[k]) for k in KEYS if k in arrays}
        unknown = sorted({str(t) for t in arrays["task"]} - set(self.tasks))
        if unknown:
            raise ValueError(f"sampled tasks {unknown} are not in the run's tasks")
        out["task_index"] = np.array([self.tasks[str(t)] for t in arrays["task"]], np.int64)
        demo = np.array([str(r) in self.demonstration_robots for r in arrays["robot_id"]], bool)
        out["is_demonstration"] = demo
        out["success"] = np.asarray(arrays["terminated"], bool) | (
            demo & np.asarray(arrays["truncated"], bool)
        )
        self.samples += len(out["task_index"])
        return out


class RemoteBuffer:
    """A :class:`BatchServer`'s buffer, seen from another process: a
    ``robofleet.contracts.TransitionSource``.

    Args:
        address: the server's ``tcp://`` address.
        timeout_s: longest wait for one reply.
        sampling: the server-side sampling to ask for (module docstring); None = the
            server's own sampler.

    ``stats`` (name -> float) travels with the next ``sample`` or ``size`` request.

    Raises (from every request): ``RuntimeError`` with the server's reason, or
    ``TimeoutError`` when the server does not answer within ``timeout_s`` (the cloud is gone).
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.sampling = dict(sampling) if sampling else None
        self.timeout_ms = int(timeout_s * 1000)
        self.stats: dict[str, float] = {}
        self._size = 0
        self._online = 0
        self._size_at = float("-inf")
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
        sock.connect(self.address)
        return sock

    def _call(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], bytes | None]:
        try:
            self._sock.send(json.dumps(req).encode())
            frames = self._sock.recv_multipart()
        except zmq.Again:
            self._sock.close(0)
            self._sock = self._connect()  # a REQ socket that missed a reply is unusable
            raise TimeoutError(f"batch server {self.address} did not answer") from None
        header = json.loads(frames[0])
        if "error" in header:
            raise RuntimeError(f"batch server: {header['error']}")
        return header, (frames[1] if len(frames) > 1 else None)

    def num_transitions(self) -> int:
        """Transitions in the buffer's window, at most 1 s old (every sample refreshes it)."""
        if time.monotonic() - self._size_at > 1.0:
            header, _ = self._call({"op": "size", "stats": self.stats})
            self._note_sizes(header)
        return self._size

    def online_transitions(self) -> int:
        """Rows from robots (the buffer without its offline rows), at most 1 s old; asking
        also hands the server the learner's latest ``stats``."""
        self.num_transitions()
        return self._online

    def _note_sizes(self, header: Mapping[str, Any]) -> None:
        self._size = int(header.get("size", 0))
        self._online = int(header.get("online", self._size))
        self._size_at = time.monotonic()

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` rows with the keys of the module docstring; waits (polling every
        0.1 s) while the buffer is empty."""
        while True:
            header, payload = self._call(
                {
                    "op": "sample",
                    "batch_size": batch_size,
                    "stats": self.stats,
                    "sampling": self.sampling,
                }
            )
            self._note_sizes(header)
            if payload is not None:
                return dict(st_load(payload))
            time.sleep(0.1)

    def sampler_state(self) -> dict[str, Any]:
        """``{"sampler": the server sampler's state_dict}`` (for the learner's checkpoint)."""
        header, _ = self._call({"op": "sampler_state", "sampling": self.sampling})
        return {"sampler": header["state"]}

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        self._call(
            {
                "op": "load_sampler_state",
                "state": state.get("sampler") or {},
                "sampling": self.sampling,
            }
        )

    def close(self) -> None:
        self._sock.close(0)
