"""Enrollment and refusals: one-time expiring tokens, credentials, leases, clear status codes."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from comms.proto import robofleet_pb2 as pb
from comms.robot.client import EdgeClient, enroll, make_channel
from comms.wire import steps as S
from comms.wire.credentials import credential_metadata
from foundation.store.models import Robot, RobotStatus
from tests.comms.helpers import rpc_code, steps
from tests.fakes.cloud import RUN, Cloud


def test_token_is_exchanged_once_for_a_working_credential(cloud: Cloud) -> None:
    token = cloud.store.create_enrollment_token(timedelta(minutes=1))
    ch = make_channel(cloud.address, cloud.settings)
    rid, cred = enroll(ch, token, "arm-1", "sim_arm", {"control_hz": 10})
    assert cloud.store.robot_for_credential(cred).id == rid  # type: ignore[union-attr]
    client = EdgeClient(ch, cred, cloud.settings)
    assert client.heartbeat("running", None, {}) > 0
    with pytest.raises(grpc.RpcError) as err:
        enroll(ch, token, "arm-2", "sim_arm")
    assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
    assert "already used" in err.value.details()  # type: ignore[attr-defined]
    ch.close()


def test_expired_and_unknown_tokens_are_refused(cloud: Cloud) -> None:
    expired = cloud.store.create_enrollment_token(timedelta(seconds=-1))
    ch = make_channel(cloud.address, cloud.settings)
    for token, why in ((expired, "expired"), ("not-a-token", "unknown")):
        with pytest.raises(grpc.RpcError) as err:
            enroll(ch, token, "arm-x", "sim_arm")
        assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
        assert why in err.value.details()  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as err:
        rpc_bad = pb.EnrollRequest(token="x", robot_name="a", robot_type="b", spec_json="[1")
        from comms.proto import robofleet_pb2_grpc as rpc

        rpc.EnrollmentStub(ch).Enroll(rpc_bad, timeout=5)
    assert rpc_code(err.value) == grpc.StatusCode.INVALID_ARGUMENT
    ch.close()


def _upload_once(cloud: Cloud, credential: str, run_id: str, batch: object) -> list[pb.UploadAck]:
    from comms.proto import robofleet_pb2_grpc as rpc

    ch = make_channel(cloud.address, cloud.settings)
    try:
        msgs = [
            pb.StepBatch(run_id=run_id),
            pb.StepBatch(run_id=run_id, last_seq=0, arrow_ipc=S.encode_batch(batch)),  # type: ignore[arg-type]
        ]
        return list(
            rpc.ExperienceStub(ch).Upload(
                iter(msgs), metadata=credential_metadata(credential), timeout=10
            )
        )
    finally:
        ch.close()


def test_unknown_and_revoked_credentials_are_unauthenticated(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    with pytest.raises(grpc.RpcError) as err:
        _upload_once(cloud, "forged-credential", RUN, steps(robot.robot_id, 0, 3))
    assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
    assert "Traceback" not in err.value.details()  # type: ignore[attr-defined]
    acks = _upload_once(cloud, robot.credential, RUN, steps(robot.robot_id, 0, 3))
    assert acks[-1].durable_seq == 2
    with cloud.store.session() as s:
        s.get(Robot, robot.robot_id).status = RobotStatus.RETIRED  # type: ignore[union-attr]
    client = cloud.client(robot)
    with pytest.raises(grpc.RpcError) as err:
        client.heartbeat("running", None, {})
    assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
    client.close()


def test_robot_uploads_only_as_itself_into_leased_runs(cloud: Cloud) -> None:
    a = cloud.robot("arm-a")
    b = cloud.robot("arm-b")
    with pytest.raises(grpc.RpcError) as err:  # rows claiming to be robot b
        _upload_once(cloud, a.credential, RUN, steps(b.robot_id, 0, 3))
    assert rpc_code(err.value) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:  # a run it holds no lease on
        _upload_once(cloud, a.credential, "run-other", steps(a.robot_id, 0, 3))
    assert rpc_code(err.value) == grpc.StatusCode.PERMISSION_DENIED
    assert "no active lease" in err.value.details()  # type: ignore[attr-defined]
    assert cloud.sink.seqs(a.robot_id) == [] and cloud.sink.seqs(b.robot_id) == []


def test_bad_step_bytes_get_a_clear_error_and_keep_acknowledged_rows(cloud: Cloud) -> None:
    from comms.proto import robofleet_pb2_grpc as rpc

    robot = cloud.robot("arm-1")
    assert (
        _upload_once(cloud, robot.credential, RUN, steps(robot.robot_id, 0, 4))[-1].durable_seq == 3
    )
    ch = make_channel(cloud.address, cloud.settings)
    msgs = [pb.StepBatch(run_id=RUN), pb.StepBatch(run_id=RUN, arrow_ipc=b"\x00garbage")]
    with pytest.raises(grpc.RpcError) as err:
        list(
            rpc.ExperienceStub(ch).Upload(
                iter(msgs), metadata=credential_metadata(robot.credential), timeout=10
            )
        )
    assert rpc_code(err.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an Arrow IPC stream" in err.value.details()  # type: ignore[attr-defined]
    ch.close()
    assert cloud.sink.seqs(robot.robot_id) == [0, 1, 2, 3]


def test_heartbeat_is_recorded(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    client.heartbeat("running", 7, {"loop_hz": 9.5, "overruns": 2})
    with cloud.store.session() as s:
        row = s.get(Robot, robot.robot_id)
        assert row is not None
        assert row.applied_policy_version == 7
        assert row.stats["loop_hz"] == 9.5 and row.stats["state"] == "running"
        assert row.last_heartbeat_at is not None
    client.close()
