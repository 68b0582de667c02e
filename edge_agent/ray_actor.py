"""The edge agent as a Ray actor, for a robot whose computer is also a Ray node.

Runs do not need it (the cloud assigns robot computers over gRPC, ``edge_agent.host``); code
that drives a robot from inside a Ray cluster places the actor on the robot's node with its
custom resource ``robot/<name>`` (``hal.resources``)::

    Actor = edge_agent.ray_actor.remote_class()
    a = Actor.options(resources={f"robot/{name}": 1}).remote(edge, comms, opts)
    ray.get(a.run.remote(episodes=10))

Ray is imported only here, so ``robofleet edge`` on a robot computer never needs it.
"""

from __future__ import annotations

from typing import Any

from edge_agent.build import AgentOptions, BuiltAgent, build_agent
from edge_agent.config import EdgeSettings


class EdgeAgentWorker:
    """Plain class behind the actor: build once, run episodes, report, stop, close."""

    def __init__(self, edge: EdgeSettings | dict[str, Any], comms: Any, opts: AgentOptions) -> None:
        if isinstance(edge, dict):
            edge = EdgeSettings(**edge)
        if comms is None or isinstance(comms, dict):
            from comms.config import CommsSettings

            comms = CommsSettings(**(comms or {}))
        self._built: BuiltAgent = build_agent(edge, comms, opts)

    def run(self, episodes: int | None = None) -> dict[str, float]:
        return self._built.agent.run(episodes=episodes)

    def report(self) -> dict[str, float]:
        return self._built.agent.report()

    def applied_version(self) -> int:
        return self._built.agent.applied_version

    def is_running(self) -> bool:
        """Whether ``run`` has connected the robot and entered its loop (it may be waiting for
        the first policy version, or held by the cloud)."""
        return self._built.agent.state == "running"

    def stop(self) -> None:
        self._built.agent.stop()

    def clear_estop(self, reason: str = "local") -> None:
        """Release a cloud e-stop at the robot (see :mod:`edge_agent.control`)."""
        self._built.agent.clear_estop(reason)

    def close(self) -> dict[str, float]:
        """Stop background services; returns the final report."""
        self._built.agent.uplink.flush()
        report = self._built.agent.report()
        self._built.close()
        return report


def remote_class(**actor_options: Any) -> Any:
    """``ray.remote(EdgeAgentWorker)`` (threaded so ``stop`` reaches a running ``run``)."""
    import ray

    opts = {"max_concurrency": 4, "num_cpus": 0, **actor_options}
    return ray.remote(**opts)(EdgeAgentWorker)
