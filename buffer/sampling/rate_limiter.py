"""Samples-per-insert rate limiter (the rule of Reverb's ``SampleToInsertRatio``).

Let ``diff = inserts * samples_per_insert - samples`` (inserts and samples counted in
transitions). Sampling needs at least ``min_size_to_sample`` inserted transitions and
``diff - n >= min_diff``; inserting needs ``diff + n * samples_per_insert <= max_diff``
(always allowed below the minimum size), where
``min_diff = samples_per_insert * min_size_to_sample - error_buffer`` and
``max_diff = samples_per_insert * min_size_to_sample + error_buffer``.

No deadlock: if both sides were blocked at once, ``diff + i*spi > max_diff`` and
``diff - s < min_diff`` would both hold, i.e. ``max_diff - min_diff < i*spi + s``. The
constructor therefore demands ``2 * error_buffer >= max_insert * spi + max_sample`` (the
largest insert and sample batches), so at every moment one side can always proceed. Every wait
has a timeout, and :meth:`close` wakes every waiter with :class:`BufferClosedError`.

A learner in another process than the buffer (robofleet's run: robots act in real time and an
acknowledged step is never refused) applies the sampling side only:
:meth:`RateLimiter.sampling_side` never blocks inserts, and :meth:`RateLimiter.allows_sample`
checks the rule on counts the learner tells it (its updates times the batch size, against the
online rows the remote buffer reports) without waiting or counting.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from buffer.errors import BufferClosedError, RateLimiterTimeout


class RateLimiter:
    """Blocks inserts that run ahead of sampling and samples that run ahead of inserts.

    Args:
        samples_per_insert: target average number of times each transition is sampled.
        min_size_to_sample: transitions that must be inserted before any sampling.
        error_buffer: allowed drift from the target, in samples; see the module docstring.
        max_insert: largest single insert (transitions) callers will request.
        max_sample: largest single sample (transitions) callers will request.
        block_inserts: False: inserts always proceed (only sampling waits), so no parameters
            can deadlock and none are refused for it.

    Raises:
        ValueError: the parameters could deadlock, or are out of range.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | None = None,
        *,
        max_insert: int = 64,
        max_sample: int = 256,
        block_inserts: bool = True,
    ) -> None:
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        need = (max_insert * samples_per_insert + max_sample) / 2
        if error_buffer is None:
            error_buffer = need
        if error_buffer < need and block_inserts:
            raise ValueError(
                f"error_buffer={error_buffer} could deadlock with inserts of {max_insert} and "
                f"samples of {max_sample} at samples_per_insert={samples_per_insert}; "
                f"use at least {need}"
            )
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = error_buffer
        self.max_insert = max_insert
        self.max_sample = max_sample
        self.block_inserts = block_inserts
        center = samples_per_insert * min_size_to_sample
        self.min_diff = center - error_buffer
        self.max_diff = center + error_buffer
        self.inserts = 0
        self.samples = 0
        self._closed = False
        self._cond = threading.Condition()

    @classmethod
    def sampling_side(cls, samples_per_insert: float, min_size_to_sample: int = 1) -> RateLimiter:
        """The sampling side of the rule alone: inserts never wait, and with
        ``error_buffer = samples_per_insert * min_size_to_sample`` (so ``min_diff`` is 0)
        ``n`` more samples are allowed while ``samples + n <= samples_per_insert * inserts``
        (and at least ``min_size_to_sample`` were inserted).

        Raises:
            ValueError: ``samples_per_insert <= 0`` or ``min_size_to_sample < 1``.
        """
        return cls(
            samples_per_insert,
            min_size_to_sample,
            error_buffer=samples_per_insert * min_size_to_sample,
            block_inserts=False,
        )

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int = 1) -> bool:
        """Whether inserting ``n`` transitions would proceed without waiting."""
        with self._cond:
            return self._can_insert(n)

    def can_sample(self, n: int = 1) -> bool:
        with self._cond:
            return self._can_sample(n)

    def allows_sample(self, n: int, *, inserts: int, samples: int) -> bool:
        """Whether ``n`` more samples are allowed after ``samples`` drawn against ``inserts``
        inserted (transitions), by this limiter's rule, on those counts instead of its own:
        nothing waits and nothing is counted. A negative ``samples`` counts as 0 (a learner
        counting its updates since a warm start while it replays the warm start's ones).

        Raises:
            ValueError: ``n < 1``.
        """
        if n < 1:
            raise ValueError(f"n (samples asked for) must be >= 1, got {n}")
        return self._sample_rule(n, inserts, max(samples, 0))

    def _can_insert(self, n: int) -> bool:
        if not self.block_inserts or self.inserts + n <= self.min_size_to_sample:
            return True
        return self.diff + n * self.samples_per_insert <= self.max_diff

    def _can_sample(self, n: int) -> bool:
        return self._sample_rule(n, self.inserts, self.samples)

    def _sample_rule(self, n: int, inserts: int, samples: int) -> bool:
        if inserts < self.min_size_to_sample:
            return False
        return inserts * self.samples_per_insert - samples - n >= self.min_diff

    def _wait(self, ok: Any, timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise BufferClosedError(f"rate limiter closed while waiting to {what}")
            if ok():
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RateLimiterTimeout(
                    f"waited {timeout}s to {what} (inserts={self.inserts}, "
                    f"samples={self.samples}, samples_per_insert={self.samples_per_insert})"
                )
            self._cond.wait(left)

    def await_insert(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` transitions may be inserted, then count them.

        Raises:
            RateLimiterTimeout: not allowed within ``timeout`` seconds.
            BufferClosedError: closed meanwhile.
        """
        with self._cond:
            self._wait(lambda: self._can_insert(n), timeout, f"insert {n}")
            self.inserts += n
            self._cond.notify_all()

    def await_sample(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` transitions may be sampled, then count them (same errors)."""
        with self._cond:
            self._wait(lambda: self._can_sample(n), timeout, f"sample {n}")
            self.samples += n
            self._cond.notify_all()

    def undo_insert(self, n: int) -> None:
        """Uncount an insert that failed after :meth:`await_insert` (e.g. bad records)."""
        with self._cond:
            self.inserts -= n
            self._cond.notify_all()

    def retry_after_s(self) -> float:
        """A backpressure hint: a guess how long until an insert would proceed."""
        return 0.05

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def state_dict(self) -> dict[str, Any]:
        with self._cond:
            return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self.inserts = int(state["inserts"])
            self.samples = int(state["samples"])
            self._cond.notify_all()
