"""The batch service's token (``buffer.service.batch_token``): a request to a ``BatchServer``
without its run's token, or with another, is refused by name and changes nothing; with it,
the service works. Over TCP on 127.0.0.1, as a shard's server on a node's IP is reached."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import zmq

from buffer import BufferSettings, ReplayBuffer
from buffer.sampling.samplers import UniformSampler
from buffer.service.batch_token import (
    REFUSED,
    TOKEN_ENV,
    BatchRefused,
    new_token,
    token_from_env,
)
from buffer.service.batches import BatchServer, RemoteBuffer
from buffer.service.sharded_batches import ShardedRemoteBuffer
from tests.buffer.helpers import episodes, small_schema

SETTINGS = {"segment_target_bytes": 4096, "memory_budget_bytes": 1 << 24}


class _Stateful(UniformSampler):
    """A uniform sampler with a state a ``load_sampler_state`` replaces."""

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, Any] = {"success": {"reach": 0.25}}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.state = dict(state)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BatchServer]:
    buf = ReplayBuffer.open(tmp_path / "b", small_schema(), BufferSettings(**SETTINGS))
    buf.append(episodes(0, [20, 20]))
    srv = BatchServer(buf, ["reach"], _Stateful(), token=new_token())
    yield srv
    srv.close()
    buf.close()


def _ask(address: str, request: Any) -> list[bytes]:
    """One raw request (no ``RemoteBuffer``: it always sends its token); the reply's frames."""
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(address)
    try:
        sock.send(request if isinstance(request, bytes) else json.dumps(request).encode())
        return list(sock.recv_multipart())
    finally:
        sock.close(0)


def _sampler_state(server: BatchServer) -> dict[str, Any]:
    sampler = server.sampler
    assert isinstance(sampler, _Stateful)
    return sampler.state


@pytest.mark.parametrize(
    "extra",
    [{}, {"token": "0" * 64}, {"token": ""}, {"token": 7}, {"token": "é" * 8}],
    ids=["missing", "wrong", "empty", "not-a-string", "not-ascii"],
)
def test_a_request_without_the_right_token_is_refused_by_name_and_changes_nothing(
    server: BatchServer, extra: dict[str, Any]
) -> None:
    assert server.address.startswith("tcp://127.0.0.1:")
    kept = _sampler_state(server)
    load = {"op": "load_sampler_state", "state": {"success": {"reach": 1.0}}, **extra}
    sample = {"op": "sample", "batch_size": 8, **extra}
    for request in (load, sample, {"op": "sampler_state", **extra}):
        frames = _ask(server.address, request)
        assert len(frames) == 1  # a header alone: no batch, no state
        header = json.loads(frames[0])
        assert header == {"error": REFUSED, "refused": True}
    assert _sampler_state(server) == kept
    assert server.refused == 3 and server.requests == 0 and server.samples == 0


def test_a_request_that_is_not_json_is_refused_too(server: BatchServer) -> None:
    assert json.loads(_ask(server.address, b"\xff not json")[0])["error"] == REFUSED
    assert server.refused == 1 and server.requests == 0


def test_a_client_with_the_wrong_token_gets_batch_refused(server: BatchServer) -> None:
    remote = RemoteBuffer(server.address, timeout_s=10, token=new_token())
    try:
        with pytest.raises(BatchRefused, match="batch token is wrong or missing"):
            remote.sample(8)
        with pytest.raises(BatchRefused):
            remote.load_sampler_state({"sampler": {"success": {"reach": 1.0}}})
    finally:
        remote.close()
    sharded = ShardedRemoteBuffer([server.address], timeout_s=10, token="not-the-token")
    try:
        with pytest.raises(BatchRefused):
            sharded.sample(8)
    finally:
        sharded.close()
    assert _sampler_state(server) == {"success": {"reach": 0.25}}
    assert server.samples == 0 and server.requests == 0


def test_the_right_token_samples_and_loads_the_sampler_state(server: BatchServer) -> None:
    remote = RemoteBuffer(server.address, timeout_s=10, token=server.token)
    try:
        assert len(remote.sample(8)["action"]) == 8
        remote.load_sampler_state({"sampler": {"success": {"reach": 1.0}}})
        assert remote.sampler_state() == {"sampler": {"success": {"reach": 1.0}}}
    finally:
        remote.close()
    assert server.refused == 0 and server.requests >= 3


def test_a_server_or_client_refuses_to_start_without_a_token(server: BatchServer) -> None:
    with pytest.raises(ValueError, match="batch token"):
        BatchServer(server.buffer, ["reach"], token="")
    with pytest.raises(ValueError, match="batch token"):
        RemoteBuffer(server.address, token="")


def test_the_learner_reads_its_token_from_its_environment() -> None:
    token = new_token()
    assert len(bytes.fromhex(token)) == 32 and token != new_token()
    assert token_from_env({TOKEN_ENV: token}) == token
    with pytest.raises(ValueError, match=TOKEN_ENV):
        token_from_env({})
