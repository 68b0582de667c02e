"""Beyond loopback, the cloud's servers need TLS or the explicit insecure_network flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from comms.config import CommsSettings
from dashboard.app import create_app
from dashboard.config import DashboardSettings
from dashboard.exposure import InsecureNetworkError, check_exposure, plaintext_servers
from foundation.store.metadata_store import MetadataStore
from runs.manager import QueuedRunManager
from tests.dashboard.conftest import login


def test_loopback_needs_nothing() -> None:
    assert plaintext_servers(CommsSettings(), DashboardSettings()) == []
    assert plaintext_servers(CommsSettings(bind_host="::1"), DashboardSettings()) == []


def test_every_plaintext_server_beyond_loopback_is_named_and_refused(tmp_path: Path) -> None:
    comms = CommsSettings(bind_host="0.0.0.0")
    dash = DashboardSettings(bind_host="10.0.0.5")
    with pytest.raises(InsecureNetworkError) as err:
        check_exposure(comms, dash, insecure_network=False)
    msg = str(err.value)
    assert "gRPC on 0.0.0.0" in msg and "data plane" in msg and "dashboard on 10.0.0.5" in msg
    assert "insecure_network" in msg and "tls_cert_file" in msg
    # with TLS on both, nothing is in the clear
    cert = tmp_path / "c.pem"
    tls_comms = comms.model_copy(update={"tls_cert_file": cert})
    tls_dash = dash.model_copy(update={"tls_cert_file": cert})
    assert check_exposure(tls_comms, tls_dash, insecure_network=False) == []
    # the explicit flag accepts it and returns what it accepted
    assert len(check_exposure(comms, dash, insecure_network=True)) == 3
    # no dashboard served: only gRPC counts
    assert len(plaintext_servers(comms, None)) == 2


def test_the_dashboard_says_so_on_every_page_when_accepted(settings, store: MetadataStore) -> None:
    settings.insecure_network = True
    settings.comms = settings.comms.model_copy(update={"bind_host": "0.0.0.0"})
    app = create_app(settings, store, QueuedRunManager(store, settings.data_dir))
    page = login(app, "viewer").get("/runs").text
    assert 'id="insecure-network"' in page and "gRPC on 0.0.0.0" in page
    settings.insecure_network = False
    quiet = create_app(settings, store, QueuedRunManager(store, settings.data_dir))
    assert 'id="insecure-network"' not in login(quiet, "viewer").get("/runs").text


def test_robofleet_cloud_refuses_a_plaintext_bind_in_one_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ROBOFLEET_DATA_DIR": str(tmp_path / "data"),
        "ROBOFLEET_COMMS__BIND_HOST": "0.0.0.0",
    }
    env.pop("ROBOFLEET_INSECURE_NETWORK", None)
    out = subprocess.run(
        [sys.executable, "-m", "robofleet.cli", "cloud", "--no-dashboard", "--grpc-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "gRPC on 0.0.0.0" in lines[0], out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created
