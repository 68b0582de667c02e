"""The driver contract as checks a lab runs against its own driver, without hardware.

Every robot robofleet drives satisfies the same rules (``hal.driver``): its spec is known
before ``connect``, observations match its features, bad actions are refused with nothing
sent, actions are clipped to its bounds, the e-stop latches until a human clears it,
episodes end at its step limit, and it reports no reward or success it does not declare
(``Capabilities.reward`` / ``detects_success``). Each check builds a fresh driver from a
factory, so a lab points them at a simulated stand-in of its arm as well as at the arm::

    python -m hal.contract my_pkg.arms:MyArm --option port=/dev/ttyACM0
    python -m hal.contract my-arm                # a robofleet.drivers entry point

prints one line per check (PASS, FAIL with the reason, SKIP with why) and exits 0 only if
none failed (1 if one did, 2 if the driver reference itself is refused). From Python,
``check_driver(factory)`` returns the results; from pytest, see ``hal.pytest_plugin``.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from hal.driver import (
    ActionError,
    EpisodeEndedError,
    EStopError,
    NotConnectedError,
    RobotDriver,
)
from hal.drivers import KINDS_HELP, driver_class, make_driver, parse_options
from hal.spec import RobotSpec

Factory = Callable[[], RobotDriver]
Check = Callable[[RobotDriver], None]
Status = Literal["pass", "fail", "skip"]

SIGNAL_STEPS = 5  # steps the declared-signals check watches the reward and success over


class ContractViolation(AssertionError):
    """A driver broke the contract; the message says which rule and what it did."""


class CheckSkipped(Exception):
    """A check does not apply to this driver (e.g. it declares no action bounds)."""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``status`` pass, fail or skip, and ``reason`` (empty on pass)."""

    name: str
    status: Status
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise ContractViolation(why)


def _raises(
    what: str, expected: type[BaseException] | tuple[type[BaseException], ...], match: str,
    call: Callable[[], Any],
) -> None:  # fmt: skip
    """``call()`` must raise one of ``expected`` whose message matches ``match`` (regex)."""
    names = " or ".join(
        t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))
    )
    try:
        call()
    except expected as exc:
        _require(
            re.search(match, str(exc)) is not None,
            f"{what}: raised {type(exc).__name__} {str(exc)!r}, whose message does not "
            f"mention {match!r}",
        )
        return
    except Exception as exc:
        raise ContractViolation(f"{what}: raised {exc!r}, expected {names}") from exc
    raise ContractViolation(f"{what}: raised nothing, expected {names}")


def _check_obs(d: RobotDriver, obs: Any, what: str) -> None:
    _require(isinstance(obs, dict), f"{what}: returned a {type(obs).__name__}, not a dict")
    _require(
        set(obs) == set(d.observation_features),
        f"{what}: keys {sorted(obs)}, the spec's observation features are "
        f"{sorted(d.observation_features)}",
    )
    for key, feat in d.observation_features.items():
        value = obs[key]
        _require(
            isinstance(value, np.ndarray),
            f"{what}: {key} is a {type(value).__name__}, not a numpy array",
        )
        _require(
            value.shape == tuple(feat["shape"]),
            f"{what}: {key} has shape {value.shape}, the spec says {tuple(feat['shape'])}",
        )
        want = "uint8" if feat["dtype"] in ("image", "video") else feat["dtype"]
        _require(
            value.dtype == np.dtype(want),
            f"{what}: {key} has dtype {value.dtype}, the spec says {want}",
        )


def _in_bounds_action(d: RobotDriver, scale: float = 0.1) -> NDArray[np.float32]:
    """An action ``scale`` of the way from the middle of the bounds to the top ([-1, 1] where
    the spec declares none)."""
    n = d.spec.action_dim
    lo = np.asarray(d.spec.action_low if d.spec.action_low else [-1.0] * n, dtype=np.float32)
    hi = np.asarray(d.spec.action_high if d.spec.action_high else [1.0] * n, dtype=np.float32)
    return ((lo + hi) / 2 + scale * (hi - lo) / 2).astype(np.float32)


