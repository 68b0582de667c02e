"""Whether robots can share one run's policy: their enrolled specs, feature by feature.

A run's buffer schema and its policy's inputs and outputs come from the leased robots' specs
(``hal.spec.RobotSpec``, stored at enrollment and refreshed by each idle robot computer). Every
robot of a run must offer the same observation and action features (same keys, dtypes and
shapes): the first robot (by name) sets them and each other one is compared with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hal.spec import Feature, RobotSpec


class SpecMismatch(ValueError):
    """Robots whose specs one policy cannot take; the message names feature and robots."""


@dataclass(frozen=True)
class RunFeatures:
    """The features every robot of a run offers (LeRobot feature dicts, JSON-ready)."""

    observation_features: dict[str, dict[str, Any]]
    action_features: dict[str, dict[str, Any]]
    control_hz: float

    @property
    def state_dim(self) -> int:
        shape = self.observation_features.get("observation.state", {}).get("shape", [0])
        return int(shape[0]) if shape else 1

    @property
    def action_dim(self) -> int:
        shape = self.action_features["action"]["shape"]
        return int(shape[0]) if shape else 1


def robot_spec(name: str, spec: Mapping[str, Any]) -> RobotSpec:
    """A stored spec as a :class:`RobotSpec`.

    Raises:
        SpecMismatch: the stored spec is not a valid robot spec (names the robot).
    """
    try:
        return RobotSpec.from_dict(dict(spec))
    except ValueError as exc:
        raise SpecMismatch(f"robot {name}: its enrolled spec is not usable: {exc}") from None


def _describe(f: Feature) -> str:
    return f"{f.dtype} {list(f.shape)}"


def _compare(
    side: str, first: str, ref: dict[str, Feature], name: str, other: dict[str, Feature]
) -> list[str]:
    problems = []
    for key in sorted(set(ref) | set(other)):
        if key not in other:
            problems.append(f"{key}: missing on {name} (present on {first})")
        elif key not in ref:
            problems.append(f"{key}: on {name} but not on {first}")
        elif (ref[key].dtype, ref[key].shape) != (other[key].dtype, other[key].shape):
            problems.append(
                f"{key}: {_describe(other[key])} on {name} != {_describe(ref[key])} on {first}"
            )
    return [f"{side} {p}" if side else p for p in problems]


def run_features(specs: Mapping[str, Mapping[str, Any]], need_state: bool = True) -> RunFeatures:
    """The features of robots ``specs`` (name -> stored spec dict) share.

    Args:
        need_state: the policy acts on ``observation.state`` (every robofleet edge policy
            does today): a robot without it is refused.

    Raises:
        SpecMismatch: no robots, a robot's spec is invalid or lacks ``observation.state``, or
            two robots differ in a feature (each difference named, e.g.
            ``action: float32 [7] on arm-2 != float32 [4] on arm-1``).
    """
    if not specs:
        raise SpecMismatch("no robots to take the run's features from")
    parsed = {name: robot_spec(name, spec) for name, spec in sorted(specs.items())}
    names: Sequence[str] = list(parsed)
    first = names[0]
    ref = parsed[first]
    problems: list[str] = []
    for name in names:
        spec = parsed[name]
        if need_state and "observation.state" not in spec.observation_features:
            problems.append(f"observation.state: missing on {name} (the policy acts on it)")
        if name == first:
            continue
        problems += _compare("", first, ref.observation_features, name, spec.observation_features)
        problems += _compare("", first, ref.action_features, name, spec.action_features)
    if problems:
        raise SpecMismatch("; ".join(problems))
    dump = ref.to_dict()
    return RunFeatures(dump["observation_features"], dump["action_features"], ref.control_hz)
