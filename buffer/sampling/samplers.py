"""Which transitions a batch draws (the rows; the buffer gathers the data): the sampler
base and every sampler but prioritized replay (``buffer.sampling.prioritized``); the list,
with their sources, is in ``buffer.sampling``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from buffer.errors import NothingToSample
from buffer.sampling.view import Picks, SamplingView, Source

__all__ = [
    "CacheAwareSampler",
    "InterventionSampler",
    "MixSampler",
    "RecencySampler",
    "Sampler",
    "UniformSampler",
    "uniform_rows",
]


class Sampler:
    """Base class: ``sample_indices(view, batch_size, rng) -> [(source, rows, weights)]``."""

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state


def uniform_rows(
    view: SamplingView,
    lo: int,
    hi: int,
    n: int,
    rng: np.random.Generator,
    accept: np.ndarray | None = None,
) -> np.ndarray:
    """``n`` eligible rows uniformly from ``[lo, hi)`` (with replacement), by rejection.

    ``accept`` optionally narrows eligibility (a bool array indexed like the index columns).

    Raises:
        ValueError: no eligible row in the range.
    """
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if hi <= lo:
        raise NothingToSample(f"nothing to sample: empty window [{lo}, {hi})")
    elig = view.eligible
    b = view.base
    got: list[np.ndarray] = []
    need = n
    for _ in range(8):
        cand = rng.integers(lo, hi, size=max(2 * need, 32))
        ok = elig[cand - b]
        if accept is not None:
            ok &= accept[cand - b]
        good = cand[ok][:need]
        got.append(good)
        need -= len(good)
        if need == 0:
            return np.concatenate(got)
    allowed = elig[lo - b : hi - b]
    if accept is not None:
        allowed = allowed & accept[lo - b : hi - b]
    pool = np.flatnonzero(allowed) + lo
    if pool.size == 0:
        raise NothingToSample(f"nothing to sample: no eligible transition in [{lo}, {hi})")
    got.append(rng.choice(pool, size=need))
    return np.concatenate(got).astype(np.int64)


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


class UniformSampler(Sampler):
    """Uniform over eligible transitions of the online window.

    Args:
        hot_only: draw only from rows held in RAM (falls back to the whole window when none).
    """

    def __init__(self, hot_only: bool = False) -> None:
        self.hot_only = hot_only

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        if self.hot_only:
            rows = _hot_rows(view, batch_size, rng)
            if rows is not None:
                return [(view.online, rows, _ones(len(rows)))]
        rows = uniform_rows(view, view.lo, view.hi, batch_size, rng)
        return [(view.online, rows, _ones(batch_size))]


def _hot_rows(view: SamplingView, n: int, rng: np.random.Generator) -> np.ndarray | None:
    ranges = view.hot_ranges()
    if not ranges:
        return None
    sizes = np.array([hi - lo for lo, hi in ranges], dtype=np.float64)
    counts = rng.multinomial(n, sizes / sizes.sum())
    parts = []
    try:
        for (lo, hi), k in zip(ranges, counts, strict=True):
            if k:
                parts.append(uniform_rows(view, lo, hi, int(k), rng))
    except ValueError:
        return None
    return np.concatenate(parts)


class CacheAwareSampler(Sampler):
    """``hot_share`` of each batch uniformly from RAM, the rest uniformly from the window.

    The cold picks heat their segments; the prefetch thread promotes the hottest cold segment
    in the background, so the hot tier follows what is being sampled.
    """

    def __init__(self, hot_share: float = 0.9) -> None:
        if not 0 <= hot_share <= 1:
            raise ValueError(f"hot_share must be in [0, 1], got {hot_share}")
        self.hot_share = hot_share

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        n_hot = int(round(batch_size * self.hot_share))
        hot = _hot_rows(view, n_hot, rng) if n_hot else np.empty(0, dtype=np.int64)
        if hot is None:
            hot = np.empty(0, dtype=np.int64)
        rest = uniform_rows(view, view.lo, view.hi, batch_size - len(hot), rng)
        rows = np.concatenate([hot, rest])
        return [(view.online, rows, _ones(len(rows)))]


class RecencySampler(Sampler):
    """Uniform over the newest ``window`` steps of the online window."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        lo = max(view.lo, view.hi - self.window)
        rows = uniform_rows(view, lo, view.hi, batch_size, rng)
        return [(view.online, rows, _ones(batch_size))]


