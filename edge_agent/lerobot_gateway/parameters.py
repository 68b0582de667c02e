"""A run's policy version -> the bytes LeRobot's actor loads.

LeRobot's actor reads each parameter message with ``bytes_to_state_dict`` (``torch.load``,
``weights_only=True``) and hands the result to ``algorithm.load_weights``
(``{"policy": actor_state_dict, "discrete_critic": ...}``). :data:`ParametersFn` is the seam:
any callable from a version's flat ``name -> tensor`` mapping (what the weight subscription
holds, policy card included) to those bytes, raising ValueError for a version it cannot
convert. The default is the ``lerobot-sac`` algorithm's own converter
(:func:`cloud_learner.lerobot_parameters.parameter_bytes`), which refuses, by name, a version
another algorithm trained (its tensors would not load into LeRobot's actor);
``--parameters module:function`` names another.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from cloud_learner.lerobot_parameters import parameter_bytes

ParametersFn = Callable[[Mapping[str, Any]], bytes]
DEFAULT: ParametersFn = parameter_bytes


def load_parameters_fn(spec: str | None) -> ParametersFn:
    """The converter ``module:function`` names (:data:`DEFAULT` for None).

    Raises:
        ValueError: not ``module:function``, the module does not import, or no such callable.
    """
    if not spec:
        return DEFAULT
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
