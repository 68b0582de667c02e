"""A stand-in for cython-hidapi (module ``hid``) with SpaceMice plugged into it.

:class:`FakeHid` offers what ``edge_agent.spacemouse`` calls on the module (``enumerate``,
``device``) and :class:`FakeHidDevice` what it calls on a device (``open_path``,
``set_nonblocking``, ``read``, ``close``), with hidapi's behaviour for each: ``enumerate``
gives dicts with hidapi's keys; an unopened device's ``read`` / ``set_nonblocking`` raise
``ValueError("not open")``; ``open_path`` of an absent or forbidden path raises
``OSError("open failed")``; a non-blocking ``read`` returns ``[]`` when nothing is pending
and raises ``OSError("read error")`` once the device is unplugged; ``close`` may be called
twice. ``tests/edge_agent/test_spacemouse.py::test_the_fake_keeps_hidapis_contract`` runs the
parts of this contract that need no hardware against the real ``hid`` module as well.

Reports are queued as real bytes (:func:`classic_translation`, :func:`wireless_motion`...).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

SPACEMOUSE_COMPACT = (0x256F, 0xC635)
SPACEMOUSE_WIRELESS = (0x256F, 0xC62E)


def classic_translation(x: int, y: int, z: int) -> list[int]:
    """Report 1 of the classic layout: x, y, z int16 little-endian."""
    return [1, *struct.pack("<3h", x, y, z)]


def classic_rotation(rx: int, ry: int, rz: int) -> list[int]:
    """Report 2 of the classic layout: rx, ry, rz int16 little-endian."""
    return [2, *struct.pack("<3h", rx, ry, rz)]


def wireless_motion(x: int, y: int, z: int, rx: int, ry: int, rz: int) -> list[int]:
    """The 13-byte report 1 of newer wireless models: all six axes."""
    return [1, *struct.pack("<6h", x, y, z, rx, ry, rz)]


def buttons(mask: int) -> list[int]:
    """Report 3: the button bitmask (bit 0 the left button), two bytes."""
    return [3, *mask.to_bytes(2, "little")]


class FakeHid:
    """The ``hid`` module with devices plugged in by path (see the module doc)."""

    def __init__(self) -> None:
        self.infos: dict[bytes, dict[str, Any]] = {}
        self.queues: dict[bytes, deque[list[int]]] = {}
        self.forbidden: set[bytes] = set()  # paths whose node this user may not open
        self.opened: list[FakeHidDevice] = []

    def plug(
        self,
        path: bytes = b"/dev/hidraw3",
        ids: tuple[int, int] = SPACEMOUSE_COMPACT,
        product: str = "SpaceMouse Compact",
        usage: tuple[int, int] = (1, 8),
    ) -> bytes:
        self.infos[path] = {
            "path": path,
            "vendor_id": ids[0],
            "product_id": ids[1],
            "serial_number": "",
            "release_number": 0x0100,
            "manufacturer_string": "3Dconnexion",
            "product_string": product,
            "usage_page": usage[0],
            "usage": usage[1],
            "interface_number": 0,
        }
        self.queues[path] = deque()
        return path

    def unplug(self, path: bytes = b"/dev/hidraw3") -> None:
        del self.infos[path]

    def send(self, *reports: list[int], path: bytes = b"/dev/hidraw3") -> None:
        """Reports the device sends (read in order by the next reads)."""
        self.queues[path].extend(reports)

    # -- hidapi's module API --------------------------------------------------------------

    def enumerate(self, vendor_id: int = 0, product_id: int = 0) -> list[dict[str, Any]]:
        return [
            dict(info)
            for info in self.infos.values()
            if vendor_id in (0, info["vendor_id"]) and product_id in (0, info["product_id"])
        ]

    def device(self) -> FakeHidDevice:
        return FakeHidDevice(self)


class FakeHidDevice:
    """``hid.device``: the four methods the operator calls (see the module doc)."""

    def __init__(self, hid: FakeHid) -> None:
        self._hid = hid
        self._path: bytes | None = None
        self.nonblocking = False

    def open_path(self, path: bytes) -> None:
        if not isinstance(path, bytes):
            raise TypeError(f"expected bytes, {type(path).__name__} found")  # as hidapi's
        if path not in self._hid.infos or path in self._hid.forbidden:
            raise OSError("open failed")
        self._path = path
        self._hid.opened.append(self)

    def set_nonblocking(self, v: int) -> int:
        if self._path is None:
            raise ValueError("not open")
        self.nonblocking = bool(v)
        return 0

    def read(self, max_length: int, timeout_ms: int = 0) -> list[int]:
        if self._path is None:
            raise ValueError("not open")
        if self._path not in self._hid.infos:
            raise OSError("read error")
        queue = self._hid.queues[self._path]
        if not queue:
            if not self.nonblocking and timeout_ms == 0:
                raise AssertionError("a blocking read with nothing pending would never return")
            return []
        return queue.popleft()[:max_length]

    def close(self) -> None:
        self._path = None

    @property
    def is_open(self) -> bool:
        return self._path is not None
