"""What a run learns and measures success from, checked at launch against what its robots
give: a refusal here happens before anything is leased (``runs.manager.validate_launch``).

A robot's enrolled spec declares its signals (``hal.spec.Capabilities``): ``reward`` (dense,
sparse or none) and ``detects_success``; its computer's ``--operator`` (``computer.operator``
in the stored spec, ``none`` for nobody) says whether a person can label its episodes. A spec
enrolled by a robot computer whose code predates these fields lacks them and is read with the
fields' defaults (``reward: none``, ``detects_success: false``): a robot that never declared a
signal is not trusted to give one (its computer declares them again, from its driver, on its
next heartbeat once it runs current code).

The rules, each keyed by the spec field to change:

* ``reward.source``: ``robot`` with an algorithm that learns from the reward (its builder's
  ``learns_from: reward``, SAC/RLPD) needs robots whose reward is dense or sparse; with one
  that learns from episode outcomes (``success``, RECAP) it needs robots that detect success
  or have an operator to give the verdict. ``labels`` and ``classifier`` need an operator on
  every robot (people label the episodes the reward, or the classifier, comes from).
* ``evaluation.on: robots`` needs a success source on every robot: its own detection, an
  operator, or ``reward.source: classifier``.
* ``stop.target_success`` needs success to be measured (not ``evaluation.on: none``).
"""

from __future__ import annotations

from typing import Any

from foundation.runspec import RunSpec
from hal.spec import Capabilities


def _capabilities(name: str, spec: dict[str, Any]) -> Capabilities:
    from hal.compat import robot_spec

    return robot_spec(name, spec).capabilities


def _has_operator(spec: dict[str, Any]) -> bool:
    return (spec.get("computer") or {}).get("operator") != "none"


def signal_errors(
    spec: RunSpec, learns_from: str | None, robots: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """Errors keyed by spec field (see the module docstring); empty when the robots give what
    the run needs.

    Args:
        spec: the run spec.
        learns_from: the algorithm's ``learns_from`` (``reward``, ``success``,
            ``interventions``; None: the algorithm is unknown, refused elsewhere).
        robots: robot name -> its enrolled spec (``Robot.spec``), the robots the run matches.
    """
    caps = {name: _capabilities(name, s) for name, s in robots.items()}
    silent = sorted(n for n, c in caps.items() if c.reward == "none")
    no_operator = sorted(n for n, s in robots.items() if not _has_operator(s))
    no_success = sorted(n for n in no_operator if not caps[n].detects_success)
    errors: dict[str, str] = {}
    source = spec.reward.source
    if source == "robot" and learns_from == "reward" and silent:
        errors["reward.source"] = (
            f"{spec.algorithm} learns from the robots' reward and {silent} report none "
            "(capabilities.reward: none); set reward.source: labels (operators' verdicts) "
            "or reward.source: classifier, or select robots that report a reward"
        )
    elif source == "robot" and learns_from == "success" and no_success:
        errors["reward.source"] = (
            f"{spec.algorithm} learns from episode outcomes and {no_success} neither detect "
            "success (capabilities.detects_success: false) nor have an operator to label it "
            "(--operator none); give them an operator and set reward.source: labels or "
            "classifier, or select robots that detect success"
        )
    elif source in ("labels", "classifier") and no_operator:
        errors["reward.source"] = (
            f"reward.source: {source} learns from operators' labels and {no_operator} have "
            "no operator (their robot computers run --operator none); give them an operator "
            "or select robots that report a reward (reward.source: robot)"
        )
    if spec.evaluation.on == "robots" and source != "classifier" and no_success:
        errors["evaluation.on"] = (
            f"evaluation on robots needs a success source and {no_success} neither detect "
            "success nor have an operator to label it; give them an operator, set "
            "reward.source: classifier, use evaluation.on: simulator, or evaluation.on: "
            "none (success not measured; no version is promoted)"
        )
    if spec.evaluation.on == "none" and spec.stop.target_success is not None:
        errors["stop.target_success"] = (
            "evaluation.on: none measures no success to stop at; leave it out"
        )
    return errors