# -- the checks ------------------------------------------------------------------------------


def builds(d: RobotDriver) -> None:
    """The factory builds a ``RobotDriver`` with a ``RobotSpec`` (``run_check`` builds it)."""


def spec_known_before_connect(d: RobotDriver) -> None:
    """The spec and features are readable unconnected; nothing else is."""
    _require(not d.is_connected, "the driver is connected before connect()")
    spec = d.spec
    _require(
        RobotSpec.from_dict(spec.to_dict()) == spec, "the spec does not survive to_dict/from_dict"
    )
    _require(
        "observation.state" in d.observation_features,
        f"no observation.state feature (features {sorted(d.observation_features)}); the edge "
        "policy acts on state",
    )
    _require(
        set(d.action_features) == {"action"},
        f"action features {sorted(d.action_features)}, expected exactly ['action']",
    )
    _require(d.control_hz > 0, f"control_hz {d.control_hz} is not positive")
    need = {"can_reset", "simulated", "has_operator_device", "reward", "detects_success"}
    _require(
        set(d.capabilities) >= need,
        f"capabilities {sorted(d.capabilities)} lack {sorted(need - set(d.capabilities))}",
    )
    for cam in d.cameras:
        _require(
            f"observation.images.{cam}" in d.observation_features,
            f"camera {cam!r} has no observation.images.{cam} feature",
        )
    _raises("get_observation() before connect()", NotConnectedError, "connect", d.get_observation)
    _raises(
        "send_action() before connect()",
        NotConnectedError,
        "",
        lambda: d.send_action(np.zeros(spec.action_dim, np.float32)),
    )


def observe_act_and_disconnect(d: RobotDriver) -> None:
    """connect (twice), reset, act, observe and disconnect; the spec connect finds is the one
    the robot described itself with unconnected."""
    before = d.spec
    d.connect()
    d.connect()  # idempotent
    _require(d.is_connected and d.is_healthy(), "connected but not healthy")
    _require(d.spec == before, "connect() changed the spec (it must be known before connect)")
    _check_obs(d, d.reset(), "reset()")
    sent = d.send_action({"action": _in_bounds_action(d)})
    _require(
        isinstance(sent, dict) and set(sent) == {"action"},
        f"send_action() returned {sent!r}, expected {{'action': array}}",
    )
    _require(
        sent["action"].dtype == np.float32 and sent["action"].shape == (d.spec.action_dim,),
        f"send_action() reports a {sent['action'].dtype} array of shape "
        f"{sent['action'].shape} sent, expected float32 ({d.spec.action_dim},)",
    )
    _require(
        d.episode.frame_index == 1,
        f"episode.frame_index is {d.episode.frame_index} after one action, expected 1",
    )
    _check_obs(d, d.get_observation(), "get_observation()")
    d.disconnect()
    _require(not d.is_connected, "still connected after disconnect()")
    _raises("get_observation() after disconnect()", NotConnectedError, "", d.get_observation)


def actions_clipped_to_safety_bounds(d: RobotDriver) -> None:
    """An action beyond ``action_high`` goes out clipped to it."""
    if d.spec.action_high is None:
        raise CheckSkipped("this robot declares no action bounds (its own send_action clips)")
    d.connect()
    d.reset()
    high = np.asarray(d.spec.action_high, dtype=np.float32)
    huge = high + 100.0
    sent = d.send_action(huge)["action"]
    _require(
        bool(np.all(sent <= high + 1e-6)),
        f"sent {sent.tolist()} for {huge.tolist()}, above action_high {high.tolist()}",
    )
    _require(not np.allclose(sent, huge), "the out-of-bounds action went out unclipped")


