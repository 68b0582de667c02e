"""The robot's credential file: what enrollment gave it, kept in its spool directory.

``credential.json`` holds ``{"robot_id": int, "credential": str}`` with mode 0600 (only the
robot's user may read the secret). It is written once, after enrollment, atomically and
durably (:func:`foundation.durable.atomic_write_json`): after a crash the file is either absent
or whole, never torn (the one-time token is spent by then).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from foundation.durable import atomic_write_json

FILE_NAME = "credential.json"


@dataclass(frozen=True)
class RobotCredential:
    """The robot's id in the metadata store and its bearer credential for the cloud."""

    robot_id: int
    credential: str


def credential_path(directory: Path) -> Path:
    """Where the credential of the robot whose spool is ``directory`` lives."""
    return directory / FILE_NAME


def read_credential(directory: Path) -> RobotCredential | None:
    """The stored credential, or None when the robot has none yet.

    Raises:
        ValueError: the file is not JSON or lacks ``robot_id`` / ``credential``.
        OSError: the file exists but cannot be read.
    """
    path = credential_path(directory)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    try:
        return RobotCredential(int(data["robot_id"]), str(data["credential"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: unreadable credential ({exc!r})") from None


def write_credential(directory: Path, credential: RobotCredential) -> None:
    """Store ``credential`` (mode 0600), creating ``directory`` when needed.

    Raises:
        OSError: the directory or file cannot be written (the old file, if any, is unchanged).
    """
    directory.mkdir(parents=True, exist_ok=True)
    data = {"robot_id": credential.robot_id, "credential": credential.credential}
    atomic_write_json(credential_path(directory), data, mode=0o600)
