"""A robot's first contact with its cloud: the one-time token exchanged for a credential.

A robot computer may boot before its cloud or its network: an unreachable cloud
(UNAVAILABLE, DEADLINE_EXCEEDED) is waited for with backoff, one log line per wait. Any other
answer is the cloud's refusal (an unknown, expired or spent token; a taken name); retrying the
same request cannot help, so it ends the attempt with :class:`EnrollmentRefused`, whose
message names the problem and what to do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import grpc

from comms.config import CommsSettings
from comms.robot.client import enroll, make_channel
from foundation.retry import Backoff

log = logging.getLogger(__name__)

# The cloud did not answer: wait and try again.
UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class EnrollmentRefused(Exception):
    """The cloud answered and refused the enrollment; the message says what to do."""


class EnrollmentStopped(Exception):
    """Asked to stop while waiting for an unreachable cloud."""


def refusal(server: str, robot_name: str, code: grpc.StatusCode, details: str) -> str:
    """One line: what the cloud at ``server`` refused, and what the robot's owner does next."""
    said = f"{details} ({code.name})" if details else code.name
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"the cloud at {server} refused the enrollment token: {said}; a token is used once "
            f"and expires, so ask an operator for a new one (`robofleet robots enroll "
            f"{robot_name}` or the dashboard's Enroll page) and start again with --token NEW"
        )
    if code is grpc.StatusCode.ALREADY_EXISTS:
        return (
            f"the cloud at {server} refused robot name {robot_name!r}: {said}; start with the "
            f"spool directory that holds its credential.json, or enroll under another --robot"
        )
    return f"the cloud at {server} refused to enroll robot {robot_name!r}: {said}"


def enroll_when_reachable(
    server: str,
    comms: CommsSettings,
    token: str,
    robot_name: str,
    robot_type: str,
    spec: Mapping[str, Any],
    stop: threading.Event | None = None,
) -> tuple[int, str]:
    """Exchange ``token`` for ``(robot_id, credential)`` at the cloud at ``server``
    ("host:port"), waiting for it while it is unreachable (``foundation.retry.Backoff``
    between ``comms.reconnect_initial_s`` and ``comms.reconnect_max_s``, each try bounded by
    ``comms.call_timeout_s``).

    Raises:
        EnrollmentRefused: the cloud answered with anything but the credential.
        EnrollmentStopped: ``stop`` was set while waiting.
    """
    backoff = Backoff(comms.reconnect_initial_s, comms.reconnect_max_s)
    stop = stop or threading.Event()
    while True:
        channel = make_channel(server, comms)
        try:
            return enroll(channel, token, robot_name, robot_type, spec, comms.call_timeout_s)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code not in UNREACHABLE:
                raise EnrollmentRefused(refusal(server, robot_name, code, details)) from None
        finally:
            channel.close()
        delay = backoff.next()
        log.warning(
            "waiting for the cloud at %s to enroll robot %s (%s); next try in %.1f s",
            server,
            robot_name,
            code.name,
            delay,
        )
        if stop.wait(delay):
            raise EnrollmentStopped(f"stopped while waiting for the cloud at {server}")
