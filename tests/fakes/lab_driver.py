"""A lab's own driver package, written outside the repository as a lab would ship it.

``write_lab_package(root)`` writes the package ``labarm`` under ``root`` (put ``root`` on the
PYTHONPATH of the processes that load it, or on ``sys.path``): ``labarm.arms:LabArm``, a
small state-only robot that passes the driver contract (a slider chasing a goal, dense reward,
its own success detection), next to drivers that break one rule each and modules that cannot
be loaded. ``write_entry_point(root, name, ref)`` declares a ``robofleet.drivers`` entry point
there, as an installed distribution does.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

PACKAGE = "labarm"
DRIVER = f"{PACKAGE}.arms:LabArm"

ARMS = '''
"""The lab's slider arm: a carriage at x in [-1, 1] driven towards a goal."""

import numpy as np

from hal.driver import Applied, RobotDriver
from hal.spec import Capabilities, Feature, RobotSpec


class LabArm(RobotDriver):
    """observation.state (2,) float32 = (x, goal); action (1,) float32 in [-1, 1] moves x by
    gain * action per step; reward -|x - goal| each step, success within 0.05 of the goal."""

    episode_options = frozenset({"tasks", "max_episode_steps", "seed"})

    def __init__(self, name, tasks=None, max_episode_steps=50, seed=None, gain=0.05):
        super().__init__(name)
        self.spec = RobotSpec(
            robot_type="lab-arm",
            observation_features={
                "observation.state": Feature(dtype="float32", shape=(2,), names=["x", "goal"])
            },
            action_features={"action": Feature(dtype="float32", shape=(1,), names=["dx"])},
            control_hz=50.0,
            capabilities=Capabilities(
                can_reset=True, simulated=True, reward="dense", detects_success=True
            ),
            action_low=[-1.0],
            action_high=[1.0],
            max_episode_steps=max_episode_steps,
            tasks=list(tasks or ["slide"]),
        )
        self.gain = float(gain)
        self._seed = seed
        self._x, self._goal = 0.0, 0.5

    def _connect(self):
        return None

    def _disconnect(self):
        return None

    def _reset(self, task, seed):
        rng = np.random.default_rng(self._seed if seed is None else seed)
        self._x, self._goal = 0.0, float(rng.uniform(-0.5, 0.5))
        return self._get_observation()

    def _get_observation(self):
        return {"observation.state": np.array([self._x, self._goal], np.float32)}

    def _apply_action(self, action):
        self._x = float(np.clip(self._x + self.gain * float(action[0]), -1.0, 1.0))
        distance = abs(self._x - self._goal)
        return Applied(sent=action, reward=-distance, success=distance < 0.05)


class NoEstopArm(LabArm):
    """Broken: ignores the e-stop (keeps taking actions)."""

    def estop(self):
        return None


class WrongShapeArm(LabArm):
    """Broken: its observation has a value more than its spec says."""

    def _get_observation(self):
        return {"observation.state": np.array([self._x, self._goal, 0.0], np.float32)}


class NoSpecArm(LabArm):
    """Broken: never sets its spec."""

    def __init__(self, name, **options):
        RobotDriver.__init__(self, name)


class BadSpecArm(LabArm):
    """Broken: a spec built without validation whose bounds do not fit its action."""

    def __init__(self, name, **options):
        super().__init__(name, **options)
        self.spec = RobotSpec.model_construct(**{**dict(self.spec), "action_low": [-1.0, -1.0]})


class NotADriver:
    """Not a RobotDriver at all."""
'''

BROKEN_IMPORT = """
raise RuntimeError("no driver board found")
"""


def write_lab_package(root: Path) -> str:
    """Write ``labarm`` (``arms``: ``LabArm`` and its broken variants; ``broken_import``:
    a module whose import raises) under ``root``; returns the working driver's reference."""
    pkg = root / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""A lab\'s robot drivers."""\n')
    (pkg / "arms.py").write_text(textwrap.dedent(ARMS).lstrip())
    (pkg / "broken_import.py").write_text(textwrap.dedent(BROKEN_IMPORT).lstrip())
    return DRIVER


def write_entry_point(root: Path, name: str, ref: str, dist: str = "labarm") -> None:
    """Declare ``[robofleet.drivers] name = ref`` in a distribution ``dist`` under ``root``
    (what ``pip install`` of a package with that entry point leaves on sys.path)."""
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[robofleet.drivers]\n{name} = {ref}\n")
