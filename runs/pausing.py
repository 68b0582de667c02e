"""How a run's loop follows its pause: the robots told to hold or go on (``runs.hold``), the
run's clock stopped and started with them, and the events that say so. One small part so the
driver's loop only asks for it each turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from foundation.store.models import RunState
from runs.clock import RunClock
from runs.hold import RobotHold


class PauseFollower:
    """Turns a run's wanted pause into the robots' hold and the clock's state.

    Args:
        hold: the run's robots' hold (pushes the pause and re-sends it until they agree).
        event: records one event of the run (``kind``, then its data).
    """

    def __init__(self, hold: RobotHold, event: Callable[..., None]) -> None:
        self.hold = hold
        self._event = event
        self._held_reported = False

    def follow_pause(
        self,
        want_pause: bool,
        clock: RunClock,
        members: Callable[[], Mapping[str, int]],
        progress: dict[str, Any],
        resumed: Callable[[], None],
    ) -> None:
        """Pause: robots hold at their next step boundary; leases, placement, agents and the
        learner stay. Resume: the held robots go on with their episodes.

        Args:
            want_pause: the run is asked to be paused.
            clock: the run's clock (paused while the robots hold).
            members: the leased robots now (name -> robot id), asked only on a change.
            progress: the run's live figures (its ``state`` turns ``paused``).
            resumed: called once the robots were told to go on (the live state returns).
        """
        if want_pause and not clock.paused:
            reached = self.hold.want(True, members(), "run paused")
            clock.pause()
            self._held_reported = False
            progress["state"] = RunState.PAUSED.value
            self._event("run.pause_sent", robots=sorted(members()), reached=reached)
        elif clock.paused and not want_pause:
            reached = self.hold.want(False, members(), "run resumed")
            clock.resume()
            self._event("run.resume_sent", robots=sorted(members()), reached=reached)
            resumed()

    def follow_hold(self, paused: bool, members: Mapping[str, int], active: list[str]) -> None:
        """Re-send pause/resume to robots whose heartbeat disagrees; note when all hold.

        Args:
            paused: the run is paused.
            members: the leased robots (name -> robot id).
            active: the names of the robots whose leases are active.
        """
        held = self.hold.follow(members)
        if not paused:
            self._held_reported = False
        elif not self._held_reported and held == sorted(active):
            self._held_reported = True
            self._event("run.robots_held", robots=held, leases_kept=sorted(members))
