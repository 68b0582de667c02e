"""TLS with a self-signed certificate made in the test."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from comms.cloud.step_sink import MemorySink
from comms.robot.client import EdgeClient, make_channel
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import rpc_code, self_signed_cert
from tests.fakes.cloud import Cloud
from tests.fakes.settings import fast_comms


def test_tls_server_serves_tls_clients_only(tmp_path: Path, store: MetadataStore) -> None:
    cert, key = self_signed_cert(tmp_path)
    settings = fast_comms(tls_cert_file=cert, tls_key_file=key)
    cloud = Cloud(store, MemorySink(), settings)
    server = cloud.server
    try:
        assert server.settings.bind_host == "127.0.0.1"
        robot = cloud.robot("arm-tls", ca=cert)
        client = cloud.client(robot, ca=cert)
        assert client.heartbeat("running", None, {}) > 0
        client.close()
        plain = EdgeClient(
            make_channel(server.address, settings, tls_on=False), robot.credential, settings
        )
        with pytest.raises(grpc.RpcError) as err:
            plain.heartbeat("running", None, {})
        assert rpc_code(err.value) == grpc.StatusCode.UNAVAILABLE
        plain.close()
        other_cert, _ = self_signed_cert(tmp_path / "..")  # a root the server does not use
        wrong = EdgeClient(
            make_channel(server.address, settings, other_cert), robot.credential, settings
        )
        with pytest.raises(grpc.RpcError) as err:
            wrong.heartbeat("running", None, {})
        assert rpc_code(err.value) == grpc.StatusCode.UNAVAILABLE
        wrong.close()
    finally:
        cloud.close()
