"""What every servicer of one server shares: the server state, the error mapping (``guarded``),
authentication, writes with the idle timeout, the open-stream count and the server options."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
import numpy as np

from comms.cloud.auth import AuthError, CallerAuth, RobotIdentity
from comms.cloud.dataplane import DataPlaneServer
from comms.cloud.distributor import WeightDistributor
from comms.cloud.ratelimit import AsyncByteRate
from comms.cloud.services.requests import BadRequest, checked
from comms.cloud.services.sink_events import EventRecorder
from comms.cloud.shard_routes import RouteResolver
from comms.cloud.step_sink import SinkClosed, SinkFull, SinkRejected, SinkResolver
from comms.config import CommsSettings
from comms.proto import robofleet_pb2 as pb
from foundation.store.metadata_store import MetadataStore

if TYPE_CHECKING:
    from comms.cloud.services.station import StationView

log = logging.getLogger(__name__)

# A sink's refusals as robots get them (steps and episode marks alike); the retryable ones
# leave what was refused with the robot, which sends it again.
SINK_REFUSALS: dict[type[Exception], grpc.StatusCode] = {
    SinkRejected: grpc.StatusCode.INVALID_ARGUMENT,
    SinkFull: grpc.StatusCode.RESOURCE_EXHAUSTED,  # its disk is full: retry later
    SinkClosed: grpc.StatusCode.UNAVAILABLE,  # its run is stopping: retry later
}

# act(run_id, observation {name: array}, task) -> (action chunk (chunk, action_dim), policy_version)
ActHandler = Callable[[str, dict[str, np.ndarray], str], tuple[np.ndarray, int]]
R = TypeVar("R")


@dataclass
class ServerState:
    """What every servicer of one server shares."""

    settings: CommsSettings
    store: MetadataStore | None  # None: a buffer shard's ingest endpoint (no metadata store)
    auth: CallerAuth
    sinks: SinkResolver
    # Where a server without a metadata store records run events (a shard's endpoint).
    events: EventRecorder | None = None
    # A sharded run's ingest routes (``Ingest.Route``); None for other runs.
    routes: RouteResolver = field(default=lambda _run_id: None)
    distributors: dict[str, WeightDistributor] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # distributors, robot_locks
    robot_locks: dict[tuple[str, int], threading.Lock] = field(default_factory=dict)
    act_handler: ActHandler | None = None
    loop: asyncio.AbstractEventLoop | None = None
    rate: AsyncByteRate = field(default_factory=lambda: AsyncByteRate(0))
    control: dict[int, asyncio.Queue[pb.ControlCommand]] = field(default_factory=dict)
    version_events: dict[str, asyncio.Event] = field(default_factory=dict)
    dataplane: DataPlaneServer | None = None
    # Where upload streams store their batches (``comms.cloud.services.mailbox``); set by the
    # server while it serves.
    ingest_pool: ThreadPoolExecutor | None = None
    active_streams: int = 0
    weight_bytes_sent: int = 0
    uploaded_rows: int = 0
    uploaded_rows_by_run: dict[str, int] = field(default_factory=dict)
    control_seq: int = 0
    # robot id -> its latest station report (comms.cloud.services.station.StationView)
    station: dict[int, StationView] = field(default_factory=dict)

    def metadata_store(self) -> MetadataStore:
        """The metadata store of this server.

        Raises:
            RuntimeError: it has none (a buffer shard's ingest endpoint serves uploads only).
        """
        if self.store is None:
            raise RuntimeError("this server has no metadata store (a shard ingest endpoint)")
        return self.store

    def robot_lock(self, run_id: str, robot_id: int) -> threading.Lock:
        """Serializes one robot's appends to one run across its streams."""
        with self.lock:
            return self.robot_locks.setdefault((run_id, robot_id), threading.Lock())

    def distributor(self, run_id: str) -> WeightDistributor:
        # Called from the event loop (a subscriber) and from the learner's thread: without
        # the lock both could create one, and subscribers would wait on the lost one forever.
        with self.lock:
            dist = self.distributors.get(run_id)
            if dist is None:
                dist = WeightDistributor(
                    run_id,
                    self.settings.weight_chunk_bytes,
                    thread_nice=self.settings.weight_thread_nice,
                )
                self.attach(dist)
            return dist

    def attach(self, dist: WeightDistributor) -> None:
        """Serve ``dist``'s versions to subscribers of its run."""
        with self.lock:
            self.distributors[dist.run_id] = dist
        run_id = dist.run_id
        dist.add_listener(lambda _p: self._wake(run_id))

    def _wake(self, run_id: str) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._set_event, run_id)

    def _set_event(self, run_id: str) -> None:
        ev = self.version_events.pop(run_id, None)
        if ev is not None:
            ev.set()

    def version_event(self, run_id: str) -> asyncio.Event:
        ev = self.version_events.get(run_id)
        if ev is None:
            ev = self.version_events[run_id] = asyncio.Event()
        return ev


def guarded[R](
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Map refusals to status codes; an unexpected error is logged here, never sent as a traceback.

    A unary request is checked first (``comms.cloud.services.requests.checked``): undecodable, or a
    required field empty, it is refused INVALID_ARGUMENT like any :class:`BadRequest`.
    """

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, checked(request), context)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except AuthError as exc:
            code = (
                grpc.StatusCode.UNAUTHENTICATED
                if exc.unauthenticated
                else grpc.StatusCode.PERMISSION_DENIED
            )
            await context.abort(code, str(exc))
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error")
        raise AssertionError("unreachable")  # abort always raises

    return wrapper


async def identify(state: ServerState, context: grpc.aio.ServicerContext) -> RobotIdentity:
    return await asyncio.to_thread(state.auth.identify_call, context.invocation_metadata())


async def write(state: ServerState, context: grpc.aio.ServicerContext, msg: Any) -> None:
    """Write with the idle timeout: a peer that stopped reading is dropped."""
    try:
        await asyncio.wait_for(context.write(msg), state.settings.stream_idle_timeout_s)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED, "peer stopped reading; stream dropped"
        )


class OpenStream:
    """Counts open streams (for tests and /metrics): ``with OpenStream(state): ...``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def __enter__(self) -> None:
        self.state.active_streams += 1

    def __exit__(self, *exc: object) -> None:
        self.state.active_streams -= 1


def server_options(settings: CommsSettings) -> list[tuple[str, Any]]:
    """Keepalive (detects vanished peers) and message limits shared by cloud and relay."""
    ka_ms = int(settings.keepalive_time_s * 1000)
    return [
        ("grpc.keepalive_time_ms", ka_ms),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", max(100, ka_ms // 2)),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.max_receive_message_length", 8 * 1024 * 1024),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]
