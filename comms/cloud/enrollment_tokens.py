"""Enrollment tokens, and the ``robofleet edge`` command a robot computer runs with one.

``robofleet robots enroll`` and the dashboard's ``POST /api/enrollment-tokens`` both issue the
token with :func:`issue_enrollment`, so the command a lab copies is the same from either. The
command takes no run id: the robot computer enrolls, goes idle and the cloud assigns it to runs
(``edge_agent.host``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import utcnow

# A driver option's key or a tag's key: what ``KEY=VALUE`` on a command line can carry.
KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
_KEY = re.compile(KEY_PATTERN)
# A ``--driver``: a built-in kind or entry point name, or a lab's ``module.path:ClassName``
# (``hal.drivers``); only its form is checked: the lab's package lives on its robot computer.
DRIVER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(:[A-Za-z_][A-Za-z0-9_.]{0,127})?$"
_DRIVER = re.compile(DRIVER_PATTERN)


@dataclass(frozen=True)
class IssuedEnrollment:
    """A new one-time token (shown once; only its hash is stored), when it expires (UTC) and
    the command that uses it."""

    token: str
    expires_at: datetime
    command: str


def edge_command(
    server: str,
    token: str,
    robot_name: str,
    *,
    driver: str | None = None,
    driver_options: Mapping[str, Any] | None = None,
    operator: str | None = None,
    operator_options: Mapping[str, Any] | None = None,
) -> str:
    """The shell line ``robofleet edge --server S --token T --robot R [--driver D]
    [--driver-option K=V ...] [--operator O [--operator-option K=V ...]]``, every argument
    quoted for a POSIX shell.

    An option whose value is not a string is written as JSON, which ``robofleet edge`` parses
    back to the same value; options left out take the robot computer's defaults.

    Raises:
        ValueError: a driver or operator option's key is not ``KEY_PATTERN``, named; operator
            options without an operator.
    """
    # ``--token=T``: a token may start with "-", which argparse would take for an option.
    args = ["robofleet", "edge", "--server", server, f"--token={token}", "--robot", robot_name]
    if driver:
        args += ["--driver", driver]
    args += _option_args(driver_options or {}, "driver")
    if operator:
        args += ["--operator", operator]
    args += _option_args(operator_options or {}, "operator")
    if operator_options and not operator:
        raise ValueError("operator options need an operator (lerobot, spacemouse)")
    return shlex.join(args)


def _option_args(options: Mapping[str, Any], of: str) -> list[str]:
    """``--{of}-option KEY=VALUE`` for each option (VALUE as JSON unless a string)."""
    out: list[str] = []
    for key, value in options.items():
        if not _KEY.match(key):
            raise ValueError(f"{of} option {key!r}: a key is 1-64 of [A-Za-z0-9_.-]")
        text = value if isinstance(value, str) else json.dumps(value)
        out += [f"--{of}-option", f"{key}={text}"]
    return out


def issue_enrollment(
    store: MetadataStore,
    *,
    server: str,
    ttl: timedelta,
    robot_name: str | None = None,
    robot_type: str | None = None,
    tags: Mapping[str, str] | None = None,
    driver: str | None = None,
    driver_options: Mapping[str, Any] | None = None,
    operator: str | None = None,
    operator_options: Mapping[str, Any] | None = None,
    actor: str = "system",
) -> IssuedEnrollment:
    """Create a one-time token valid for ``ttl`` and the command a robot computer runs with it
    against the cloud at ``server`` (host:port). The robot that enrolls with it is named
    ``robot_name`` (``NAME`` in the command when not fixed: the robot picks it), has type
    ``robot_type`` (else its driver's) and gets ``tags`` (what run specs select robots by).

    Raises:
        ValueError: a driver or operator option's key or the driver's form is invalid, or
            operator options come without an operator (nothing is created).
    """
    # A bad option creates no token: the command is checked first.
    edge_command(
        server,
        "T",
        "NAME",
        driver_options=driver_options,
        operator=operator,
        operator_options=operator_options,
    )
    if driver and not _DRIVER.match(driver):
        raise ValueError(
            f"driver {driver!r}: a built-in kind or entry point name, or module.path:ClassName"
        )
    expires = utcnow() + ttl  # the store computes its own, a few microseconds later
    token = store.create_enrollment_token(
        ttl, robot_name=robot_name, robot_type=robot_type, tags=dict(tags or {}), actor=actor
    )
    command = edge_command(
        server,
        token,
        robot_name or "NAME",
        driver=driver,
        driver_options=driver_options,
        operator=operator,
        operator_options=operator_options,
    )
    return IssuedEnrollment(token=token, expires_at=expires, command=command)
