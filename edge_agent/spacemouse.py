"""A 3Dconnexion SpaceMouse as a robofleet operator (``robofleet edge --operator spacemouse``).

The device is read through hidapi (PyPI ``hidapi``, module ``hid``; ``backend=hidraw`` picks its
Linux hidraw build) and its reports are parsed here (:func:`parse_report`):

* the classic layout: report 1 = translation ``x, y, z``, report 2 = rotation ``rx, ry, rz``,
  each three int16 little-endian; report 3 = the buttons, a little-endian bitmask;
* newer wireless models: one 13-byte report 1 with translation and rotation together.

Axis values span about +/-350 counts at full deflection. Each becomes a delta in [-1, 1]
(:func:`to_deltas`): the device's frame (y toward the person, z down) turned into the robot's
(x right, y away from the person, z up, as the device sits in front of the person), a deadzone
that reads as 0 and rises from 0 at its edge (no step when the cap leaves it), then
``translation_scale`` / ``rotation_scale``.

Actions are end-effector deltas mapped by name onto the robot's action vector: ``delta_x``,
``delta_y``, ``delta_z`` (translation, required), ``delta_rx``, ``delta_ry``, ``delta_rz``
(rotation, where the robot takes it) and ``gripper``. A robot with any other action dimension
(joint positions of an SO-101 follower) is refused when the operator is built, naming both.

Buttons: ``takeover_button`` (default 0, the left) toggles between autonomous and taken over;
``gripper_button`` (default 1) toggles the gripper (``gripper_mode=hold``: closed while held).
While taken over, a released cap (every axis inside the deadzone) holds the arm still.

A read error (unplugged, a receiver out of range) is logged with the device's name and the
device is reopened every ``reopen_s``; until then a takeover holds the robot (zero deltas,
gripper as it was) with the reason ``device_lost`` and an autonomous robot goes on.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput

log = logging.getLogger(__name__)

VENDORS = (0x046D, 0x256F)  # Logitech (older 3Dconnexion devices), 3Dconnexion
# 0x046d is Logitech's: only its 3Dconnexion product ids count (SpaceMouse Plus XT .. Compact).
LOGITECH_3DX_PRODUCTS = range(0xC603, 0xC640)
FULL_SCALE = 350.0  # counts at full deflection
TRANSLATION = ("delta_x", "delta_y", "delta_z")
ROTATION = ("delta_rx", "delta_ry", "delta_rz")
GRIPPER = "gripper"
DRIVES = (*TRANSLATION, *ROTATION, GRIPPER)
# Device frame (x right, y toward the person, z down) -> robot frame (x right, y away, z up):
# a half turn about x, which flips y and z for both translation and rotation.
FRAME_SIGNS = np.array([1, -1, -1, 1, -1, -1], np.float32)
OPTIONS = (
    "path",
    "vendor",
    "product",
    "backend",
    "translation_scale",
    "rotation_scale",
    "deadzone",
    "takeover_button",
    "gripper_button",
    "gripper_mode",
    "gripper_open",
    "gripper_closed",
    "invert",
    "action_map",
    "reopen_s",
)
UDEV_RULE = (
    'KERNEL=="hidraw*", ATTRS{idVendor}=="256f", TAG+="uaccess" and the same with '
    'SUBSYSTEM=="usb" in /etc/udev/rules.d/99-spacemouse.rules (046d devices: docs/edge_agent.md), '
    "then udevadm control --reload && udevadm trigger, and replug"
)


class SpaceMouseUnavailable(ValueError):
    """No SpaceMouse was found, or it could not be opened; the message names what was looked
    for and what to do."""


@dataclass(frozen=True)
class Report:
    """One parsed HID report: raw counts (int, device frame) for the axes it carries."""

    translation: tuple[int, int, int] | None = None
    rotation: tuple[int, int, int] | None = None
    buttons: int | None = None


def parse_report(data: Sequence[int]) -> Report | None:
    """One input report, its report id first (as ``hid.device.read`` returns it).

    Returns None for a report id that carries no motion or buttons (battery, LEDs).

    Raises:
        ValueError: report 1, 2 or 3 shorter than its layout.
    """
    if not data:
        return None
    rid, body = data[0], bytes(data[1:])
    if rid == 1 and len(body) >= 12:  # newer wireless: translation and rotation together
        x, y, z, rx, ry, rz = struct.unpack_from("<6h", body)
        return Report(translation=(x, y, z), rotation=(rx, ry, rz))
    if rid in (1, 2):
        if len(body) < 6:
            raise ValueError(f"SpaceMouse report {rid} has {len(body)} bytes after its id, not 6")
        axes = struct.unpack_from("<3h", body)
        return Report(translation=axes) if rid == 1 else Report(rotation=axes)
    if rid == 3:
        if not body:
            raise ValueError("SpaceMouse button report 3 has no bytes after its id")
        return Report(buttons=int.from_bytes(body, "little"))
    return None


def to_deltas(
    raw: np.ndarray,
    *,
    deadzone: float = 0.1,
    translation_scale: float = 1.0,
    rotation_scale: float = 1.0,
    invert: Sequence[int] = (),
) -> np.ndarray:
    """Raw counts ``(6,)`` (x, y, z, rx, ry, rz, device frame) -> deltas ``(6,) float32`` in the
    robot's frame: each in [-1, 1] before scaling, 0 inside ``deadzone`` (a fraction of full
    deflection), rising linearly from 0 at its edge; ``invert``: indices negated after that.
    """
    v = np.clip(np.asarray(raw, np.float32) / FULL_SCALE, -1.0, 1.0) * FRAME_SIGNS
    mag = np.maximum(np.abs(v) - deadzone, 0.0) / (1.0 - deadzone)
    out = (np.sign(v) * mag).astype(np.float32)
    out[:3] *= translation_scale
    out[3:] *= rotation_scale
    for i in invert:
        out[i] = -out[i]
    return out + 0.0  # no -0.0 in recorded actions


def action_slots(
    action_features: Mapping[str, Any], action_map: Mapping[str, Any] | None = None
) -> list[int]:
    """For each dimension of the robot's ``action`` vector, the index into
    ``(*translation, *rotation, gripper)`` (``DRIVES``) that fills it.

    ``action_map`` renames: ``{"delta_x": "dx", ...}`` (SpaceMouse name -> robot name).

    Raises:
        ValueError: the robot's action names no dimensions, names one a SpaceMouse does not
            drive (joint positions), or lacks a translation axis; the message names both sets.
    """
    action_map = dict(action_map or {})
    stray = sorted(set(action_map) - set(DRIVES))
    if stray:
        raise ValueError(f"action_map names {stray}; a SpaceMouse drives {list(DRIVES)}")
    feat = action_features.get("action")
    names = feat.get("names") if isinstance(feat, Mapping) else getattr(feat, "names", None)
    if set(action_features) != {"action"} or not names:
        raise ValueError(
            "--operator spacemouse gives end-effector deltas by name, and this robot's action "
            f"features name no dimensions: {dict(action_features)}"
        )
    robot_names = [str(n) for n in names]
    by_robot = {str(action_map.get(d, d)): i for i, d in enumerate(DRIVES)}
    undriven = [n for n in robot_names if n not in by_robot]
    untranslated = [
        action_map.get(d, d) for d in TRANSLATION if action_map.get(d, d) not in robot_names
    ]
    if undriven or untranslated:
        raise ValueError(
            f"--operator spacemouse drives end-effector deltas {list(by_robot)}, and this robot's "
            f"action is {robot_names}: nothing drives {undriven or untranslated}; a robot with "
            "joint-position actions needs a leader arm (--operator lerobot), one with other "
            'delta names --operator-option action_map=\'{"delta_x": "dx"}\''
        )
    return [by_robot[n] for n in robot_names]


def matching_devices(
    hid: Any, vendor: int | None = None, product: int | None = None
) -> list[dict[str, Any]]:
    """``hid.enumerate()`` entries that are SpaceMice: a 3Dconnexion vendor id (or
    ``vendor``), ``product`` when given, and a multi-axis controller (HID usage page 1, usage 8)
    where the backend reports usages (a receiver's other interfaces are skipped)."""
    found = []
    for info in hid.enumerate(vendor or 0, product or 0):
        vid, pid = int(info.get("vendor_id", 0)), int(info.get("product_id", 0))
        if vendor is None and vid not in VENDORS:
            continue
        if (
            vendor is None
            and product is None
            and vid == 0x046D
            and pid not in LOGITECH_3DX_PRODUCTS
        ):
            continue
        if product is not None and pid != product:
            continue
        page, usage = int(info.get("usage_page") or 0), int(info.get("usage") or 0)
        if page and (page, usage) != (1, 8):
            continue
        found.append(info)
    return found


def _int(options: Mapping[str, Any], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except ValueError:
        raise ValueError(
            f"--operator-option {key}={value!r}: expected an id (0x256f or 9583)"
        ) from None


def _looked_for(path: str | None, vendor: int | None, product: int | None) -> str:
    if path:
        return f"the HID device at {path}"
    vendors = f"{vendor:#06x}" if vendor is not None else " or ".join(f"{v:#06x}" for v in VENDORS)
    return f"a SpaceMouse (vendor {vendors}" + (f", product {product:#06x})" if product else ")")


def open_device(hid: Any, path: str | bytes) -> Any:
    """An opened, non-blocking ``hid.device`` at ``path``.

    Raises:
        SpaceMouseUnavailable: it could not be opened; names the path and the udev rule.
    """
    raw_path = path.encode() if isinstance(path, str) else path
    device = hid.device()
    try:
        device.open_path(raw_path)
        device.set_nonblocking(1)
    except (OSError, ValueError) as exc:
        text = raw_path.decode(errors="replace")
        why = ""
        if text.startswith("/dev/") and not os.path.exists(text):
            why = "; there is no such device node"
        elif text.startswith("/dev/") and not os.access(text, os.R_OK | os.W_OK):
            why = "; this user may not read and write it"
        raise SpaceMouseUnavailable(
            f"SpaceMouse at {text}: cannot open it ({type(exc).__name__}: {exc}){why}; "
            f"if it is plugged in, allow access with the udev rule {UDEV_RULE}"
        ) from exc
    return device


def find_and_open(hid: Any, options: Mapping[str, Any]) -> tuple[Any, str]:
    """The device ``options`` (``path`` / ``vendor`` / ``product``) name, opened, and its name.

    Raises:
        SpaceMouseUnavailable: none found (naming what was looked for) or it cannot be opened.
    """
    path = options.get("path")
    vendor, product = _int(options, "vendor"), _int(options, "product")
    if path:
        return open_device(hid, str(path)), f"SpaceMouse at {path}"
    found = matching_devices(hid, vendor, product)
    if not found:
        raise SpaceMouseUnavailable(
            f"no SpaceMouse found: looked for {_looked_for(None, vendor, product)} among "
            "hidapi's devices; check that it is plugged in (a wireless one: its receiver, "
            f"powered on), or that this user may see it (udev rule {UDEV_RULE}); "
            "or name it with --operator-option path=/dev/hidrawN"
        )
    info = found[0]
    label = str(info.get("product_string") or "SpaceMouse")
    ids = f"{int(info['vendor_id']):04x}:{int(info['product_id']):04x}"
    name = f"{label} ({ids})"
    return open_device(hid, info["path"]), name


class SpaceMouseOperator:
    """A SpaceMouse behind robofleet's ``InterventionSource`` (see the module doc).

    Args:
        opener: ``() -> (device, name)``, an opened non-blocking ``hid.device`` (called once
            here and again after a loss); raises :class:`SpaceMouseUnavailable`.
        slots: per robot action dimension, its index in ``DRIVES`` (:func:`action_slots`).
        deadzone, translation_scale, rotation_scale, invert: as :func:`to_deltas`.
        takeover_button / gripper_button: bit indices of the button report.
        gripper_mode: ``toggle`` or ``hold``; gripper_open / gripper_closed: its two values.
        reopen_s: seconds between reopen attempts after a loss; clock: seconds, monotonic.

    Raises:
        SpaceMouseUnavailable: the first open fails.
    """

    MAX_REPORTS = 512  # per step: the device sends a few hundred a second at most

    def __init__(
        self,
        opener: Callable[[], tuple[Any, str]],
        slots: Sequence[int],
        *,
        deadzone: float = 0.1,
        translation_scale: float = 1.0,
        rotation_scale: float = 1.0,
        invert: Sequence[int] = (),
        takeover_button: int = 0,
        gripper_button: int = 1,
        gripper_mode: str = "toggle",
        gripper_open: float = -1.0,
        gripper_closed: float = 1.0,
        reopen_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if gripper_mode not in ("toggle", "hold"):
            raise ValueError(f"--operator-option gripper_mode={gripper_mode!r}: toggle or hold")
        if takeover_button == gripper_button:
            raise ValueError(
                f"--operator-option takeover_button and gripper_button are both {gripper_button}"
            )
        if not 0.0 <= deadzone < 1.0:
            raise ValueError(f"--operator-option deadzone={deadzone}: a fraction in [0, 1)")
        self.opener = opener
        self.slots = list(slots)
        self.deadzone = deadzone
        self.translation_scale = translation_scale
        self.rotation_scale = rotation_scale
        self.invert = tuple(invert)
        self.takeover_button = takeover_button
        self.gripper_button = gripper_button
        self.gripper_mode = gripper_mode
        self.gripper_values = (gripper_open, gripper_closed)
        self.reopen_s = reopen_s
        self.clock = clock
        self.active = False
        self.closed_grip = False
        self.takeovers = 0
        self.losses = 0
        self.lost: str | None = None  # why the device is gone, while it is
        self._raw = np.zeros(6, np.int32)
        self._buttons = 0
        self._next_open = 0.0
        self.device, self.name = opener()

    # -- device ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Read every pending report; a read error marks the device lost."""
        if self.device is None:
            self._reopen()
            return
        try:
            for _ in range(self.MAX_REPORTS):
                data = self.device.read(64)
                if not data:
                    break
                self._apply(data)
        except (OSError, ValueError) as exc:
            self._lose(f"{type(exc).__name__}: {exc}")

    def _apply(self, data: Sequence[int]) -> None:
        try:
            report = parse_report(data)
        except ValueError as exc:
            log.warning("%s: ignored a report: %s", self.name, exc)
            return
        if report is None:
            return
        if report.translation is not None:
            self._raw[:3] = report.translation
        if report.rotation is not None:
            self._raw[3:] = report.rotation
        if report.buttons is not None:
            pressed = report.buttons & ~self._buttons
            if pressed >> self.takeover_button & 1:
                self.active = not self.active
                self.takeovers += int(self.active)
            if self.gripper_mode == "toggle" and pressed >> self.gripper_button & 1:
                self.closed_grip = not self.closed_grip
            elif self.gripper_mode == "hold":
                self.closed_grip = bool(report.buttons >> self.gripper_button & 1)
            self._buttons = report.buttons

    def _lose(self, why: str) -> None:
        self.losses += 1
        self.lost = why
        log.warning(
            "%s lost (%s)%s; reopening every %.1f s",
            self.name,
            why,
            ": holding the robot still" if self.active else "",
            self.reopen_s,
        )
        try:
            self.device.close()
        except (OSError, ValueError):
            pass
        self.device = None
        self._raw[:] = 0  # no stale motion when it comes back
        self._buttons = 0
        self._next_open = self.clock() + self.reopen_s

    def _reopen(self) -> None:
        now = self.clock()
        if now < self._next_open:
            return
        self._next_open = now + self.reopen_s
        try:
            self.device, self.name = self.opener()
        except SpaceMouseUnavailable as exc:
            log.debug("%s still gone: %s", self.name, exc)
            return
        log.warning("%s is back (it was lost: %s)", self.name, self.lost)
        self.lost = None

    # -- InterventionSource ---------------------------------------------------------------

    def action(self) -> np.ndarray:
        """The robot's action ``(A,) float32`` from the current cap and gripper (zero deltas
        while the device is lost)."""
        deltas = to_deltas(
            self._raw,
            deadzone=self.deadzone,
            translation_scale=self.translation_scale,
            rotation_scale=self.rotation_scale,
            invert=self.invert,
        )
        drives = np.append(deltas, self.gripper_values[int(self.closed_grip)]).astype(np.float32)
        return drives[self.slots]

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        self._drain()
        if not self.active:
            return OperatorInput(False, None, None, "")
        if self.device is None:
            return OperatorInput(True, self.action(), None, "device_lost")
        return OperatorInput(True, self.action(), None, "spacemouse")

    def reset(self) -> None:
        """A new episode starts autonomous, its gripper open."""
        self.active = False
        self.closed_grip = False

    def close(self) -> None:
        if self.device is not None:
            try:
                self.device.close()
            finally:
                self.device = None


def _float(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--operator-option {key}={value!r}: expected a number") from None


def make_spacemouse_operator(
    options: Mapping[str, Any], action_features: Mapping[str, Any], *, hid: Any = None
) -> SpaceMouseOperator:
    """Check the robot's actions, then find and open the SpaceMouse ``options`` describe.

    Args:
        options: ``--operator-option`` pairs (``OPTIONS``; see docs/edge_agent.md).
        action_features: the robot's (a hal driver's).
        hid: the hidapi module (default: ``hid``, or ``hidraw`` with ``backend=hidraw`` or a
            ``/dev/hidraw`` path, imported here); tests pass a stand-in with ``enumerate`` and
            ``device``.

    Raises:
        ValueError: an unknown or bad option, or a robot whose actions are not end-effector
            deltas (named, :func:`action_slots`).
        SpaceMouseUnavailable: hidapi is missing, or no device was found or opened.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"--operator-option {', '.join(unknown)}: not a spacemouse option; its options: "
            f"{list(OPTIONS)}"
        )
    action_map = options.get("action_map") or {}
    if not isinstance(action_map, Mapping):
        raise ValueError(f"--operator-option action_map: a JSON object, not {action_map!r}")
    slots = action_slots(action_features, action_map)
    invert = options.get("invert") or []
    names = ["x", "y", "z", "rx", "ry", "rz"]
    invert = invert.split(",") if isinstance(invert, str) else list(invert)
    bad = [a for a in invert if a not in names]
    if bad:
        raise ValueError(f"--operator-option invert: {bad} are not axes; axes: {names}")
    if hid is None:
        # /dev/hidrawN paths are the hidraw build's; the default build's are USB bus paths.
        default = "hidraw" if str(options.get("path", "")).startswith("/dev/hidraw") else "hid"
        backend = str(options.get("backend", default))
        if backend not in ("hid", "hidraw"):
            raise ValueError(f"--operator-option backend={backend!r}: hid or hidraw")
        try:
            import importlib

            hid = importlib.import_module(backend)
        except ImportError as exc:
            raise SpaceMouseUnavailable(
                f"--operator spacemouse needs hidapi ({exc}); pip install 'robofleet[edge]'"
            ) from None
    module = hid
    return SpaceMouseOperator(
        lambda: find_and_open(module, options),
        slots,
        deadzone=_float(options, "deadzone", 0.1),
        translation_scale=_float(options, "translation_scale", 1.0),
        rotation_scale=_float(options, "rotation_scale", 1.0),
        invert=[names.index(a) for a in invert],
        takeover_button=int(_float(options, "takeover_button", 0)),
        gripper_button=int(_float(options, "gripper_button", 1)),
        gripper_mode=str(options.get("gripper_mode", "toggle")),
        gripper_open=_float(options, "gripper_open", -1.0),
        gripper_closed=_float(options, "gripper_closed", 1.0),
        reopen_s=_float(options, "reopen_s", 1.0),
    )


__all__: Sequence[str] = (
    "SpaceMouseOperator",
    "SpaceMouseUnavailable",
    "action_slots",
    "make_spacemouse_operator",
    "parse_report",
    "to_deltas",
)
