"""Pick MuJoCo's off-screen GL backend before MuJoCo is imported: EGL, else OSMesa."""

from __future__ import annotations

import ctypes.util
import os

_LIBS = {"egl": "EGL", "osmesa": "OSMesa"}


def choose_gl_backend() -> str | None:
    """Set ``MUJOCO_GL`` (unless the user did) to the first loadable of egl, osmesa.

    Returns the backend in effect, or None when neither library is installed (rendering then
    fails with a clear error; state-only robots are unaffected).
    """
    current = os.environ.get("MUJOCO_GL")
    if current:
        return current
    for backend, lib in _LIBS.items():
        if ctypes.util.find_library(lib):
            os.environ["MUJOCO_GL"] = backend
            return backend
    return None
