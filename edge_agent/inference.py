"""Policy runners: the novice on the robot (local) or in the cloud (remote, with a deadline).

Both execute action chunks one action per control step; a new chunk is requested only when the
current one is used up (a *chunk boundary*, where a weight swap is allowed).

The remote runner never lets the network stall the loop: a step waits at most
``deadline_s`` for the cloud's chunk; when that passes it returns the **safe hold** (zeros,
except ``hold_keep_dims`` which repeat the last executed action) with ``policy_version = -1``
("no policy produced this action"). A reply that arrives after its step's deadline is stale and
dropped (counted in ``late_replies``); only one call is in flight at a time, and once it
has ended the next step asks again with a fresh observation.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

import numpy as np

from edge_agent.core import Observation

NO_POLICY = -1


class ActClient(Protocol):
    """Remote inference: ``request`` returns a future of ``(chunk (T, A) float32, version)``."""

    def request(
        self, observation: Mapping[str, Any], task: str
    ) -> Future[tuple[np.ndarray, int]]: ...


class _ChunkRunner:
    """What both runners share: the action chunk being executed (one action per step) and the
    policy version that produced it; a new chunk is loaded only at a chunk boundary."""

    def __init__(self, action_dim: int, version: int = NO_POLICY) -> None:
        self.action_dim = action_dim
        self._version = version
        self._queue: deque[np.ndarray] = deque()

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def at_chunk_boundary(self) -> bool:
        return not self._queue

    def reset(self) -> None:
        """Drop the rest of the chunk (a new episode starts with a new chunk)."""
        self._queue.clear()

    def _load(self, out: np.ndarray) -> None:
        """Queue ``out``, ``(A,)`` or ``(T, A)``. Raises ValueError on any other shape."""
        arr = np.asarray(out, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.action_dim or arr.shape[0] == 0:
            raise ValueError(
                f"policy returned shape {arr.shape}; "
                f"expected ({self.action_dim},) or (T, {self.action_dim})"
            )
        self._queue.extend(arr)

    def _next(self) -> tuple[np.ndarray, int]:
        return self._queue.popleft(), self._version


class LocalPolicyRunner(_ChunkRunner):
    """Runs a ``cloud_learner.core.Policy`` here.

    Args:
        policy: has ``act(observation, task_index) -> (A,) | (T, A)``, ``get_weights``,
            ``set_weights``.
        action_dim: A.
        tasks: task names; ``act``'s ``task`` argument is the index in this list.
        version: version of the weights the policy starts with (-1: untrained).
    """

    def __init__(self, policy: Any, action_dim: int, version: int = NO_POLICY) -> None:
        super().__init__(action_dim, version)
        self.policy = policy
        self._lock = threading.Lock()

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]:
        if self.at_chunk_boundary:
            with self._lock:
                out = self.policy.act(observation, task)
            self._load(np.asarray(out))
        return self._next()

    def set_weights(self, version: int, weights: Mapping[str, Any]) -> None:
        """Swap to ``version`` all-or-nothing: on any error the previous weights stay.

        Raises:
            ValueError: the weights do not fit the policy (names, shapes); nothing changed.
        """
        with self._lock:
            before = {k: v.clone() for k, v in self.policy.get_weights().items()}
            try:
                self.policy.set_weights(_as_torch(weights))
            except Exception as exc:
                self.policy.set_weights(before)
                raise ValueError(
                    f"weights of version {version} do not fit the policy: {exc}"
                ) from exc
            self._version = version


def _as_torch(weights: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    return {
        k: v if isinstance(v, torch.Tensor) else torch.as_tensor(np.array(v))
        for k, v in weights.items()
    }


class RemotePolicyRunner(_ChunkRunner):
    """Asks the cloud's Act service for action chunks, with a per-step deadline.

    Args:
        client: an :class:`ActClient` (``GrpcActClient`` in production).
        action_dim: A.
        tasks: task names (``act``'s index -> the name sent to the cloud).
        deadline_s: longest one step waits for a chunk.
        hold_keep_dims: dims of the safe hold that repeat the last executed action.
    """

    def __init__(
        self,
        client: ActClient,
        action_dim: int,
        tasks: Sequence[str],
        deadline_s: float,
        hold_keep_dims: Sequence[int] = (),
    ) -> None:
        bad = [d for d in hold_keep_dims if not 0 <= d < action_dim]
        if bad:
            raise ValueError(f"hold_keep_dims {bad} outside an action of {action_dim} dims")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        super().__init__(action_dim)
        self.client = client
        self.tasks = list(tasks)
        self.deadline_s = deadline_s
        self.hold_keep_dims = list(hold_keep_dims)
        self.last_executed = np.zeros(action_dim, np.float32)
        self._inflight: Future[tuple[np.ndarray, int]] | None = None
        self.holds = 0
        self.late_replies = 0
        self.errors = 0

    def hold(self) -> np.ndarray:
        out = np.zeros(self.action_dim, np.float32)
        out[self.hold_keep_dims] = self.last_executed[self.hold_keep_dims]
        return out

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]:
        if not self.at_chunk_boundary:
            return self._next()
        if self._inflight is not None:
            # One call at a time: a call that missed its deadline is still running; hold until
            # it ends rather than piling requests onto a slow link. Its reply is stale.
            if not self._inflight.done():
                self.holds += 1
                return self.hold(), NO_POLICY
            self.late_replies += 1
            self._inflight = None
        name = self.tasks[task] if 0 <= task < len(self.tasks) else str(task)
        future = self.client.request(observation, name)
        try:
            chunk, version = future.result(timeout=self.deadline_s)
            self._load(chunk)
            self._version = version
        except FutureTimeout:
            self._inflight = future
            self.holds += 1
            return self.hold(), NO_POLICY
        except Exception:
            self.errors += 1
            self.holds += 1
            return self.hold(), NO_POLICY
        return self._next()

    def set_weights(self, version: int, weights: Mapping[str, Any]) -> None:
        """Weights live in the cloud for a remote policy; nothing to apply here."""
