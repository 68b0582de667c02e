"""Policies the learner trains: state MLP, CNN + MLP, flow-matching chunks, LeRobot adapters."""

from cloud_learner.policies.base import (
    INDICATOR_NEGATIVE,
    INDICATOR_NULL,
    INDICATOR_POSITIVE,
    PolicySpec,
    TorchPolicy,
)
from cloud_learner.policies.flow import FlowMatchingPolicy
from cloud_learner.policies.mlp import MLPPolicy

__all__ = [
    "INDICATOR_NEGATIVE",
    "INDICATOR_NULL",
    "INDICATOR_POSITIVE",
    "FlowMatchingPolicy",
    "MLPPolicy",
    "PolicySpec",
    "TorchPolicy",
]
