"""Edge side gRPC client: channel set-up, enrollment, heartbeat, episode marks, remote
inference, control.

Long-running streams (experience upload, weight subscription) live in
:mod:`comms.robot.uploader` and :mod:`comms.robot.grpc_subscription`; they reconnect on their
own with exponential backoff and jitter.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from comms.config import CommsSettings
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire import payload_messages, tls
from comms.wire.credentials import credential_metadata
from comms.wire.marks import MARK_KINDS, EpisodeMark
from comms.wire.tensor_messages import tensor_from_proto, tensor_to_proto
from foundation.retry import Backoff

log = logging.getLogger(__name__)

# Codes after which retrying the same call cannot help (the robot must be re-enrolled or leased).
FATAL_CODES = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
}


def channel_options(settings: CommsSettings) -> list[tuple[str, Any]]:
    return [
        ("grpc.keepalive_time_ms", int(settings.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", 8 * 1024 * 1024),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        ("grpc.enable_retries", 0),  # our loops retry, with our backoff
        ("grpc.initial_reconnect_backoff_ms", int(settings.reconnect_initial_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(settings.reconnect_max_s * 1000)),
    ]


def make_channel(
    address: str,
    settings: CommsSettings,
    ca_file: Path | None = None,
    *,
    tls_on: bool | None = None,
) -> grpc.Channel:
    """A channel to ``address`` ("host:port"); TLS when ``ca_file`` (or settings.tls_ca_file) is set."""
    ca = ca_file or settings.tls_ca_file
    use_tls = ca is not None if tls_on is None else tls_on
    opts = channel_options(settings)
    if use_tls:
        return grpc.secure_channel(address, tls.channel_credentials(ca), options=opts)
    return grpc.insecure_channel(address, options=opts)


def enroll(
    channel: grpc.Channel,
    token: str,
    robot_name: str,
    robot_type: str,
    spec: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int, str]:
    """Exchange a one-time enrollment token for ``(robot_id, credential)``.

    Raises:
        grpc.RpcError: UNAUTHENTICATED for an unknown, expired or used token; ALREADY_EXISTS
            when the name is taken; UNAVAILABLE / DEADLINE_EXCEEDED when the cloud is away.
    """
    reply = rpc.EnrollmentStub(channel).Enroll(
        pb.EnrollRequest(
            token=token,
            robot_name=robot_name,
            robot_type=robot_type,
            spec_json=json.dumps(dict(spec or {})),
        ),
        timeout=timeout_s,
    )
    return int(reply.robot_id), reply.credential


class EdgeClient:
    """One robot's connection to the cloud (or its site relay). Thread-safe.

    Args:
        channel: from :func:`make_channel`.
        credential: the robot's credential from :func:`enroll`.
        settings: deadlines, keepalive, backoff.
        address: the ``host:port`` the channel dials: a data plane offered at a wildcard
            host (a cloud bound to 0.0.0.0) is dialed at this host. None: such an offer is
            declined (gRPC bytes).
    """

    def __init__(
        self,
        channel: grpc.Channel,
        credential: str,
        settings: CommsSettings,
        *,
        address: str | None = None,
    ) -> None:
        self.channel = channel
        self.settings = settings
        self.address = address
        self.metadata = credential_metadata(credential)
        self.experience = rpc.ExperienceStub(channel)
        self._episodes = rpc.EpisodesStub(channel)
        # Upload with requests pre-serialized by comms.wire.payload_messages (one copy per
        # part, see there).
        self.upload_stream = channel.stream_stream(
            "/robofleet.comms.v1.Experience/Upload",
            request_serializer=payload_messages.passthrough,
            response_deserializer=pb.UploadAck.FromString,
        )
        self.weights = rpc.WeightsStub(channel)
        self._heartbeat = rpc.HeartbeatStub(channel)
        self._control = rpc.ControlStub(channel)
        self._act = rpc.ActStub(channel)
        self._station = rpc.StationStub(channel)

    def heartbeat(
        self,
        state: str,
        applied_policy_version: int | None,
        stats: Mapping[str, float],
        run_id: str = "",
        info: Mapping[str, Any] | None = None,
    ) -> float:
        """Report liveness; returns the server's clock (unix seconds). ``run_id``: the run
        ``state`` and ``stats`` belong to (the run acted in; for ``idle``, the last one left);
        ``info``: see ``HeartbeatRequest.info_json`` (sent as JSON).

        Raises:
            grpc.RpcError: UNAUTHENTICATED for a revoked credential, DEADLINE_EXCEEDED after
                ``call_timeout_s``, UNAVAILABLE when the cloud is away.
        """
        reply = self._heartbeat.Beat(
            pb.HeartbeatRequest(
                state=state,
                applied_policy_version=-1
                if applied_policy_version is None
                else applied_policy_version,
                stats={k: float(v) for k, v in stats.items()},
                run_id=run_id,
                info_json=json.dumps(dict(info)) if info else "",
            ),
            metadata=self.metadata,
            timeout=self.settings.call_timeout_s,
        )
        return float(reply.server_time)

    def mark_episode(self, mark: EpisodeMark) -> int:
        """Tell the cloud this robot's episode is never to be trained on; returns the
        episode's steps it excludes so far. The cloud stores the mark durably before
        answering; sending it again changes nothing.

        Raises:
            ValueError: an unknown ``mark.kind`` (:data:`comms.wire.marks.MARK_KINDS`).
            grpc.RpcError: INVALID_ARGUMENT for a bad field, NOT_FOUND for an unknown run,
                UNAUTHENTICATED for a revoked credential, UNAVAILABLE when the cloud is away.
        """
        kind = MARK_KINDS.get(mark.kind)
        if kind is None:
            raise ValueError(f"unknown episode mark {mark.kind!r}; choose {sorted(MARK_KINDS)}")
        msg = pb.EpisodeMark(
            run_id=mark.run_id, episode_index=mark.episode_index, kind=kind, reason=mark.reason
        )
        reply = self._episodes.Mark(
            msg, metadata=self.metadata, timeout=self.settings.call_timeout_s
        )
        return int(reply.discarded_steps)

    def act(
        self,
        run_id: str,
        observation: Mapping[str, Any],
        task: str = "",
        timeout_s: float | None = None,
    ) -> tuple[np.ndarray, int]:
        """Remote inference: observation in, ``(action chunk (chunk, action_dim), policy_version)`` out.

        Raises:
            grpc.RpcError: DEADLINE_EXCEEDED when no answer within ``timeout_s`` (default
                ``act_timeout_s``); PERMISSION_DENIED without a lease on ``run_id``.
        """
        reply = self._act.Act(
            pb.ActRequest(
                run_id=run_id,
                observation={k: tensor_to_proto(v) for k, v in observation.items()},
                task=task,
            ),
            metadata=self.metadata,
            timeout=timeout_s or self.settings.act_timeout_s,
        )
        return tensor_from_proto(reply.action), int(reply.policy_version)

    def fetch_chunks(
        self, run_id: str, version: int, base: int, indices: list[int]
    ) -> list[pb.WeightMessage]:
        """Fetch chunks ``indices`` of weight version ``version`` (delta on ``base``) again.

        Raises:
            grpc.RpcError: when the call fails or passes ``call_timeout_s``.
        """
        return list(
            self.weights.Fetch(
                pb.FetchRequest(run_id=run_id, version=version, base_version=base, indices=indices),
                metadata=self.metadata,
                timeout=self.settings.call_timeout_s,
            )
        )

    def station_report(self, report: pb.StationReport) -> None:
        """Show the dashboard's operator station this robot's latest frame and takeover echo.

        Raises:
            grpc.RpcError: INVALID_ARGUMENT for a frame over the cloud's limit or of an
                unknown format, UNAUTHENTICATED for a revoked credential, UNAVAILABLE when
                the cloud is away.
        """
        self._station.Report(report, metadata=self.metadata, timeout=self.settings.call_timeout_s)

    def via(self, channel: grpc.Channel, address: str | None = None) -> EdgeClient:
        """The same robot (its credential, its settings) on another ``channel`` (dialing
        ``address``): its site relay's, which forwards the credential to the cloud."""
        other = EdgeClient(channel, "", self.settings, address=address)
        other.metadata = self.metadata
        return other

    def close(self) -> None:
        self.channel.close()


class ControlListener:
    """Receives pushed commands (e-stop, pause, resume, lease changes) on a background thread,
    reconnecting on its own.

    Args:
        client: the robot's client.
        on_command: called with each :class:`pb.ControlCommand` (on the listener's thread).
    """

    def __init__(self, client: EdgeClient, on_command: Callable[[pb.ControlCommand], None]) -> None:
        self._client = client
        self._on_command = on_command
        self._stop = threading.Event()
        self._call: Any = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        s = self._client.settings
        backoff = Backoff(s.reconnect_initial_s, s.reconnect_max_s)
        while not self._stop.is_set():
            try:
                self._call = self._client._control.Commands(
                    pb.ControlRequest(), metadata=self._client.metadata
                )
                self.connected.set()
                for cmd in self._call:
                    backoff.reset()
                    self._on_command(cmd)
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.info("control stream lost: %s", exc.code())
            self.connected.clear()
            if backoff.sleep(self._stop):
                return

    def close(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)
