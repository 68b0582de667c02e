"""A run's policy version -> the bytes LeRobot's actor loads.

LeRobot's actor reads each parameter message with ``bytes_to_state_dict`` (``torch.load``,
``weights_only=True``) and hands the result to ``algorithm.load_weights``, which for SAC takes
``{"policy": actor_state_dict, "discrete_critic": ...}`` (the second only for a policy with
discrete actions). :data:`ParametersFn` is the seam: any callable from a version's flat
``name -> tensor`` mapping (what the weight subscription holds) to those bytes. The cloud's
``lerobot-sac`` algorithm may ship its own (``--parameters module:function``);
:func:`lerobot_parameters` is the default: names ``policy.<key>`` and
``discrete_critic.<key>`` go to those groups, a version with neither prefix is the actor's state
dict as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lerobot.transport.utils import state_to_bytes

ParametersFn = Callable[[Mapping[str, Any]], bytes]
GROUPS = ("policy", "discrete_critic")


def lerobot_parameters(weights: Mapping[str, Any]) -> bytes:
    """LeRobot's parameter bytes (``state_to_bytes``) of a version's ``name -> tensor``.

    Raises:
        ValueError: an empty version, a value that is not a tensor, or names that mix
            grouped (``policy.``/``discrete_critic.``) and ungrouped keys (named).
    """
    if not weights:
        raise ValueError("the version holds no tensors")
    bad = sorted(k for k, v in weights.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise ValueError(f"not tensors: {bad[:5]}")
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    loose: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        group, _, rest = name.partition(".")
        if group in GROUPS and rest:
            grouped.setdefault(group, {})[rest] = tensor.detach().cpu().clone()
        else:
            loose[name] = tensor.detach().cpu().clone()
    if grouped and loose:
        raise ValueError(
            f"names {sorted(loose)[:5]} lack a {'/'.join(GROUPS)} prefix the others have"
        )
    if loose:
        return state_to_bytes({"policy": loose})
    if "policy" not in grouped:
        raise ValueError("the version has discrete_critic.* but no policy.* tensors")
    return state_to_bytes(grouped)


def load_parameters_fn(spec: str | None) -> ParametersFn:
    """The converter ``module:function`` names (:func:`lerobot_parameters` for None).

    Raises:
        ValueError: not ``module:function``, the module does not import, or no such callable.
    """
    if not spec:
        return lerobot_parameters
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--parameters {spec!r}: expected module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--parameters {spec!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"--parameters {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]
