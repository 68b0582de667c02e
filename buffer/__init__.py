"""Persistent, cache-aware replay buffer: step schema, WAL, Arrow segments, samplers, rate
limiter, and its batch service for a learner in another process.

Every acknowledged step is durable (fdatasync'ed in a checksummed write-ahead log); the
learner samples from RAM and memory-mapped segments within a byte budget; a directory
outlives runs and can be mounted by later runs as offline data. The public API, the
package's layout, the on-disk format and the memory bounds: docs/buffer.md.
"""

from buffer import sampling as samplers
from buffer.config import BufferSettings
from buffer.errors import (
    BackpressureError,
    BufferClosedError,
    CorruptDataError,
    DiskFullError,
    NothingToSample,
    RateLimiterTimeout,
    ReplayBufferError,
    SegmentGoneError,
    StepValidationError,
    UnsupportedFormatError,
)
from buffer.files.format import FORMAT_VERSION
from buffer.sampling.prioritized import PrioritizedSampler
from buffer.sampling.rate_limiter import RateLimiter
from buffer.sampling.samplers import (
    CacheAwareSampler,
    InterventionSampler,
    MixSampler,
    RecencySampler,
    Sampler,
    UniformSampler,
)
from buffer.table.claim import AppendResult
from buffer.table.features import FeatureSpec
from buffer.table.offline import OfflineView
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema

__all__ = [
    "AppendResult",
    "BackpressureError",
    "BufferClosedError",
    "BufferSettings",
    "CacheAwareSampler",
    "CorruptDataError",
    "DiskFullError",
    "FORMAT_VERSION",
    "FeatureSpec",
    "InterventionSampler",
    "MixSampler",
    "NothingToSample",
    "OfflineView",
    "PrioritizedSampler",
    "RateLimiter",
    "RateLimiterTimeout",
    "RecencySampler",
    "ReplayBuffer",
    "ReplayBufferError",
    "Sampler",
    "SegmentGoneError",
    "StepSchema",
    "StepValidationError",
    "UniformSampler",
    "UnsupportedFormatError",
    "samplers",
]
