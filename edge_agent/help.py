"""Help requests on the robot: ask a person before the policy fails (the run's ``help:``).

:class:`HelpDesk` turns the step's risk (``edge_agent.help_risk``) into requests: a risk at or
above ``threshold`` opens one (robot, run, episode, step, risk, time) when the desk is armed;
it disarms until the risk falls below ``threshold - hysteresis`` and ``cooldown_steps`` have
passed since the last request ended, so one bad stretch is one request. No request opens in
evaluation or demonstration episodes, nor while a person already acts.

A request closes (``closed_at``) when the person hands back, or when it ended without a
takeover; the cloud then frees the operator it assigned to it
(``foundation.store.help_assignments``).

An open request ends when a person takes the robot over (``took_over``: the takeover's steps
and the episode's verdict are kept with it), when a person answers from the cloud
(``help_answered`` on the Control stream: ``dismissed`` or ``took_over``), or after
``timeout_s`` (``expired``). While it waits the robot holds (``while_waiting: hold``: the
agent sends no action, polls its operator and goes on once the request ended) or the policy
goes on (``continue``).

Requests reach the cloud in the agent's heartbeats (``info["help"]``, :meth:`outbox`); a
change asks for a heartbeat at once. Reports are sent until a heartbeat carrying their last
change went through (the cloud stores them idempotently).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import wraps
from typing import Any, Literal


def _locked[**P, R](method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` under its desk's lock (the loop's thread and the listener's meet here)."""

    @wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with args[0]._lock:  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return run


@dataclass(frozen=True)
class HelpSettings:
    """The run's ``help:`` section as the robot needs it (``foundation.runspec.HelpSpec``)."""

    risk: Literal["probe", "ensemble", "random", "none"] = "none"
    threshold: float = 0.5
    hysteresis: float = 0.1
    cooldown_steps: int = 20
    while_waiting: Literal["hold", "continue"] = "hold"
    timeout_s: float = 60.0
    ensemble_members: int = 3
    random_rate: float = 0.02
    # The run has fewer people than robots: a simulated person acts only while the cloud
    # assigned one to this robot (edge_agent.on_call), for at most on_call_steps steps.
    on_call: bool = False
    on_call_steps: int | None = None


@dataclass
class HelpRequest:
    """One request; times are UNIX seconds."""

    key: str
    episode: int
    step: int
    risk: float
    timeout_s: float
    requested_at: float
    outcome: str | None = None  # took_over | dismissed | expired
    ended_at: float | None = None
    by: str = ""
    takeover_steps: int = 0
    label: str = ""
    closed_at: float | None = None  # the person handed back (or it ended otherwise)
    taking_over: bool = field(default=False, repr=False)  # a takeover still running

    def to_report(self) -> dict[str, Any]:
        """What the cloud stores (``foundation.store.help_requests.record_reports``)."""
        out = asdict(self)
        out.pop("taking_over")
        return out