class InterventionSampler(Sampler):
    """Intervention-only (``weight=None``) or intervention-weighted sampling.

    With ``weight=w`` an intervention step is ``w`` times as likely as an autonomous one
    (HG-DAgger-style emphasis on the operator's corrections).
    """

    def __init__(self, weight: float | None = None) -> None:
        if weight is not None and weight <= 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        self.weight = weight

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        interv = view.column("is_intervention")
        b = view.base
        lo, hi = view.lo, view.hi
        if self.weight is None:
            rows = uniform_rows(view, lo, hi, batch_size, rng, accept=interv)
            return [(view.online, rows, _ones(batch_size))]
        seg = slice(lo - b, hi - b)
        elig = view.eligible[seg]
        n_i = int(np.count_nonzero(elig & interv[seg]))
        n_o = int(np.count_nonzero(elig)) - n_i
        if n_i + n_o == 0:
            raise NothingToSample("nothing to sample: no eligible transition")
        p_i = self.weight * n_i / (self.weight * n_i + n_o)
        k = int(rng.binomial(batch_size, p_i))
        a = uniform_rows(view, lo, hi, k, rng, accept=interv) if k else np.empty(0, np.int64)
        o = (
            uniform_rows(view, lo, hi, batch_size - k, rng, accept=~interv)
            if batch_size - k
            else np.empty(0, np.int64)
        )
        return [(view.online, np.concatenate([a, o]), _ones(batch_size))]


PRIORS = ("offline", "interventions", "both")


class MixSampler(Sampler):
    """RLPD's symmetric sampling (Ball et al. 2023): online data mixed with prior data, per task.

    The online side is the buffer's window; ``prior`` says where the prior side comes from:

    * ``"offline"``: the mounted offline views (``ReplayBuffer.mount``); the online side is
      every eligible row of the window.
    * ``"interventions"``: the window's operator-labelled steps (``is_intervention``:
      demonstrations and takeovers stored beside the robots' own steps, as HIL-SERL keeps its
      prior data); the online side is the window's autonomous steps. Both sides come from one
      read of the window's flags.
    * ``"both"``: the window's operator-labelled steps and the mounted views, split in
      proportion to their sizes; the online side is the window's autonomous steps.

    Of ``n`` rows for a task, ``round(n * online_fraction)`` come uniformly from its online
    side and the rest uniformly from its prior side; a side with no eligible row gives its
    share to the other, so the whole draw comes from one side then.

    Args:
        online_fraction: share of each task's samples drawn from the online side, in [0, 1];
            a float for every task (RLPD's symmetric sampling is 0.5) or ``{task: share}``
            with ``default`` for the rest.
        prior: ``"offline"``, ``"interventions"`` or ``"both"`` (above).
        adaptive: split each batch across tasks in proportion to ``1 - success + floor``
            (recent success from :meth:`report_success`, an exponential moving average),
            so tasks that fail more get more samples. Without it tasks are not balanced: rows
            are drawn uniformly from each pool.
        smoothing: EMA factor of the success estimate (weight of the old value).
        floor: keeps solved tasks from vanishing from batches.
        online: with ``prior="offline"``, which window rows are the online side: ``"all"``
            eligible rows, or ``"interventions"``: the operator-labelled ones only
            (HG-DAgger trains on labels: its online side is the run's takeovers and
            demonstrations, its prior side the mounted datasets).

    Raises:
        ValueError: a share outside [0, 1] or an unknown ``prior``; from ``sample_indices``,
            no eligible row on either side (of a task).
    """

    def __init__(
        self,
        online_fraction: float | Mapping[str, float] = 0.5,
        *,
        prior: str = "offline",
        default: float = 0.5,
        adaptive: bool = False,
        smoothing: float = 0.9,
        floor: float = 0.1,
        online: str = "all",
    ) -> None:
        if isinstance(online_fraction, Mapping):
            shares = [default, *online_fraction.values()]
        else:
            shares = [default, online_fraction]
        for share in shares:
            if not 0.0 <= float(share) <= 1.0:
                raise ValueError(f"online_fraction must be in [0, 1], got {share}")
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
        if online not in ("all", "interventions") or (online != "all" and prior != "offline"):
            raise ValueError(
                f"online must be 'all', or 'interventions' with prior 'offline'; got {online!r}"
            )
        self.online = online
        self.online_fraction = online_fraction
        self.prior = prior
        self.default = default
        self.adaptive = adaptive
        self.smoothing = smoothing
        self.floor = floor
        self.success: dict[str, float] = {}

    def report_success(self, task: str, success: float) -> None:
        """Fold an episode outcome (1.0 success, 0.0 failure, or a rate) into ``task``."""
        old = self.success.get(task)
        s = float(success)
        self.success[task] = s if old is None else self.smoothing * old + (1 - self.smoothing) * s

    def _fraction(self, task: str | None) -> float:
        if isinstance(self.online_fraction, Mapping):
            return float(self.online_fraction.get(task or "", self.default))
        return float(self.online_fraction)

    def task_weights(self, tasks: list[str]) -> np.ndarray:
        w = np.array([1.0 - self.success.get(t, 0.0) + self.floor for t in tasks])
        return w / w.sum()

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        per_task = self.adaptive or isinstance(self.online_fraction, Mapping)
        if not per_task:
            return self._draw(view, None, batch_size, rng)
        tasks = view.task_names(offline=self.prior != "interventions")
        counts = rng.multinomial(batch_size, self.task_weights(tasks))
        picks: Picks = []
        leftover = 0
        for t, k in zip(tasks, counts, strict=True):
            if k:
                try:
                    picks.extend(self._draw(view, t, int(k), rng))
                except ValueError:  # a task seen but with nothing eligible on either side
                    leftover += int(k)
        if leftover:  # its share goes to every task's rows pooled
            picks.extend(self._draw(view, None, leftover, rng))
        return _by_source(picks)

    def _draw(
        self, view: SamplingView, task: str | None, n: int, rng: np.random.Generator
    ) -> Picks:
        """``n`` rows of ``task`` (None: every task): the online share, then the prior's."""
        priors: list[tuple[Source, np.ndarray]] = []
        if self.prior == "offline" and self.online == "interventions":
            labels = _window_split(view, task)[1]
            has_online = labels.size > 0

            def online(k: int) -> np.ndarray:
                return _choose(labels, k, rng)
        elif self.prior == "offline":
            has_online, accept = _window_accepts(view, task)

            def online(k: int) -> np.ndarray:
                return uniform_rows(view, view.lo, view.hi, k, rng, accept=accept)
        else:
            autonomous, operator = _window_split(view, task)
            has_online = autonomous.size > 0
            if operator.size:
                priors.append((view.online, operator))

            def online(k: int) -> np.ndarray:
                return _choose(autonomous, k, rng)

        if self.prior != "interventions":
            priors += [(s, r) for s in view.offline if len(r := s.task_rows(task))]
        n_on = int(round(n * self._fraction(task))) if priors else n
        if not has_online:
            n_on = 0
        if not priors and not has_online:
            raise NothingToSample(f"nothing to sample for task {task!r}: no eligible transition")
        picks: Picks = []
        if n_on:
            picks.append((view.online, online(n_on), _ones(n_on)))
        n_off = n - n_on
        if n_off:
            sizes = np.array([len(r) for _, r in priors], dtype=np.float64)
            # One pool takes all (a multinomial over one category draws nothing either).
            counts = rng.multinomial(n_off, sizes / sizes.sum()) if len(priors) > 1 else [n_off]
            for (s, r), k in zip(priors, counts, strict=True):
                if k:
                    picks.append((s, _choose_eligible(s, r, int(k), rng), _ones(int(k))))
        return _by_source(picks)

    def state_dict(self) -> dict[str, Any]:
        """``{"success": {task: rate}}``, or ``{}`` before any success was reported (nothing
        to restore)."""
        return {"success": dict(self.success)} if self.success else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.success = {str(k): float(v) for k, v in dict(state.get("success", {})).items()}


