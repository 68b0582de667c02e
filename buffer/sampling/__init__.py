"""Sampling: which transitions a batch draws (the rows; the buffer gathers the data), the
view samplers see (``buffer.sampling.view``) and the rate limiter.

Every sampler draws only *eligible* rows: steps whose true successor is stored and visible,
or done steps (which carry their final observation). So a sampled transition never pairs an
observation with the next episode's first observation, and never comes from an episode an
operator discarded (its rows stop being eligible when the mark arrives, ``buffer.table.marks``;
samplers that remember rows check eligibility again when they draw them).

* :class:`UniformSampler` - uniform over the online window; ``hot_only`` restricts to RAM.
* :class:`CacheAwareSampler` - a share of each batch from the hot tier, the rest uniform
  (cold picks heat their segment so the prefetch thread promotes it).
* :class:`RecencySampler` - uniform over the newest ``window`` steps.
* :class:`PrioritizedSampler` - proportional prioritized replay (Schaul et al. 2016,
  "Prioritized Experience Replay") on a sum tree, with updatable priorities.
* :class:`InterventionSampler` - intervention-only, or intervention-weighted (HG-DAgger,
  Kelly et al. 2019, trains on the human's corrections).
* :class:`MixSampler` - RLPD's symmetric sampling (Ball et al. 2023, 50/50): online data mixed
  with prior data per task, the prior being mounted offline views, the window's
  operator-labelled steps (HIL-SERL's demonstrations beside online data) or both; a fixed
  ratio or an adaptive share that favours tasks with low recent success.

Samplers with state (priorities, cursors, success rates) expose ``state_dict()`` /
``load_state_dict()`` for learner checkpoints (plain ints, floats, lists and numpy arrays).
"""

from buffer.sampling.prioritized import PrioritizedSampler, SumTree
from buffer.sampling.samplers import (
    CacheAwareSampler,
    InterventionSampler,
    MixSampler,
    RecencySampler,
    Sampler,
    UniformSampler,
    uniform_rows,
)
from buffer.sampling.view import Picks, SamplingView, Source

__all__ = [
    "CacheAwareSampler",
    "InterventionSampler",
    "MixSampler",
    "Picks",
    "PrioritizedSampler",
    "RecencySampler",
    "Sampler",
    "SamplingView",
    "Source",
    "SumTree",
    "UniformSampler",
    "uniform_rows",
]
