"""A site relay beyond loopback: refused in the clear unless insecure_network says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from comms.config import CommsSettings
from comms.exposure import is_loopback, relay_plaintext_servers


def test_loopback_relay_is_not_exposed() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("relay.site.lan")
    assert relay_plaintext_servers(CommsSettings(), 50061, 50062) == []


def test_beyond_loopback_the_zeromq_fan_out_is_always_named(tmp_path: Path) -> None:
    comms = CommsSettings(bind_host="10.1.2.3")
    lines = relay_plaintext_servers(comms, 50061, 50062)
    assert len(lines) == 2
    assert "gRPC on 10.1.2.3:50061 without TLS" in lines[0]
    assert "ZeroMQ) on 10.1.2.3:50062 unencrypted" in lines[1]
    # TLS covers gRPC; the weight fan-out stays in the clear
    tls = comms.model_copy(update={"tls_cert_file": tmp_path / "c.pem"})
    (line,) = relay_plaintext_servers(tls, 50061, 50062)
    assert "ZeroMQ" in line


def test_robofleet_relay_refuses_a_plaintext_bind_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "ROBOFLEET_DATA_DIR": str(tmp_path / "data")}
    env.pop("ROBOFLEET_INSECURE_NETWORK", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "robofleet.cli",
            "relay",
            "--bind",
            "0.0.0.0",
            "--cloud",
            "127.0.0.1:1",
            "--port",
            "0",
            "--zmq-port",
            "0",
        ],  # fmt: skip
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "relay gRPC on 0.0.0.0" in lines[0] and "insecure_network" in lines[0]
    assert "relay serving" not in out.stdout  # refused before it bound anything
