"""The buffer's service beside its table: batches of one buffer for a learner in another
process, over ZeroMQ (Reverb keeps its server next to its table the same way).

:class:`BatchServer` serves one open buffer, drawing every batch with the sampler its run
gave it; :class:`RemoteBuffer` asks it (it implements ``foundation.contracts.TransitionSource``:
numpy columns); ``buffer.service.sharded_batches.ShardedRemoteBuffer`` samples across the
servers of a buffer's shards. Requests are one JSON frame carrying the run's batch token
(``buffer.service.batch_token``: a request without it is refused unread) and an ``op``
(``sample``, ``size``, ``sampler_state``, ``load_sampler_state``, ``demonstrations``,
``labelled_episodes``, ``policy_episodes``); a
``sample`` reply carries the batch in the safetensors layout (never pickle) in frames that
neither side copies (``buffer.service.payload``), or, when the request names a slot of the
learner's shared memory on the same machine, a header alone after the batch was written there
(``buffer.service.shm_batches``); a
``labelled_episodes`` reply the observations the steps of the episodes people labelled reached
(``buffer.table.labels``), a ``policy_episodes`` reply the observations and intervention flags
of the latest episodes a policy acted in (a help probe's training data). The wire, the layout of a row, the adaptive mix and the
batch keys: docs/buffer.md ("The batch service").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from buffer.errors import NothingToSample
from buffer.sampling.samplers import Sampler
from buffer.service.batch_token import (
    REFUSED,
    TOKEN_FIELD,
    BatchRefused,
    checked_token,
    token_matches,
)
from buffer.service.payload import arrays_in_place, tensor_frames
from buffer.service.shm_batches import BatchSlots, ShmRefused, Slot, SlotWriter, boot_id
from buffer.table.labels import labelled_episodes, recent_policy_episodes
from buffer.table.replay_buffer import ReplayBuffer

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
# ``policy_version`` of a demonstration episode's steps (edge_agent.core.DEMONSTRATION: an
# operator drove the robot, no policy was consulted).
DEMONSTRATION = 0
IMAGE_PREFIX = "observation.images."
NEXT_PREFIX = "next."
_REFUSAL = json.dumps({"error": REFUSED, "refused": True}).encode()


@dataclass(frozen=True)
class MixConfig:
    """How much of each batch is online when offline data is mounted.

    Attributes:
        online_fraction: the online share (every task's start under ``adaptive``).
        adaptive: SOP's per-task share from the learner's reported losses (module docstring).
        min_online / max_online: the range an adaptive share is clipped to.
    """

    online_fraction: float = 0.5
    adaptive: bool = False
    min_online: float = 0.2
    max_online: float = 0.8

    def share(self, online_loss: float, offline_loss: float) -> float:
        """One task's adaptive online share from its window's mean losses."""
        total = online_loss + offline_loss
        raw = online_loss / total if total > 0 else self.online_fraction
        return float(min(max(raw, self.min_online), self.max_online))


class BatchServer:
    """Serves samples of one run's buffer to its learner (a daemon thread in the cloud).

    Args:
        buffer: the run's open buffer (or one shard of it: ``buffer.service.shards``).
        tasks: the run's task list (``task_index`` = position).
        sampler: the ``buffer`` sampler of every batch (e.g. ``InterventionSampler()``), None
            for uniform.
        offline_rows: rows of the buffer that are not robots' online steps (demonstrations,
            mounted data); ``online`` in replies is ``len(buffer) - offline_rows``.
        demonstration_robots: ``robot_id`` s whose steps are demonstrations (the batch's
            ``is_demonstration``, and their episodes' ends count as successes).
        mix: the online share when offline data is mounted (fixed or adaptive).
        mix_shares: the per-task online shares it keeps up to date under an adaptive mix
            (the mapping ``sampler`` was built with); a new one when None.
        host: the interface to listen on: loopback for a learner on this machine; a shard on
            another node (``buffer.service.shard_actor``) listens where its learner can reach it.
        port: the port to listen on (a restarted shard's own); 0: any free one.
        token: the batch token every request must carry (``batch_token.new_token()``, made
            by whoever starts the server and handed to its clients out of band).

    Raises:
        zmq.ZMQError: ``port`` is taken.
        ValueError: ``token`` is empty or not ASCII.

    ``requests`` counts every request answered: the run's hang watchdog reads it, so a learner
    that waits for data (its update-to-data ratio reached) and polls ``size`` is alive.
    ``refused`` counts requests refused for a wrong or missing token (never executed, and
    not progress for the watchdog).
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        tasks: Sequence[str],
        sampler: Sampler | None = None,
        offline_rows: int = 0,
        demonstration_robots: Iterable[str] = (),
        mix: MixConfig | None = None,
        host: str = "127.0.0.1",
        mix_shares: dict[str, float] | None = None,
        port: int = 0,
        *,
        token: str,
    ) -> None:
        self.token = checked_token(token)
        self.buffer = buffer
        self.offline_rows = offline_rows
        self.mix = mix or MixConfig()
        # Per-task online shares (adaptive); the sampler reads this one mapping.
        self.mix_shares: dict[str, float] = {} if mix_shares is None else mix_shares
        self.requests = 0
        self.refused = 0
        self.tasks = {t: i for i, t in enumerate(tasks)}
        self.demonstration_robots = frozenset(str(r) for r in demonstration_robots)
        self.sampler = sampler
        self.learner_stats: dict[str, float] = {}
        self.samples = 0
        self.boot_id = boot_id()
        self._slots = SlotWriter()
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            try:
                self._sock.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError:
                self._sock.close(0)
                raise
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.port = port
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="batch-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._slots.close()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            request = self._request()
            if not token_matches(request, self.token):
                self.refused += 1
                self._sock.send(_REFUSAL)
                continue
            self.requests += 1
            frames: list[bytes | np.ndarray]
            try:
                header, payload = self._handle(request)
                frames = [] if payload is None else tensor_frames(payload)
            except Exception as exc:  # the learner gets the reason; the server keeps serving
                header, frames = {"error": f"{type(exc).__name__}: {exc}"}, []
                if isinstance(exc, NothingToSample):
                    header["nothing_to_sample"] = True
            # The tensors go to ZeroMQ as they are (``buffer.service.payload``): no copy.
            self._sock.send_multipart([json.dumps(header).encode(), *frames], copy=False)

    def _request(self) -> Any:
        """The next request decoded (None when it is not JSON: refused as tokenless)."""
        try:
            return json.loads(self._sock.recv())
        except ValueError:
            return None

    def _note_losses(self, stats: Mapping[str, float]) -> None:
        """SOP's adaptive shares from the learner's per-task window losses."""
        if not (self.mix.adaptive and self.buffer.offline):
            return
        for key, online in stats.items():
            if key.startswith("loss_online/"):
                task = key.removeprefix("loss_online/")
                offline = stats.get(f"loss_offline/{task}")
                if offline is not None and task in self.tasks:
                    self.mix_shares[task] = self.mix.share(float(online), float(offline))

    def _handle(
        self, req: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """The reply to ``req``: its header and its tensors (None: a header alone)."""
        op = req.get("op")
        stats = req.get("stats")
        if op in ("size", "sample") and isinstance(stats, dict):
            self.learner_stats = {str(k): float(v) for k, v in stats.items()}
            self._note_losses(self.learner_stats)
        if op == "size":
            return self._sizes(), None
        if op == "demonstrations":
            return {"episodes": self.demonstration_episodes(), **self._sizes()}, None
        if op == "labelled_episodes":
            return self.labelled_episodes()
        if op == "policy_episodes":
            return self.policy_episodes(int(req.get("limit", 100)))
        sampler = self.sampler
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
            if self._sizes()["size"] == 0:
                return {"empty": True, **self._sizes()}, None
            how = req.get("layout") or {}
            chunk = int(how.get("chunk", 1))
            if chunk > 1:
                arrays = self.buffer.sample_chunks(n, chunk, sampler=sampler, timeout=1.0)
            else:
                arrays = self.buffer.sample(n, sampler=sampler, timeout=1.0)
            images = self._images(how)
            batch = self._batch(arrays, images)
            header: dict[str, Any] = {**self._sizes(), "boot_id": self.boot_id}
            into = req.get("into")
            if isinstance(into, dict):
                try:
                    header["into"] = self._slots.write(into, batch)
                    return header, None
                except ShmRefused as exc:  # the batch goes as frames; the learner learns why
                    header["shm_refused"] = str(exc)
                    header["shm_layout"] = exc.layout
            return header, batch
        raise ValueError(f"unknown op {op!r}")

    def _images(self, how: Mapping[str, Any]) -> list[str]:
        """The frame keys a request asks for (named when the buffer has no such camera)."""
        cams = [str(k) for k in how.get("images") or []]
        unknown = [k for k in cams if k not in self.buffer.schema.observations]
        if unknown:
            raise ValueError(f"the buffer has no camera {unknown}")
        return cams + ([NEXT_PREFIX + k for k in cams] if how.get("next_images") else [])

    def _sizes(self) -> dict[str, int]:
        """``size``: rows to sample (the window and the mounted views); ``online``: the
        robots' own rows (the window without its demonstrations: ``offline_rows`` and the
        steps of demonstration episodes, ``policy_version`` 0)."""
        window = len(self.buffer)
        mounted = sum(len(v) for v in self.buffer.offline)
        demos = self._demonstration_rows()
        online = max(0, window - self.offline_rows - int(demos.sum()))
        return {"size": window + mounted, "online": online}

    def _window(self) -> tuple[slice, dict[str, np.ndarray]]:
        """The window's index positions and the columns they index, taken together (the
        index's base moves when it drops rows retention deleted)."""
        with self.buffer.state.lock:
            lo, hi = self.buffer.window()
            base, cols = self.buffer.index.frame()
        return slice(lo - base, hi - base), cols

    def _demonstration_rows(
        self, window: tuple[slice, dict[str, np.ndarray]] | None = None
    ) -> np.ndarray:
        """Mask over the window's index positions (``window``: :meth:`_window`, taken now
        by default): eligible steps of demonstration episodes (an operator drove them, no
        policy: ``policy_version`` == 0)."""
        seg, cols = window or self._window()
        mask: np.ndarray = (cols["policy_version"][seg] == DEMONSTRATION) & cols["eligible"][seg]
        return mask

    def demonstration_episodes(self) -> dict[str, int]:
        """Completed demonstration episodes in the window, per task (their done steps)."""
        seg, cols = window = self._window()
        done = self._demonstration_rows(window) & (cols["terminated"][seg] | cols["truncated"][seg])
        codes, counts = np.unique(cols["task"][seg][done], return_counts=True)
        names = self.buffer.index.tasks.names
        return {names[int(c)]: int(n) for c, n in zip(codes, counts, strict=True)}

    def labelled_episodes(self) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """The reply to ``labelled_episodes``: a header listing the episodes (``episodes``:
        key, verdict, who gave it, ``task_index``, ``steps``) and, when there are any, the
        arrays of their steps concatenated in that order: ``next.observation.*`` (the
        observation each step reached) and ``frame_index``."""
        found = [e for e in labelled_episodes(self.buffer) if e.task in self.tasks]
        episodes = [
            {
                "run_id": e.key[0],
                "robot_id": e.key[1],
                "episode_index": e.key[2],
                "verdict": e.verdict,
                "reason": e.reason,
                "task_index": self.tasks[e.task],
                "steps": len(e.rows),
            }
            for e in found
        ]
        if not found:
            return {"episodes": []}, None
        rows = np.concatenate([e.rows for e in found])
        arrays = self.buffer.read_transitions(rows, count=False)
        keys = [NEXT_PREFIX + k for k in self.buffer.schema.observations]
        out = {k: np.ascontiguousarray(arrays[k]) for k in (*keys, "frame_index")}
        return {"episodes": episodes}, out

    def policy_episodes(self, limit: int) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """The reply to ``policy_episodes``: the latest ``limit`` ended episodes a policy
        acted in (``buffer.table.labels.recent_policy_episodes``): a header listing them
        (key, ``failed``, ``task_index``, ``steps``) and the arrays of their steps
        concatenated in that order: ``observation.*`` (what each step acted on) and
        ``is_intervention``."""
        found = [e for e in recent_policy_episodes(self.buffer, limit) if e.task in self.tasks]
        episodes = [
            {
                "run_id": e.key[0],
                "robot_id": e.key[1],
                "episode_index": e.key[2],
                "failed": e.failed,
                "task_index": self.tasks[e.task],
                "steps": len(e.rows),
            }
            for e in found
        ]
        if not found:
            return {"episodes": []}, None
        arrays = self.buffer.read_transitions(np.concatenate([e.rows for e in found]), count=False)
        keys = [*self.buffer.schema.observations, "is_intervention"]
        return {"episodes": episodes}, {k: np.ascontiguousarray(arrays[k]) for k in keys}

    def _batch(
        self, arrays: Mapping[str, np.ndarray], images: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        keys = (*KEYS, *images, "action_chunk", "action_chunk_is_pad")
        out = {k: np.ascontiguousarray(arrays[k]) for k in keys if k in arrays}
        unknown = sorted({str(t) for t in arrays["task"]} - set(self.tasks))
        if unknown:
            raise ValueError(f"sampled tasks {unknown} are not in the run's tasks")
        out["task_index"] = np.array([self.tasks[str(t)] for t in arrays["task"]], np.int64)
        offline = np.asarray(arrays["source"]) != 0
        demo = (
            offline
            | (np.asarray(arrays["policy_version"]) == DEMONSTRATION)
            | np.array([str(r) in self.demonstration_robots for r in arrays["robot_id"]], bool)
        )
        out["is_demonstration"] = demo
        out["is_offline"] = offline
        out["success"] = np.asarray(arrays["terminated"], bool) | (
            demo & np.asarray(arrays["truncated"], bool)
        )
        self.samples += len(out["task_index"])
        return out


class RemoteNothingToSample(RuntimeError):
    """The server's sampler found no transition to draw (``buffer.errors.NothingToSample``
    there); a ``RuntimeError`` like every server-side refusal."""


class RemoteBuffer:
    """A :class:`BatchServer`'s buffer, seen from another process: a
    ``foundation.contracts.TransitionSource``.

    Args:
        address: the server's ``tcp://`` address.
        timeout_s: longest wait for one reply.
        layout: what each row carries (``images``, ``next_images``, ``chunk``: module
            docstring); None = the state columns alone.
        shared_memory: take batches through shared memory when the server reports this
            machine's boot id (``buffer.service.shm_batches``); False: always as frames.
        token: the server's batch token (every request carries it).

    ``slots``: the shared-memory slots its batches go into (its own unless a
    ``ShardedRemoteBuffer`` shares one set among its shards). ``stats`` (name -> float) travels with the next ``sample`` or ``size`` request.

    Raises (from every request): ``RuntimeError`` with the server's reason
    (``batch_token.BatchRefused`` when it refused the token), or ``TimeoutError`` when the
    server does not answer within ``timeout_s`` (the cloud is gone); the constructor
    ``ValueError`` for an empty or non-ASCII ``token``.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        layout: Mapping[str, Any] | None = None,
        shared_memory: bool = True,
        *,
        token: str,
    ) -> None:
        self.address = address
        self._token = checked_token(token)
        self.layout = dict(layout) if layout else None
        self.shared_memory = shared_memory
        self.slots: BatchSlots | None = None
        self._own_slots = False
        self._shm: bool | None = None  # None: not known until the server's first batch
        self._asked: tuple[Slot, int] | None = None
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

    def _call(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], list[memoryview] | None]:
        try:
            self._sock.send(json.dumps({**req, TOKEN_FIELD: self._token}).encode())
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not answer") from None
        return self._receive()

    def _receive(self) -> tuple[dict[str, Any], list[memoryview] | None]:
        """The reply's header and its payload frames' memory, received in place: a camera
        batch's tensors are read where ZeroMQ put them (``buffer.service.payload``)."""
        try:
            frames = self._sock.recv_multipart(copy=False)
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not answer") from None
        header = json.loads(frames[0].bytes)
        if header.get("refused"):
            raise BatchRefused(f"batch server {self.address}: {header['error']}")
        if header.get("nothing_to_sample"):
            raise RemoteNothingToSample(f"batch server: {header['error']}")
        if "error" in header:
            raise RuntimeError(f"batch server: {header['error']}")
        return header, ([f.buffer for f in frames[1:]] if len(frames) > 1 else None)

    def demonstrations(self) -> dict[str, int]:
        """Completed demonstration episodes per task in the run's buffer (now)."""
        header, _ = self._call({"op": "demonstrations", "stats": self.stats})
        self._note_sizes(header)
        return {str(k): int(v) for k, v in dict(header.get("episodes", {})).items()}

    def labelled_episodes(self) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """(episodes, arrays): the episodes people labelled and their steps concatenated
        (:meth:`BatchServer.labelled_episodes`)."""
        header, payload = self._call({"op": "labelled_episodes"})
        arrays = arrays_in_place(payload) if payload is not None else {}
        return list(header.get("episodes", [])), arrays

    def policy_episodes(
        self, limit: int = 100
    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
        """(episodes, arrays): the latest ended episodes a policy acted in and their steps
        concatenated (:meth:`BatchServer.policy_episodes`)."""
        header, payload = self._call({"op": "policy_episodes", "limit": int(limit)})
        arrays = arrays_in_place(payload) if payload is not None else {}
        return list(header.get("episodes", [])), arrays

    def _reconnect(self) -> None:
        self._sock.close(0)
        self._sock = self._connect()  # a REQ socket that missed a reply is unusable

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
            self.ask_sample(batch_size)
            batch = self.take_sample()
            if batch is not None:
                return batch
            time.sleep(0.1)

    @property
    def shm_usable(self) -> bool:
        """The server shares this machine's ``/dev/shm`` (as far as its replies tell)."""
        return bool(self._shm)

    def ask_sample(self, batch_size: int, into: tuple[Slot, int] | None = None) -> None:
        """Send a ``sample`` request; :meth:`take_sample` receives its reply (so a caller can
        have several servers draw at once: ``ShardedRemoteBuffer``). ``into``: the slot and
        row the batch is written to (by default, this client's own free slot, once the
        server is known to share the machine)."""
        req: dict[str, Any] = {
            "op": "sample",
            "batch_size": batch_size,
            "stats": self.stats,
            "layout": self.layout,
            TOKEN_FIELD: self._token,
        }
        if into is None and self.shm_usable and self._own_slots and self.slots is not None:
            slot = self.slots.take(batch_size)
            into = None if slot is None else (slot, 0)
        self._asked = into
        if into is not None:
            req["into"] = into[0].spec(into[1])
        try:
            self._sock.send(json.dumps(req).encode())
        except zmq.Again:
            self._reconnect()
            raise TimeoutError(f"batch server {self.address} did not take the request") from None

    def take_sample(self) -> dict[str, np.ndarray] | None:
        """The reply to :meth:`ask_sample`: the batch, or None when the buffer was empty (a
        batch in a slot: arrays over the slot's rows)."""
        asked, self._asked = self._asked, None
        header, payload = self._receive()
        self._note_sizes(header)
        if self._shm is None and "boot_id" in header:
            self._shm = (
                self.shared_memory and bool(header["boot_id"]) and (header["boot_id"] == boot_id())
            )
            if self._shm and self.slots is None:
                self.slots, self._own_slots = BatchSlots(), True
        if "into" in header and asked is not None:
            slot, row0 = asked
            return slot.arrays(row0, row0 + int(header["into"]))
        if "shm_refused" in header and not header.get("shm_layout"):
            log.warning(
                "batch server %s cannot write into this learner's shared memory (%s): "
                "batches come over the socket",
                self.address,
                header["shm_refused"],
            )
            self._shm = False
        if payload is None:
            return None
        batch = arrays_in_place(payload)
        if self.slots is not None:
            self.slots.learn(batch)
        return batch

    def sampler_state(self) -> dict[str, Any]:
        """``{"sampler": the server sampler's state_dict}`` (for the learner's checkpoint)."""
        header, _ = self._call({"op": "sampler_state"})
        return {"sampler": header["state"]}

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        self._call({"op": "load_sampler_state", "state": state.get("sampler") or {}})

    def close(self) -> None:
        self._sock.close(0)
        if self._own_slots and self.slots is not None:
            self.slots.close()
