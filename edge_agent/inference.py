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


class _Chunks:
    def __init__(self) -> None:
        self.queue: deque[np.ndarray] = deque()

    def load(self, out: np.ndarray, action_dim: int) -> None:
        arr = np.asarray(out, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != action_dim or arr.shape[0] == 0:
            raise ValueError(
                f"policy returned shape {arr.shape}; expected ({action_dim},) or (T, {action_dim})"
            )
        self.queue.extend(arr)


class LocalPolicyRunner:
    """Runs a ``cloud_learner.core.Policy`` here.

    Args:
        policy: has ``act(observation, task_index) -> (A,) | (T, A)``, ``get_weights``,
            ``set_weights``.
        action_dim: A.
        tasks: task names; ``act``'s ``task`` argument is the index in this list.
        version: version of the weights the policy starts with (-1: untrained).
    """

    def __init__(self, policy: Any, action_dim: int, version: int = NO_POLICY) -> None:
        self.policy = policy
        self.action_dim = action_dim
        self._version = version
        self._chunks = _Chunks()
        self._lock = threading.Lock()

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def at_chunk_boundary(self) -> bool:
        return not self._chunks.queue

    def reset(self) -> None:
        self._chunks.queue.clear()

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]:
        if not self._chunks.queue:
            with self._lock:
                out = self.policy.act(observation, task)
            self._chunks.load(np.asarray(out), self.action_dim)
        return self._chunks.queue.popleft(), self._version

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


class RemotePolicyRunner:
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
        self.client = client
        self.action_dim = action_dim
        self.tasks = list(tasks)
        self.deadline_s = deadline_s
        self.hold_keep_dims = list(hold_keep_dims)
        self.last_executed = np.zeros(action_dim, np.float32)
        self._chunks = _Chunks()
        self._version = NO_POLICY
        self._inflight: Future[tuple[np.ndarray, int]] | None = None
        self.holds = 0
        self.late_replies = 0
        self.errors = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def at_chunk_boundary(self) -> bool:
        return not self._chunks.queue

    def reset(self) -> None:
        self._chunks.queue.clear()

    def hold(self) -> np.ndarray:
        out = np.zeros(self.action_dim, np.float32)
        out[self.hold_keep_dims] = self.last_executed[self.hold_keep_dims]
        return out

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]:
        if self._chunks.queue:
            return self._chunks.queue.popleft(), self._version
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
            self._chunks.load(chunk, self.action_dim)
            self._version = version
        except FutureTimeout:
            self._inflight = future
            self.holds += 1
            return self.hold(), NO_POLICY
        except Exception:
            self.errors += 1
            self.holds += 1
            return self.hold(), NO_POLICY
        return self._chunks.queue.popleft(), self._version

    def set_weights(self, version: int, weights: Mapping[str, Any]) -> None:
        """Weights live in the cloud for a remote policy; nothing to apply here."""