class HelpDesk:
    """The robot's help requests (module docstring).

    Args:
        settings: the run's ``help:``.
        robot_id: the robot's name, part of each request's key.
        on_change: called after a request opened or ended (an immediate heartbeat).
        clock: UNIX time (tests pass a fake one).
    """

    def __init__(
        self,
        settings: HelpSettings,
        robot_id: str,
        on_change: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.robot_id = robot_id
        self.on_change = on_change
        self.clock = clock
        self._lock = threading.RLock()  # the control loop and the Control listener
        self.requests: list[HelpRequest] = []
        self.open: HelpRequest | None = None
        self._armed = True
        self._quiet = 0  # steps left before the next request may open
        self._unsent: dict[str, int] = {}  # key -> change count not yet delivered
        self._changes = 0
        self.last_risk: float | None = None
        self._taken: HelpRequest | None = None  # taken over in the running episode

    # -- the control loop ------------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        """A request is open and no one has taken over yet."""
        req = self.open
        return req is not None and req.outcome is None

    @property
    def holds(self) -> bool:
        """The robot must send no policy action now (a request waits, ``while_waiting:
        hold``)."""
        return self.waiting and self.settings.while_waiting == "hold"

    def begin_episode(self) -> None:
        self._armed, self._quiet = True, 0

    @_locked
    def observe(self, risk: float | None, episode: int, step: int, eligible: bool) -> bool:
        """The step's risk; True when it opened a request. ``eligible``: an autonomous step
        of a training episode (no person acting, no evaluation or demonstration)."""
        self.last_risk = risk
        self.expire_due()
        if self._quiet > 0 and self.open is None:
            self._quiet -= 1
        if risk is None:
            return False
        s = self.settings
        if not self._armed and risk < s.threshold - s.hysteresis:
            self._armed = True
        if not (eligible and self._armed and self._quiet == 0 and self.open is None):
            return False
        if risk < s.threshold:
            return False
        self._armed = False
        key = f"{self.robot_id}:{episode}:{step}"
        req = HelpRequest(key, episode, step, float(risk), s.timeout_s, self.clock())
        with self._lock:
            self.requests.append(req)
            self.open = req
        self._changed(req)
        return True

    @_locked
    def operator_step(self, intervening: bool, by: str) -> None:
        """The step's operator flag: a takeover ends the waiting request as ``took_over`` and
        its steps are counted until the person hands back."""
        req = self.open
        if req is None:
            return
        if intervening:
            if req.outcome is None:
                self._end(req, "took_over", by)
            if req.outcome == "took_over":
                self._taken = req
                req.taking_over = True
                req.takeover_steps += 1
        elif req.outcome is not None and (req.outcome != "took_over" or req.taking_over):
            # A cloud takeover that has not begun yet (the answer crossed this step) stays
            # open until the person's first step; it closes at the episode's end otherwise.
            self._close()

    @_locked
    def end_episode(self, label: str | None) -> None:
        """The episode ended with the operator's verdict ``label`` (None: none): the request
        a person took over in it keeps the verdict; a waiting request stays open."""
        req, self._taken = self._taken, None
        if req is not None and label:
            req.label = label
            self._changed(req)
        if self.open is not None and self.open.outcome is not None:
            self._close()

    @_locked
    def expire_due(self) -> None:
        """End the waiting request as ``expired`` once its timeout passed."""
        req = self.open
        if req is not None and req.outcome is None:
            if self.clock() - req.requested_at >= req.timeout_s:
                self._end(req, "expired", "")
                self._close()

    @property
    def assigned(self) -> bool:
        """A person from the cloud took the open request over and has not handed back."""
        req = self.open
        return req is not None and req.outcome == "took_over" and req.closed_at is None

    @_locked
    def answered(self, reason: str) -> None:
        """A person's answer from the cloud (``help_answered``; ``reason`` is JSON ``{"key",
        "outcome", "by"}``); answers to other or ended requests change nothing."""
        try:
            msg = json.loads(reason)
            key, outcome, by = str(msg["key"]), str(msg["outcome"]), str(msg.get("by", ""))
        except (ValueError, KeyError, TypeError):
            return
        if outcome not in ("took_over", "dismissed"):
            return
        req = self.open
        if req is None or req.key != key or req.outcome is not None:
            return
        self._end(req, outcome, by)
        if outcome == "took_over":
            self._taken = req
        if outcome == "dismissed":
            self._close()

    @_locked
    def person_answered(self, by: str, label: str) -> None:
        """The robot's operator answered the waiting request with an episode command
        (``label``: success, failure, rerecord, discard): ``dismissed``, the command kept."""
        req = self.open
        if req is None or req.outcome is not None:
            return
        req.label = label[:16]
        self._end(req, "dismissed", by)
        self._close()

    # -- the heartbeat ---------------------------------------------------------------------

    def outbox(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """(reports to send, a token for :meth:`delivered`)."""
        with self._lock:
            token = dict(self._unsent)
            reports = [r.to_report() for r in self.requests if r.key in token]
        return reports, token

    def delivered(self, token: dict[str, int]) -> None:
        """A heartbeat carrying ``token``'s reports went through: forget those not changed
        since; ended requests delivered are dropped."""
        with self._lock:
            for key, n in token.items():
                if self._unsent.get(key) == n:
                    del self._unsent[key]
            keep = (self.open, self._taken)
            self.requests = [r for r in self.requests if r.key in self._unsent or r in keep]

    def report(self) -> dict[str, float]:
        """Heartbeat statistics: ``help_risk`` (the last step's, -1 when none),
        ``help_waiting`` (0/1)."""
        return {
            "help_risk": -1.0 if self.last_risk is None else float(self.last_risk),
            "help_waiting": float(self.waiting),
        }

    # -- internals -------------------------------------------------------------------------

    def _end(self, req: HelpRequest, outcome: str, by: str) -> None:
        req.outcome, req.ended_at, req.by = outcome, self.clock(), by
        self._changed(req)

    def _close(self) -> None:
        req = self.open
        if req is not None:
            req.taking_over = False
            req.closed_at = self.clock()  # frees the operator the cloud assigned
            self._changed(req)
        self.open = None
        self._quiet = self.settings.cooldown_steps

    def _changed(self, req: HelpRequest) -> None:
        with self._lock:
            self._changes += 1
            self._unsent[req.key] = self._changes
        if self.on_change is not None:
            self.on_change()


def send_heartbeat(
    heartbeat: Callable[..., Any],
    desk: HelpDesk | None,
    state: str,
    version: int,
    report: dict[str, float],
) -> None:
    """One heartbeat, carrying the desk's unsent request reports in its info
    (``foundation.store.help_requests``); they count as delivered once the call returned. A
    beat refused with them goes again without them: the robot's liveness never waits on its
    reports.

    Raises:
        Exception: what the beat with reports raised, once the beat without them went out
            (or what that one raised).
    """
    reports, token = desk.outbox() if desk is not None else ([], {})
    if not reports:
        heartbeat(state, version, report)
        return
    try:
        heartbeat(state, version, report, info={"help": reports})
    except Exception:
        heartbeat(state, version, report)
        raise
    assert desk is not None
    desk.delivered(token)
