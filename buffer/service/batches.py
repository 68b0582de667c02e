"""The buffer's service beside its table: batches of one buffer for a learner in another
process, over ZeroMQ (Reverb keeps its server next to its table the same way).

:class:`BatchServer` serves one open buffer, drawing every batch with the sampler its run
gave it; :class:`RemoteBuffer` (``buffer.service.batch_client``, importable from here too) asks
it (it implements ``foundation.contracts.TransitionSource``: numpy columns); ``buffer.service.sharded_batches.ShardedRemoteBuffer`` samples across the
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
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from buffer.errors import NothingToSample
from buffer.sampling.samplers import Sampler
from buffer.service.batch_client import RemoteBuffer as RemoteBuffer
from buffer.service.batch_client import RemoteNothingToSample as RemoteNothingToSample
from buffer.service.batch_token import REFUSED, checked_token, token_matches
from buffer.service.payload import tensor_frames
from buffer.service.shm_batches import ShmRefused, SlotWriter, boot_id
from buffer.table.labels import labelled_episodes, recent_policy_episodes
from buffer.table.replay_buffer import ReplayBuffer

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