def _window_accepts(view: SamplingView, task: str | None) -> tuple[bool, np.ndarray | None]:
    """Whether the window may hold ``task``'s rows, and the accept mask of that task (indexed
    like the index columns; None: every task) for rejection sampling over the window."""
    if task is None:
        return view.hi > view.lo, None
    code = view.task_code(task)
    if code is None:
        return False, None
    accept = view.column("task") == code
    seg = slice(view.lo - view.base, view.hi - view.base)
    return bool((view.eligible[seg] & accept[seg]).any()), accept


def _window_split(view: SamplingView, task: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The window's eligible rows of ``task`` (None: every task) as ``(autonomous, operator-
    labelled)`` global rows, from one read of its flags: appends change the index
    concurrently, and counting in one read but drawing in another once found "no eligible
    transition" for a side that had been counted."""
    elig = np.array(view.window_column("eligible"), dtype=bool)
    interv = np.asarray(view.window_column("is_intervention"), dtype=bool)
    if task is not None:
        code = view.task_code(task)
        if code is None:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        elig &= view.window_column("task") == code
    return np.flatnonzero(elig & ~interv) + view.lo, np.flatnonzero(elig & interv) + view.lo


def _choose(rows: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` of ``rows`` uniformly, with replacement."""
    return rows[rng.integers(0, len(rows), size=k)]


def _choose_eligible(
    source: Source, rows: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
    """``k`` of ``rows`` (a list kept since it was read: a mount's rows, or the window's) that
    are still eligible, uniformly with replacement, by rejection: a row of an episode
    discarded meanwhile is drawn again.

    Raises:
        ValueError: none of ``rows`` is eligible any more.
    """
    got = _choose(rows, k, rng)
    elig, b = source.column("eligible"), source.base
    # Rows below the base are gone: a mount of its own buffer, whose retention goes on.
    gone = got < b
    gone[~gone] = ~elig[got[~gone] - b]
    if gone.any():
        held = rows[rows >= b]
        pool = held[elig[held - b]]
        if pool.size == 0:
            raise NothingToSample(f"nothing to sample from {source.name}: every row was discarded")
        got[gone] = _choose(pool, int(gone.sum()), rng)
    return got


def _by_source(picks: Picks) -> Picks:
    """Picks of the same source joined into one (rows in pick order), first seen first."""
    joined: dict[int, list[tuple[Source, np.ndarray, np.ndarray]]] = {}
    for pick in picks:
        joined.setdefault(id(pick[0]), []).append(pick)
    return [
        (same[0][0], np.concatenate([p[1] for p in same]), np.concatenate([p[2] for p in same]))
        if len(same) > 1
        else same[0]
        for same in joined.values()
    ]