def bad_actions_rejected_and_nothing_sent(d: RobotDriver) -> None:
    """Wrong shape, NaN, wrong key and non-numeric actions raise ActionError; none moves."""
    d.connect()
    d.reset()
    n = d.spec.action_dim
    before = d.get_observation()["observation.state"].copy()
    bad: list[tuple[str, str, Any]] = [
        (f"an action of shape ({n + 1},)", "shape", np.zeros(n + 1, np.float32)),
        ("a NaN action", "NaN", np.full(n, np.nan, np.float32)),
        ("an action under key 'act'", "key 'action'", {"act": np.zeros(n, np.float32)}),
        ("a non-numeric action", "numeric", ["a"] * n),
    ]
    for what, match, action in bad:
        _raises(
            f"send_action({what})", ActionError, match, functools.partial(d.send_action, action)
        )
    _require(
        d.episode.frame_index == 0,
        f"episode.frame_index is {d.episode.frame_index} after refused actions, expected 0",
    )
    after = d.get_observation()["observation.state"]
    _require(
        np.array_equal(after, before),
        f"observation.state moved from {before.tolist()} to {after.tolist()} on refused actions",
    )


def estop_latches_until_cleared(d: RobotDriver) -> None:
    """``estop()`` (from any thread) latches: actions and resets are refused until
    ``clear_estop()``; then the robot runs again."""
    d.connect()
    d.reset()
    caller = threading.Thread(target=d.estop, name="contract-estop")
    caller.start()
    caller.join(5.0)
    _require(not caller.is_alive(), "estop() blocked its caller for 5 s")
    _require(d.is_estopped, "estop() did not latch: is_estopped is False")
    _require(not d.is_healthy(), "is_healthy() is True while e-stopped")
    _raises(
        "send_action() while e-stopped",
        EStopError,
        "e-stopped",
        lambda: d.send_action(_in_bounds_action(d)),
    )
    _raises("reset() while e-stopped", (EStopError, NotConnectedError), "", d.reset)
    d.clear_estop()
    _require(not d.is_estopped, "clear_estop() did not release the latch")
    d.connect()  # drivers whose e-stop drops the connection come back here
    d.reset()
    d.send_action(_in_bounds_action(d))
    _require(
        d.episode.frame_index == 1,
        f"episode.frame_index is {d.episode.frame_index} after clearing the e-stop and one "
        "action, expected 1",
    )


def episode_truncates_at_step_limit(d: RobotDriver) -> None:
    """The episode is truncated after ``max_episode_steps`` actions; more need ``reset()``."""
    limit = d.spec.max_episode_steps
    if limit is None:
        raise CheckSkipped("this robot's episodes have no step limit (ended by the operator)")
    d.connect()
    d.reset()
    for i in range(limit):
        _require(not d.episode.truncated, f"truncated after {i} of {limit} steps")
        d.send_action(_in_bounds_action(d, 0.0))
    _require(
        d.episode.truncated and d.episode.frame_index == limit,
        f"after {limit} steps: truncated={d.episode.truncated}, "
        f"frame_index={d.episode.frame_index}",
    )
    _raises(
        "send_action() after the episode ended",
        EpisodeEndedError,
        "reset",
        lambda: d.send_action(_in_bounds_action(d, 0.0)),
    )
    d.reset()
    _require(
        not d.episode.done and d.episode.frame_index == 0,
        "reset() did not start a fresh episode",
    )


def signals_as_declared(d: RobotDriver) -> None:
    """Rewards are finite; a robot declaring ``reward: none`` reports 0 on every step and one
    without ``detects_success`` never reports success (a run trusts these declarations to
    choose its reward and success sources)."""
    caps = d.spec.capabilities
    d.connect()
    d.reset()
    for step in range(SIGNAL_STEPS):
        if d.episode.done:
            break
        d.send_action(_in_bounds_action(d))
        reward = d.episode.reward
        _require(
            isinstance(reward, float) and bool(np.isfinite(reward)),
            f"step {step}: reward {reward!r} is not a finite float",
        )
        _require(
            caps.reward != "none" or reward == 0.0,
            f"step {step}: reward {reward} from a robot that declares reward 'none' (declare "
            "'dense' or 'sparse')",
        )
        _require(
            caps.detects_success or not d.episode.success,
            f"step {step}: success reported by a robot that declares detects_success False",
        )


