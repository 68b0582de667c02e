"""A robot computer behind a site relay (``edge.relay``): which traffic takes the relay.

With ``edge.relay`` set (``robofleet edge --relay HOST:PORT``, the relay's gRPC port):

- **weights** come from the relay: its ZeroMQ fan-out on ``edge.relay_zmq_port`` (default
  ``comms.relay_zmq_port``) with the relay's Weights service for what the fan-out missed
  (``comms.robot.zmq_subscription``), or, with ``relay_zmq_port: 0``, a plain gRPC
  subscription at the relay. The relay holds one copy of each version for the whole site.
- **uploads and episode marks** of a run without shards go through the relay, which forwards
  them with the robot's own credential over its one upstream connection (acknowledgements stay
  end to end: an ack still means fsynced in the cloud). A sharded run's robot uploads straight
  to its shard (``comms.robot.shard_route``), relay or not.
- enrollment, heartbeats, the Control stream and remote inference stay with the cloud
  (``--server``): the relay serves none of them.

While the relay is unreachable the robot keeps acting on the weights it holds and its steps
wait in the durable spool; both resume when the relay is back. The counters the heartbeat
carries (:meth:`RelayLink.counters`) show how much came through the relay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edge_agent.config import EdgeSettings

if TYPE_CHECKING:
    from comms.config import CommsSettings
    from comms.robot.client import EdgeClient
    from comms.robot.receiver import WeightReceiver


def zmq_address(relay: str, port: int) -> str:
    """The relay's fan-out endpoint: the host of ``relay`` ("host:port", IPv6 in brackets) and
    ``port``.

    Raises:
        ValueError: ``relay`` is not "host:port".
    """
    from comms.robot.dataplane_client import grpc_host, is_host_port

    if not is_host_port(relay):
        raise ValueError(f"edge.relay must be host:port, got {relay!r}")
    return f"tcp://{grpc_host(relay)}:{port}"


class RelayLink:
    """The robot's client at its site relay and the weight subscription it holds there.

    Args:
        edge / comms: the robot computer's settings (``edge.relay`` set).
        cloud: the robot's client at the cloud (its credential is reused at the relay).

    Raises:
        ValueError: ``edge.relay`` is not "host:port".
    """

    def __init__(self, edge: EdgeSettings, comms: CommsSettings, cloud: EdgeClient) -> None:
        from comms.robot.client import make_channel

        assert edge.relay is not None
        port = comms.relay_zmq_port if edge.relay_zmq_port is None else edge.relay_zmq_port
        self.zmq = zmq_address(edge.relay, port) if port else None
        self.address = edge.relay
        self.client = cloud.via(make_channel(edge.relay, comms), edge.relay)
        self._subscription: Any = None

    def subscribe(self, run_id: str, receiver: WeightReceiver) -> Callable[[], None]:
        """Keep ``receiver`` at the run's newest version through the relay; returns the
        subscription's close."""
        if self.zmq is not None:
            from comms.robot.zmq_subscription import ZmqWeightSubscription

            self._subscription = ZmqWeightSubscription(self.client, self.zmq, run_id, receiver)
        else:
            from comms.robot.grpc_subscription import GrpcWeightSubscription

            self._subscription = GrpcWeightSubscription(self.client, run_id, receiver)
        close: Callable[[], None] = self._subscription.close
        return close

    def counters(self) -> dict[str, float]:
        """``relay_weight_bytes`` (weight bytes taken from the relay, fan-out and fetches) and
        ``relay_weight_refused`` (fan-out manifests and chunks dropped: a bad tag or digest)."""
        sub = self._subscription
        if sub is None:
            return {"relay_weight_bytes": 0.0, "relay_weight_refused": 0.0}
        got = getattr(sub, "bytes_received", 0) + getattr(sub, "fetched_bytes", 0)
        refused = getattr(sub, "chunks_refused", 0) + getattr(sub, "manifests_refused", 0)
        return {"relay_weight_bytes": float(got), "relay_weight_refused": float(refused)}

    def close(self) -> None:
        self.client.close()


def with_counters(
    heartbeat: Callable[..., Any], counters: Callable[[], Mapping[str, float]]
) -> Callable[..., Any]:
    """``heartbeat`` (``EdgeClient.heartbeat`` bound to a run) with ``counters()`` added to the
    statistics of every beat."""

    def beat(state: str, version: int | None, stats: Mapping[str, float], **kw: Any) -> Any:
        return heartbeat(state, version, {**stats, **counters()}, **kw)

    return beat
