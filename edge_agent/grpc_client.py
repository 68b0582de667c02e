"""Remote inference through comms' :class:`~comms.robot.client.EdgeClient` as an ``ActClient``.

``EdgeClient.act`` blocks until the reply or its gRPC deadline; the control loop needs a future
it can wait on for much less (its step deadline), so calls run on one worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from comms.robot.client import EdgeClient


class EdgeActClient:
    """``request(observation, task) -> Future[(chunk (T, A) float32, policy_version)]``.

    Args:
        client: the robot's comms client.
        run_id: the run whose policy answers.
        timeout_s: gRPC deadline of one call (default: comms' ``act_timeout_s``).
    """

    def __init__(self, client: EdgeClient, run_id: str, timeout_s: float | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edge-act")

    def _call(self, observation: Mapping[str, Any], task: str) -> tuple[np.ndarray, int]:
        obs = {k: np.asarray(v) for k, v in observation.items() if k.startswith("observation.")}
        chunk, version = self.client.act(self.run_id, obs, task, self.timeout_s)
        arr = np.asarray(chunk, dtype=np.float32)
        return (arr[None, :] if arr.ndim == 1 else arr), version

    def request(self, observation: Mapping[str, Any], task: str) -> Future[tuple[np.ndarray, int]]:
        return self._pool.submit(self._call, dict(observation), task)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
