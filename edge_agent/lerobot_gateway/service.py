"""LeRobot's ``transport.LearnerService``, served by the gateway to one robot's actor.

The service class and messages are the installed ``lerobot`` package's generated ones, so an
unmodified ``lerobot.rl.actor`` connects to it as to LeRobot's learner. Unlike that learner:

* ``Ready`` answers only once the gateway is assigned to a run that has a first version;
* every wait checks, each ``poll_s``, whether the actor is still there: a stream of an actor
  that died ends and frees its thread, so a replacement actor is served (no hang at
  ``Ready``, lerobot#3979);
* parameters go to every open stream, latest version only; each message is whole
  (LeRobot's ``send_bytes_in_chunks``);
* transitions are loaded with ``weights_only=True`` and checked (``transitions``), and
  each message is durable in the run's spool before the next one is read; messages a retried
  call replays are recognised and not stored twice (``replay``);
* interactions are read by the restricted reader (``interactions``), never ``pickle``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
from lerobot.transport import services_pb2, services_pb2_grpc
from lerobot.transport.utils import send_bytes_in_chunks

from edge_agent.lerobot_gateway.chunks import ChunkAssembler, ChunkError
from edge_agent.lerobot_gateway.interactions import (
    InteractionRefused,
    as_metrics,
    read_interaction,
)
from edge_agent.lerobot_gateway.replay import CallCursor
from edge_agent.lerobot_gateway.state import GatewayState
from edge_agent.lerobot_gateway.transitions import TransitionRefused

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024**2


class GatewayService(services_pb2_grpc.LearnerServiceServicer):  # type: ignore[misc]
    """The servicer (register with ``add_LearnerServiceServicer_to_server``).

    Args:
        state: shared with the gateway.
        poll_s: how often a waiting call checks that its actor is still connected (s).
        max_message_bytes: the largest reassembled transitions / interactions message.
    """

    def __init__(
        self, state: GatewayState, poll_s: float = 0.5, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.state = state
        self.poll_s = poll_s
        self.max_message_bytes = max_message_bytes

    def Ready(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        while not self.state.wait_ready(self.poll_s):
            if self.state.stopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is stopping")
            if not context.is_active():
                return services_pb2.Empty()  # the actor is gone; nobody reads this
        return services_pb2.Empty()

    def StreamParameters(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        st = self.state
        with st.cond:
            st.counters.parameter_streams += 1
        sent = -1
        try:
            while context.is_active() and not st.stopping:
                got = st.wait_newer(sent, self.poll_s)
                if got is None:
                    continue
                version, data = got
                chunks = list(send_bytes_in_chunks(data, services_pb2.Parameters))
                yield from chunks[:-1]
                # Counted as handed before its last chunk goes out: transitions the actor
                # sends once it has the version are then never stamped with an older one.
                sent = version
                with st.cond:
                    st.handed_version = max(st.handed_version, version)
                    st.counters.parameters_sent += 1
                yield chunks[-1]
                log.info("version %d handed to the actor", version)
        finally:
            with st.cond:
                st.counters.parameter_streams -= 1
                if not context.is_active():
                    st.counters.streams_freed += 1

    def SendTransitions(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        # No response headers before the end: the call stays retryable, so LeRobot's channel
        # replays it after a dropped connection (the replayed messages are recognised, .replay).
        cursors: dict[str, CallCursor] = {}
        for message in self._messages(request_iterator, "transitions"):
            self._store(message, context, cursors)
        return services_pb2.Empty()

    def SendInteractions(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        st = self.state
        for message in self._messages(request_iterator, "interactions"):
            try:
                metrics = as_metrics(read_interaction(message))
            except InteractionRefused as exc:
                log.warning("interaction refused: %s", exc)
                with st.cond:
                    st.counters.interactions_refused += 1
                st.refuse(f"interaction: {exc}")
                continue
            with st.cond:
                st.counters.interactions += 1
                st.metrics.update(metrics)
        return services_pb2.Empty()

    # -- helpers ---------------------------------------------------------------------------

    def _messages(self, request_iterator: Any, what: str) -> Iterator[bytes]:
        """Whole messages of a chunked client stream; a broken message is counted and
        skipped (the stream stays open: LeRobot's actor does not reopen it)."""
        asm = ChunkAssembler(self.max_message_bytes)
        for item in request_iterator:
            try:
                message = asm.add(item.transfer_state, item.data)
            except ChunkError as exc:
                with self.state.cond:
                    self.state.counters.messages_refused += 1
                self.state.refuse(f"{what}: {exc}")
                continue
            if message is not None:
                yield message

    def _store(
        self, message: bytes, context: grpc.ServicerContext, cursors: dict[str, CallCursor]
    ) -> None:
        st = self.state
        run = None
        while run is None:  # between runs the actor's stream waits (its queue holds the rest)
            run = st.wait_run(self.poll_s)
            if st.stopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is stopping")
            if run is None and not context.is_active():
                return
        with st.cond:
            version = st.handed_version
        cursor = cursors.get(run.run_id)
        if cursor is None:
            cursor = cursors[run.run_id] = run.replay_guard.call()
        if cursor.replayed(message):
            cursor.record(message)
            with st.cond:
                st.counters.messages_replayed += 1
            return
        try:
            stored, refused = run.store_transitions(message, version)
        except TransitionRefused as exc:
            log.warning("transitions refused: %s", exc)
            cursor.record(message)
            with st.cond:
                st.counters.messages_refused += 1
            st.refuse(str(exc))
            return
        cursor.record(message)
        with st.cond:
            st.counters.transitions_stored += stored
            if run.replaces_reward:
                st.counters.rewards_replaced += stored
            st.counters.transitions_refused += len(refused)
        for reason in refused:
            log.warning("transition refused: %s", reason)
            st.refuse(reason)
