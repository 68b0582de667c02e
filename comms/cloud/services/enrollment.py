"""The Enrollment service: a robot trades a one-time token for its id and credential."""

from __future__ import annotations

import asyncio
import json

import grpc
import grpc.aio
from sqlalchemy.exc import IntegrityError

from comms.cloud.services.common import ServerState, guarded
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from foundation.store.metadata_store import EnrollmentError


class EnrollmentServicer(rpc.EnrollmentServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Enroll(
        self, request: pb.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollReply:
        try:
            spec = json.loads(request.spec_json) if request.spec_json else {}
            if not isinstance(spec, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec_json: {exc}")
        try:
            robot, credential = await asyncio.to_thread(
                self.s.metadata_store().consume_enrollment_token,
                request.token,
                robot_name=request.robot_name,
                robot_type=request.robot_type,
                spec=spec,
            )
        except EnrollmentError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except IntegrityError:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"a robot named {request.robot_name!r} exists"
            )
        return pb.EnrollReply(robot_id=robot.id, robot_name=robot.name, credential=credential)
