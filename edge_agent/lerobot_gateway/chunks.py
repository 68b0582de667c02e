"""Reassembly of LeRobot's chunked gRPC messages (``lerobot.transport.utils``).

LeRobot's sender cuts one message into chunks of ``CHUNK_SIZE`` bytes: ``TRANSFER_BEGIN``,
``TRANSFER_MIDDLE``..., ``TRANSFER_END``; a message of one chunk is a lone ``TRANSFER_END``.
The assembler enforces that order and a size bound (an actor cannot make the gateway hold an
unbounded buffer).
"""

from __future__ import annotations

from lerobot.transport import services_pb2

TransferState = services_pb2.TransferState  # type: ignore[attr-defined]
BEGIN = TransferState.TRANSFER_BEGIN
MIDDLE = TransferState.TRANSFER_MIDDLE
END = TransferState.TRANSFER_END


class ChunkError(ValueError):
    """A chunk out of LeRobot's order, of an unknown state, or past the size bound."""


class ChunkAssembler:
    """Joins chunks into whole messages.

    Args:
        max_bytes: the largest message accepted (bytes).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._open = False

    def add(self, state: int, data: bytes) -> bytes | None:
        """Take one chunk; returns the whole message at its ``TRANSFER_END``, else None.

        Raises:
            ChunkError: an unknown state, a MIDDLE with no BEGIN before it, or a message over
                ``max_bytes`` (the partial message is discarded).
        """
        if state == BEGIN:
            self._parts, self._size, self._open = [], 0, True
        elif state == MIDDLE and not self._open:
            raise ChunkError("a TRANSFER_MIDDLE chunk with no TRANSFER_BEGIN before it")
        elif state not in (MIDDLE, END):
            raise ChunkError(f"unknown transfer state {state}")
        self._size += len(data)
        if self._size > self.max_bytes:
            self._parts, self._size, self._open = [], 0, False
            raise ChunkError(f"a message over {self.max_bytes} bytes")
        self._parts.append(data)
        if state != END:
            return None
        message = b"".join(self._parts)
        self._parts, self._size, self._open = [], 0, False
        return message