CHECKS: dict[str, Check] = {
    check.__name__: check
    for check in (
        builds,
        spec_known_before_connect,
        observe_act_and_disconnect,
        actions_clipped_to_safety_bounds,
        bad_actions_rejected_and_nothing_sent,
        estop_latches_until_cleared,
        episode_truncates_at_step_limit,
        signals_as_declared,
    )
}
"""Every contract check, by name, in the order they run."""


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _build(factory: Factory) -> RobotDriver:
    try:
        driver = factory()
    except Exception as exc:
        raise ContractViolation(f"building the driver raised {_named(exc)}") from exc
    _require(
        isinstance(driver, RobotDriver),
        f"the factory returned a {type(driver).__name__}, not a hal.driver.RobotDriver",
    )
    _require(
        isinstance(getattr(driver, "spec", None), RobotSpec),
        "the driver has no hal.spec.RobotSpec spec (set self.spec in __init__)",
    )
    return driver


def run_check(name: str, factory: Factory) -> CheckResult:
    """Run check ``name`` of ``CHECKS`` on a fresh driver from ``factory`` (disconnected after).

    Raises:
        KeyError: no check of that name.
    """
    check = CHECKS[name]
    driver: RobotDriver | None = None
    result: CheckResult
    try:
        driver = _build(factory)
        check(driver)
        result = CheckResult(name, "pass")
    except CheckSkipped as exc:
        result = CheckResult(name, "skip", str(exc))
    except ContractViolation as exc:
        result = CheckResult(name, "fail", str(exc))
    except Exception as exc:  # a rule the driver broke by raising; name what it raised
        result = CheckResult(name, "fail", f"raised {_named(exc)}")
    if driver is not None:
        try:
            driver.disconnect()
        except Exception as exc:
            if not result.failed:
                result = CheckResult(name, "fail", f"disconnect() raised {_named(exc)}")
    return result


def check_driver(factory: Factory, only: Sequence[str] | None = None) -> list[CheckResult]:
    """Every check (or those named in ``only``) on fresh drivers from ``factory``, in order;
    when ``builds`` fails the others are skipped.

    Raises:
        KeyError: a name in ``only`` is not a check.
    """
    names = list(CHECKS) if only is None else list(only)
    for name in names:
        if name not in CHECKS:
            raise KeyError(f"no contract check {name!r}; checks: {list(CHECKS)}")
    built = run_check("builds", factory)
    if built.failed:
        return [built] + [
            CheckResult(n, "skip", "not run: the driver could not be built")
            for n in names
            if n != "builds"
        ]
    return [built if n == "builds" else run_check(n, factory) for n in names]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hal.contract",
        description="Run the robofleet driver contract checks against a driver.",
    )
    p.add_argument("driver", help=f"the driver ({KINDS_HELP})")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword option of the driver, VALUE as JSON if it parses",
    )
    p.add_argument("--name", default="contract-0", help="the robot name the driver is built with")
    p.add_argument(
        "--check", action="append", default=None, choices=list(CHECKS), help="run only this"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module doc); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        driver_class(args.driver)
        options = parse_options(args.option, "--option")
    except ValueError as exc:
        print(f"hal.contract: {exc}", file=sys.stderr)
        return 2
    results = check_driver(lambda: make_driver(args.driver, args.name, **options), only=args.check)
    for r in results:
        print(f"{r.status.upper():4} {r.name}" + (f": {r.reason}" if r.reason else ""))
    failed = [r.name for r in results if r.failed]
    skipped = sum(r.status == "skip" for r in results)
    print(
        f"{args.driver}: {len(results) - len(failed) - skipped} passed, {len(failed)} failed"
        f"{f' ({", ".join(failed)})' if failed else ''}, {skipped} skipped"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
