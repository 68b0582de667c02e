"""Requests as they arrive: decoded, refused by name when they cannot be served, registered.

grpc runs a method's request deserializer before the servicer: a protobuf ``DecodeError``
raised there ends the call as UNKNOWN (unary requests) or INTERNAL (streamed ones, through the
servicer's ``read``) with a traceback in the log. The deserializers :func:`add_service`
registers never raise: undecodable bytes arrive as an :class:`Undecodable`, which ``guarded``
(a unary request) and :func:`read_message` (a message of a request stream) turn into
:class:`BadRequest`, answered INVALID_ARGUMENT with the message type and protobuf's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from comms.proto import robofleet_pb2 as pb
from comms.wire import payload_messages

# Fields a request must set (of a request stream: its opening message), by message type, in
# the order they are checked. Only strings and maps: a zero number is a value, not a gap.
REQUIRED: dict[str, tuple[str, ...]] = {
    "EnrollRequest": ("token",),
    "StepBatch": ("run_id",),
    "RouteRequest": ("run_id",),
    "SubscribeRequest": ("run_id",),
    "FetchRequest": ("run_id",),
    "HeartbeatRequest": ("state",),
    "ControlRequest": (),
    "ActRequest": ("run_id", "observation"),
    "EpisodeMark": ("run_id",),
    "StationReport": (),
}


class BadRequest(ValueError):
    """A request that cannot be served as sent (undecodable, a required field empty); the
    call is answered INVALID_ARGUMENT with this text."""


@dataclass(frozen=True)
class Undecodable:
    """What the deserializer gives for bytes that are not a ``type_name`` message."""

    type_name: str
    size: int
    reason: str

    def error(self) -> BadRequest:
        return BadRequest(f"{self.type_name}: undecodable ({self.size} bytes: {self.reason})")


def decoder(cls: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A request deserializer for ``cls`` that returns :class:`Undecodable` instead of raising."""
    name = cls.DESCRIPTOR.name

    def decode(data: bytes) -> Message | Undecodable:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Undecodable(name, len(data), str(exc))

    return decode


def require(msg: Message) -> None:
    """Check ``msg``'s required fields (:data:`REQUIRED`).

    Raises:
        BadRequest: ``"<Type>.<field> is empty"`` for the first one not set.
    """
    name = msg.DESCRIPTOR.name
    for field in REQUIRED[name]:
        if not len(getattr(msg, field)):
            raise BadRequest(f"{name}.{field} is empty")


def checked(request: Any) -> Any:
    """``request`` as a message (a unary request, after ``guarded``'s checks).

    Raises:
        BadRequest: it was undecodable, or a required field is empty.
    """
    if isinstance(request, Undecodable):
        raise request.error()
    if isinstance(request, Message):
        require(request)
    return request


async def read_message(context: grpc.aio.ServicerContext) -> Any:
    """The next message of a request stream (or ``grpc.aio.EOF``).

    Raises:
        BadRequest: the message was undecodable.
    """
    got = await context.read()
    if isinstance(got, Undecodable):
        raise got.error()
    return got


_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(server: grpc.aio.Server, servicer: Any, service: str) -> None:
    """Register ``servicer``'s methods for every method of ``service`` (a service name of
    robofleet.proto), with :func:`decoder` requests and
    :func:`comms.wire.payload_messages.passthrough` responses (messages, or bytes serialized already: weight chunks).

    Raises:
        AttributeError: ``servicer`` lacks a method of the service.
    """
    desc = pb.DESCRIPTOR.services_by_name[service]
    handlers = {
        m.name: _HANDLERS[(m.client_streaming, m.server_streaming)](
            getattr(servicer, m.name),
            request_deserializer=decoder(GetMessageClass(m.input_type)),
            response_serializer=payload_messages.passthrough,
        )
        for m in desc.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )
    server.add_registered_method_handlers(desc.full_name, handlers)
