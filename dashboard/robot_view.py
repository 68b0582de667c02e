"""What the fleet shows of a robot beyond its row: what it does now and what it is.

* :func:`activity`: idle, assigned to a run (and its state there), leased but not acting yet,
  refused a run (the robot computer's reason), offline, e-stopped, unhealthy, enrolled (never
  heard from) or retired. It reads the robot's status (the scheduler's lifecycle), its lease
  and its last heartbeat (``robot.stats``: ``state`` and ``run_id`` as the robot computer
  reports them, ``refused`` when it refused a run; written by comms' registry).
* :func:`spec_summary`: the enrolled spec's feature shapes, cameras and control rate, and the
  robot computer's driver and operator (``robot.spec["computer"]``).

Both read stored JSON defensively: a field that is missing or of another shape is left out.
"""

from __future__ import annotations

from typing import Any

from dashboard.schemas import ActivityState, CameraOut, RobotActivity, RobotSpecSummary
from foundation.store.models import Robot, RobotStatus

# Heartbeat states of a robot computer acting in the run its heartbeat names
# (edge_agent.host while the run's agent starts, then the agent's own).
IN_RUN = frozenset({"starting", "running", "resetting", "paused", "estopped", "stopped"})

_BY_STATUS: dict[RobotStatus, ActivityState] = {
    RobotStatus.RETIRED: "retired",
    RobotStatus.OFFLINE: "offline",
    RobotStatus.ESTOPPED: "estopped",
    RobotStatus.UNHEALTHY: "unhealthy",
    RobotStatus.ENROLLED: "enrolled",
}


def activity(robot: Robot, lease_run: str | None) -> RobotActivity:
    """What ``robot`` does now; ``lease_run``: the run holding its active lease, if any."""
    stats: dict[str, Any] = robot.stats if isinstance(robot.stats, dict) else {}
    beat = str(stats.get("state") or "")
    beat_run = str(stats.get("run_id") or "") or None
    in_run = beat in IN_RUN and beat_run is not None
    state = _BY_STATUS.get(robot.status)
    if state is None and beat == "estopped":
        state = "estopped"
    if state is not None:
        return RobotActivity(
            state=state,
            run_id=beat_run if in_run and state == "estopped" else lease_run,
            run_state=beat if in_run and state == "estopped" else None,
        )
    if beat == "refused" and beat_run is not None:
        reason = str(stats.get("refused") or "")
        return RobotActivity(state="refused", run_id=beat_run, reason=reason or None)
    if in_run:
        return RobotActivity(state="assigned", run_id=beat_run, run_state=beat)
    if lease_run is not None:
        return RobotActivity(state="leased", run_id=lease_run)
    return RobotActivity(state="idle")


def spec_summary(spec: Any) -> RobotSpecSummary:
    """The shapes, cameras, rate, driver and operator of a stored ``Robot.spec``."""
    spec = spec if isinstance(spec, dict) else {}
    computer = spec.get("computer") if isinstance(spec.get("computer"), dict) else {}
    actions = _shapes(spec.get("action_features"))
    hz = spec.get("control_hz")
    return RobotSpecSummary(
        observation=_shapes(spec.get("observation_features")),
        action=actions.get("action"),
        cameras=[
            CameraOut(name=c["name"], height=c["height"], width=c["width"])
            for c in spec.get("cameras") or []
            if isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and all(isinstance(c.get(k), int) for k in ("height", "width"))
        ],
        control_hz=float(hz) if isinstance(hz, int | float) and not isinstance(hz, bool) else None,
        driver=_text(computer.get("driver")),
        operator=_text(computer.get("operator")),
    )


def _shapes(features: Any) -> dict[str, list[int]]:
    """Feature key -> shape of a LeRobot feature dict (entries without an int shape left out)."""
    if not isinstance(features, dict):
        return {}
    out: dict[str, list[int]] = {}
    for key, feature in features.items():
        shape = feature.get("shape") if isinstance(feature, dict) else None
        if isinstance(shape, list | tuple) and all(isinstance(d, int) for d in shape):
            out[str(key)] = list(shape)
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
