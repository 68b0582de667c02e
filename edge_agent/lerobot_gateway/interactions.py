"""LeRobot's per-episode statistics, read without running anything the bytes ask for.

LeRobot's actor sends ``pickle.dumps`` of a flat dict (``Episodic reward``, ``Interaction
step``, ``Episode intervention``, ``Intervention rate``, policy timings). :func:`read_interaction`
parses the pickle with an unpickler that resolves no class or function at all (so a payload
that would call ``os.system`` through ``REDUCE`` fails before anything is called), then checks
that only plain builtin values came out.
"""

from __future__ import annotations

import io
import math
import pickle
import re
from typing import Any

MAX_BYTES = 1 << 20
MAX_DEPTH = 8
PLAIN = (str, int, float, bool, type(None))


class InteractionRefused(ValueError):
    """The bytes are not a plain dict of builtin values (the reason names what was found)."""


class _NoGlobals(pickle.Unpickler):
    """An unpickler with no names: every class or function lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise InteractionRefused(f"the payload names {module}.{name}; only plain values are read")

    def persistent_load(self, pid: Any) -> Any:
        raise InteractionRefused("the payload holds a persistent id; only plain values are read")


def _check(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InteractionRefused(f"{path} nests deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InteractionRefused(f"{path} has a key of type {type(k).__name__}")
            _check(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", depth + 1)
    elif type(value) not in PLAIN:
        raise InteractionRefused(f"{path} is a {type(value).__name__}")


def read_interaction(data: bytes) -> dict[str, Any]:
    """The statistics dict pickled in ``data``.

    Raises:
        InteractionRefused: over ``MAX_BYTES``, not a pickle, a pickle naming any class or
            function, or a value other than dict (str keys) / list / str / int / float / bool /
            None; the top level must be a dict.
    """
    if len(data) > MAX_BYTES:
        raise InteractionRefused(f"{len(data)} bytes, over {MAX_BYTES}")
    try:
        value = _NoGlobals(io.BytesIO(data)).load()
    except InteractionRefused:
        raise
    except Exception as exc:  # any malformed pickle: truncated, bad opcode, bad memo
        raise InteractionRefused(f"not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise InteractionRefused(f"the top level is a {type(value).__name__}, not a dict")
    _check(value, "interaction", 0)
    return value


def as_metrics(interaction: dict[str, Any], prefix: str = "lerobot.") -> dict[str, float]:
    """The finite numbers of ``interaction`` as metric name -> float (``Episodic reward`` ->
    ``lerobot.episodic_reward``, ``Policy frequency [Hz]`` -> ``lerobot.policy_frequency_hz``);
    strings, lists, nested dicts and non-finite numbers are left out."""
    out: dict[str, float] = {}
    for key, value in interaction.items():
        name = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
        if name and isinstance(value, bool | int | float) and math.isfinite(float(value)):
            out[prefix + name] = float(value)
    return out
