"""Proportional prioritized replay (Schaul et al. 2016, "Prioritized Experience Replay")
on a sum tree, with updatable priorities."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from buffer.errors import NothingToSample
from buffer.sampling.samplers import Sampler, uniform_rows
from buffer.sampling.view import Picks, SamplingView

__all__ = ["PrioritizedSampler", "SumTree"]


class SumTree:
    """Binary sum tree over ``capacity`` leaves (a power of two); vectorized updates/draws."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = 1 << max(1, math.ceil(math.log2(max(capacity, 2))))
        self.tree = np.zeros(2 * self.capacity, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self) -> np.ndarray:
        return self.tree[self.capacity :]

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        old = self.leaves().copy()
        self.__init__(capacity)  # type: ignore[misc]
        self.set(np.arange(len(old)), old)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        if len(idx) == 0:
            return
        pos = np.asarray(idx, dtype=np.int64) + self.capacity
        self.tree[pos] = values
        pos = np.unique(pos // 2)
        while pos[0] >= 1:
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]
            if pos[0] == 1:
                break
            pos = np.unique(pos // 2)

    def find(self, u: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval contains each ``u`` in ``[0, total)``."""
        idx: np.ndarray = np.ones(len(u), dtype=np.int64)
        u = u.copy()
        while idx[0] < self.capacity:
            left = self.tree[2 * idx]
            right = u >= left
            u = np.where(right, u - left, u)
            idx = 2 * idx + right
        return idx - self.capacity


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay over the online window (Schaul et al., 2016).

    P(i) = p_i^alpha / sum_k p_k^alpha; new transitions get the highest priority seen so far;
    importance weights ``(N * P(i))^-beta`` are normalized by the batch maximum. Update with
    :meth:`update_priorities` using the batch's ``index`` (online rows only).
    """

    LOOKBACK = 1 << 16
    # Leaves below the window (retention deleted their rows) are dropped once they are half
    # the tree and at least this many: the tree then holds the window, not every row written.
    REBASE_MIN = 1 << 16

    def __init__(self, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6) -> None:
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.tree = SumTree()
        self.base: int | None = None
        self.max_priority = 1.0
        self.scan_from = 0
        self.window_lo = 0

    def _sync(self, view: SamplingView) -> None:
        if self.base is None:
            self.base = view.base
            self.scan_from = max(view.lo, view.base)
            self.window_lo = self.scan_from
        base = self.base
        if view.lo > self.window_lo:
            gone = np.arange(self.window_lo, min(view.lo, base + len(self.tree.leaves()))) - base
            self.tree.set(gone[gone >= 0], np.zeros(len(gone[gone >= 0])))
            self.window_lo = view.lo
        dead = self.window_lo - base
        if dead >= max(self.REBASE_MIN, (view.hi - base) // 2):
            self._rebase(self.window_lo)
            base = self.window_lo
        self.tree.grow(view.hi - base)
        start = max(self.scan_from, view.lo, view.hi - self.LOOKBACK)
        if start >= view.hi:
            return
        b = view.base
        elig = view.eligible[start - b : view.hi - b]
        leaves = self.tree.leaves()[start - base : view.hi - base]
        new = np.flatnonzero(elig & (leaves == 0)) + start
        self.tree.set(new - base, np.full(len(new), self.max_priority**self.alpha))
        pending = np.flatnonzero(~elig)
        self.scan_from = start + int(pending[0]) if pending.size else view.hi

    def _rebase(self, to: int) -> None:
        """Drop the leaves of rows below ``to`` (all zero: below the window); rows keep their
        priorities, leaf ``i`` becomes row ``to + i``."""
        assert self.base is not None
        kept = self.tree.leaves()[to - self.base :].copy()
        used = np.flatnonzero(kept)
        kept = kept[: int(used[-1]) + 1] if used.size else kept[:0]
        self.tree = SumTree(len(kept))
        self.tree.set(np.arange(len(kept)), kept)
        self.base = to

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        self._sync(view)
        assert self.base is not None
        leaf, total = self._draw(view, batch_size, rng)
        p = self.tree.leaves()[leaf]
        bad = p <= 0
        if bad.any():  # float round-off at an interval edge: redraw those uniformly
            leaf[bad] = uniform_rows(view, view.lo, view.hi, int(bad.sum()), rng) - self.base
            p = self.tree.leaves()[leaf]
        n = max(int(np.count_nonzero(self.tree.leaves())), 1)
        probs = np.maximum(p / total, 1e-12)
        w = (n * probs) ** (-self.beta)
        w = w / w.max()
        return [(view.online, leaf + self.base, w.astype(np.float32))]

    def _draw(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, float]:
        """Stratified proportional draw of leaves and the tree's total. A leaf no longer
        eligible (its episode was discarded since it entered the tree) gets priority 0 and
        the draw is repeated: rejection keeps the draw proportional among eligible rows."""
        assert self.base is not None
        elig, b = view.eligible, view.base
        while True:
            total = self.tree.total
            if total <= 0:
                raise NothingToSample("nothing to sample: no prioritized transition yet")
            u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
            leaf = self.tree.find(np.minimum(u, np.nextafter(total, 0)))
            # Leaves with a priority are rows that entered the tree (round-off may pick a
            # zero leaf: the caller redraws those); gone: discarded since.
            live = self.tree.leaves()[leaf] > 0
            gone = np.zeros(len(leaf), dtype=bool)
            gone[live] = ~elig[leaf[live] + self.base - b]
            if not gone.any():
                return leaf, total
            dead = np.unique(leaf[gone])
            self.tree.set(dead, np.zeros(len(dead)))

    def update_priorities(self, rows: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities (e.g. |TD error|) for global ``rows`` of the online buffer.

        Raises:
            ValueError: shapes differ, or a priority is negative or not finite.
        """
        rows = np.asarray(rows, dtype=np.int64)
        pr: np.ndarray = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if rows.shape != pr.shape:
            raise ValueError(f"{len(rows)} rows but {len(pr)} priorities")
        if not np.isfinite(pr).all() or (pr < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        if self.base is None:
            raise ValueError("sample before updating priorities")
        keep = rows >= self.window_lo
        pr = pr[keep] + self.eps
        self.tree.set(rows[keep] - self.base, pr**self.alpha)
        if pr.size:
            self.max_priority = max(self.max_priority, float(pr.max()))

    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "base": -1 if self.base is None else self.base,
            "max_priority": self.max_priority,
            "scan_from": self.scan_from,
            "window_lo": self.window_lo,
            "leaves": self.tree.leaves().copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.alpha = float(state["alpha"])
        self.beta = float(state["beta"])
        base = int(state["base"])
        self.base = None if base < 0 else base
        self.max_priority = float(state["max_priority"])
        self.scan_from = int(state["scan_from"])
        self.window_lo = int(state["window_lo"])
        leaves = np.asarray(state["leaves"], dtype=np.float64)
        self.tree = SumTree(len(leaves))
        self.tree.set(np.arange(len(leaves)), leaves)
