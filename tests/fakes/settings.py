"""The suite's one set of fast settings: each component's section with short timeouts.

Tests build what they run with from here and override only the value they are about, e.g.
``fast_comms(upload_window=4)`` or ``fast_edge(control_hz=20.0, wait_for_first_weights=False)``:

* ``fast_comms``: loopback gRPC on any free port; streams, pings and reconnects in fractions of
  a second so fault tests finish in seconds; no credential cache (a revoked lease acts at once).
* ``fast_edge``: a 200 Hz loop; heartbeats and partial upload batches every 0.2 s.
* ``fast_hal``: probes nothing on this machine unless told (no serial globs, DDS on loopback).
* ``fast_settings``: the whole ``robofleet`` settings object of these sections (the dashboard's
  streams poll every 0.1 s).
* ``cloud_env``: the environment of a real ``robofleet cloud`` process. A system test checks
  the shipped behaviour under load, so that cloud keeps the default timeouts (the short ones
  above would cut its streams on a busy 2-core machine); it only takes any free port, and what
  a test passes (e.g. ``orchestration={"learner_hang_s": 30}``).
* ``wan_comms``: a shaped, lossy WAN link (tests/comms/test_wan.py): pings and reconnects
  relaxed to its latency.
* ``FAST_RUN``: run hyperparameters of a run spec that learns in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from comms.config import CommsSettings
from dashboard.config import DashboardSettings
from edge_agent.config import EdgeSettings
from hal.config import HalSettings
from robofleet.settings import Settings

COMMS: dict[str, Any] = {
    "grpc_port": 0,
    "stream_idle_timeout_s": 3.0,
    "keepalive_time_s": 1.0,
    "keepalive_timeout_s": 1.0,
    "reconnect_initial_s": 0.05,
    "reconnect_max_s": 0.5,
    "call_timeout_s": 5.0,
    "auth_cache_s": 0.0,
}
EDGE: dict[str, Any] = {
    "control_hz": 200.0,
    "heartbeat_interval_s": 0.2,
    "batch_max_delay_s": 0.2,
}
HAL: dict[str, Any] = {
    "serial_globs": [],
    "dds_loopback_only": True,
    "offline_after_s": 10.0,
}
DASHBOARD: dict[str, Any] = {"stream_poll_interval_s": 0.1}
WAN: dict[str, Any] = {
    "keepalive_time_s": 2.0,
    "keepalive_timeout_s": 2.0,
    "reconnect_initial_s": 0.1,
    "reconnect_max_s": 1.0,
    "stream_idle_timeout_s": 10.0,
}
# What a real cloud process takes from the sections above (see the module docstring).
CLOUD_PROCESS: dict[str, dict[str, Any]] = {
    "comms": {"grpc_port": COMMS["grpc_port"]},
    "hal": {"offline_after_s": HAL["offline_after_s"]},
}
FAST_RUN: dict[str, Any] = {
    "bc_updates": 40,
    "max_episode_steps": 50,
    "eval_max_steps": 50,
    "updates_per_s": 20,
    "checkpoint_every_updates": 40,
    "batch_size": 64,
}
SECRET = SecretStr("dashboard-test-secret-" + "x" * 20)


def fast_comms(**overrides: Any) -> CommsSettings:
    """Loopback transport settings with short timeouts (``COMMS``), plus ``overrides``."""
    return CommsSettings(**{**COMMS, **overrides})


def wan_comms(**overrides: Any) -> CommsSettings:
    """Transport settings of the shaped WAN link (``WAN``), plus ``overrides``."""
    return CommsSettings(**{**WAN, **overrides})


def fast_edge(**overrides: Any) -> EdgeSettings:
    """Edge agent settings of a fast loop (``EDGE``), plus ``overrides``."""
    return EdgeSettings(**{**EDGE, **overrides})


def fast_hal(**overrides: Any) -> HalSettings:
    """Fleet settings that probe nothing of this machine (``HAL``), plus ``overrides``."""
    return HalSettings(**{**HAL, **overrides})


def fast_settings(data_dir: Path, **overrides: Any) -> Settings:
    """The whole settings object: these sections, a fixed secret, data under ``data_dir``."""
    base: dict[str, Any] = {
        "data_dir": data_dir,
        "secret_key": SECRET,
        "comms": fast_comms(),
        "edge": fast_edge(),
        "hal": fast_hal(),
        "dashboard": DashboardSettings(**DASHBOARD),
    }
    return Settings(**{**base, **overrides})


def cloud_env(data_dir: Path, **sections: dict[str, Any]) -> dict[str, str]:
    """The environment of a ``robofleet`` process on ``data_dir``: this process's environment
    (read now, so a test's ``monkeypatch.setenv`` reaches it) with ``CLOUD_PROCESS`` and
    ``sections`` (``{"orchestration": {"learner_hang_s": 30}}``) as ``ROBOFLEET_*`` variables,
    and no config file."""
    env = dict(os.environ)
    env.update(
        ROBOFLEET_DATA_DIR=str(data_dir),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        HF_HUB_OFFLINE="1",
    )
    for layer in (CLOUD_PROCESS, sections):
        for section, values in layer.items():
            for key, value in values.items():
                env[f"ROBOFLEET_{section.upper()}__{key.upper()}"] = str(value)
    env.pop("ROBOFLEET_CONFIG", None)
    return env
