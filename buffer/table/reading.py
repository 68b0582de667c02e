"""Reading sampled rows: transitions and sequences gathered from the tiered storage and the
row index, and the one merge of a sampler's picks into a batch.

A sampler picks rows (``buffer.sampling.samplers``); :func:`gather` reads each picked source's rows in
row order (sequential reads of the segments), tags them with their ``source`` and ``weight``
and concatenates the parts. ``ReplayBuffer.sample`` and ``sample_sequences`` both use it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from buffer.errors import NothingToSample, SegmentGoneError
from buffer.sampling.view import Picks, Table
from buffer.table.chunks import out_arrays
from buffer.table.features import FINAL_PREFIX
from buffer.table.index import Frame, RowIndex
from buffer.table.row_groups import Successors
from buffer.table.state import TableState

# Index columns every sampled row carries as is.
SCALAR_OUT = (
    "reward",
    "terminated",
    "truncated",
    "is_intervention",
    "policy_version",
    "episode_index",
    "frame_index",
    "timestamp",
)


def gather(
    picks: Picks, read: Callable[[Table, np.ndarray], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """One batch from a sampler's picks: ``read(buffer, rows)`` of each non-empty pick with its
    rows in ascending order, plus ``source`` (int16, the pick's ``source_id``) and ``weight``
    (float32, the pick's weights in the same order), concatenated in pick order.

    Raises:
        ValueError: every pick is empty (nothing to sample).
    """
    parts = []
    for src, rows, weights in picks:
        if len(rows) == 0:
            continue
        order = np.argsort(rows, kind="stable")
        part = read(src.buffer, rows[order])
        if src.task is not None:  # an offline view whose rows count as one task
            part["task"] = np.full(len(rows), src.task, dtype=object)
        part["source"] = np.full(len(rows), src.source_id, dtype=np.int16)
        part["weight"] = weights[order].astype(np.float32)
        parts.append(part)
    if not parts:
        raise NothingToSample("nothing to sample")
    return concat_parts(parts)


def concat_parts(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Sampled parts with the same keys as one batch, in order (the one part as it is)."""
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def sample_across_shards(
    batch_size: int,
    sizes: Callable[[], np.ndarray],
    rng: np.random.Generator,
    draw: Callable[[np.ndarray], list[tuple[int, dict[str, np.ndarray] | None]]],
    nothing: Callable[[bool], None],
    concat: Callable[[list[dict[str, np.ndarray]]], dict[str, np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
    """``batch_size`` rows across shards in proportion to their sizes, so every transition is
    equally likely whichever shard holds it: the rows per shard are a multinomial draw
    weighted by ``sizes()`` (float64 ``(shards,)``), ``draw(counts)`` returns ``(k, part)``
    for each shard it drew from, a part of ``counts[k]`` rows or None when shard ``k``'s
    sampler finds nothing there; such a shard's share is drawn again from the others. The
    parts get ``shard`` (int16) and are joined in order by ``concat`` (``concat_parts`` by
    default).

    ``nothing(barren)`` is called while no shard can be drawn from (``barren``: some shard's
    sampler found nothing, else every shard is empty): it raises, or waits and returns to
    try again.
    """
    parts: list[dict[str, np.ndarray]] = []
    barren: set[int] = set()
    need = batch_size
    while need > 0:
        weights = sizes()
        weights[list(barren)] = 0
        if weights.sum() <= 0:
            nothing(bool(barren))
            continue
        counts = rng.multinomial(need, weights / weights.sum())
        for k, part in draw(counts):
            if part is None:
                barren.add(k)
                continue
            part["shard"] = np.full(int(counts[k]), k, dtype=np.int16)
            parts.append(part)
            need -= int(counts[k])
    return (concat or concat_parts)(parts)


def read_transitions(
    st: TableState, rows: np.ndarray, *, count: bool = True
) -> dict[str, np.ndarray]:
    """Transitions at global ``rows`` (eligible rows; keys of ``ReplayBuffer.sample`` but
    ``source``/``weight``). ``count``: the reads count toward the cache hit rate."""
    snap = st.storage.snapshot()
    chunks, starts, _ = snap
    idx = st.index
    with st.lock:
        b, all_cols = idx.frame()
    _check_held(rows, b)
    cols = {k: all_cols[k] for k in SCALAR_OUT}
    nxt_col = all_cols["next_row"]
    li = rows - b
    # A done step's next observation is its real final observation, stored beside it; an
    # interrupted episode's done step (buffer.table.index) has none but its stored successor.
    final = (cols["terminated"][li] | cols["truncated"][li]) & (nxt_col[li] < 0)
    nxt = np.where(final, rows, nxt_col[li])
    obs_names = list(st.schema.observations)
    n = len(rows)
    specs = {k: ((n, *f.shape), f.dtype) for k, f in st.schema.payload.items()}
    specs.update(
        {FINAL_PREFIX + k: ((n, *f.shape), f.dtype) for k, f in st.schema.observations.items()}
    )
    block = out_arrays(specs)
    nobs = {k: block[FINAL_PREFIX + k] for k in obs_names}
    # A file-backed observation and the next one are read in one call where adjacent.
    then = Successors(nxt, nobs, np.zeros(n, dtype=bool))
    out = st.storage.gather(rows, list(st.schema.payload), snap, count=count, out=block, then=then)
    st.storage.gather(nxt, obs_names, snap, count=False, out=nobs, skip=then.read)
    if final.any():
        finals = st.storage.finals_for(rows[final], chunks, starts)
        for pos in np.flatnonzero(final):
            f = finals.get(int(rows[pos]))
            if f is not None:
                for k, v in f.items():
                    nobs[k][pos] = v
    for k in SCALAR_OUT:
        out[k] = cols[k][li]
    out.update(_names(idx, all_cols, li))
    out["index"] = rows.astype(np.int64)
    return out


def _check_held(rows: np.ndarray, base: int) -> None:
    """Raise ``SegmentGoneError`` when a row is below the index's ``base``: compaction
    dropped it after retention deleted its segment (a sampler picked it just before)."""
    if len(rows) and int(rows.min()) < base:
        raise SegmentGoneError(f"row {int(rows.min())} was deleted by retention (first {base})")


def read_sequences(
    st: TableState, starts: np.ndarray, length: int, history: int
) -> dict[str, np.ndarray]:
    """Sequences of ``history + length`` steps around sorted global ``starts`` (see
    ``ReplayBuffer.sample_sequences`` for the keys and the padding rule)."""
    grid, mask, (b, cols) = _sequence_grid(st, starts, length, history)
    B, T = grid.shape
    flat = grid.reshape(-1)
    snap = st.storage.snapshot()
    out = st.storage.gather(flat, list(st.schema.payload), snap)
    res: dict[str, np.ndarray] = {k: v.reshape((B, T, *v.shape[1:])) for k, v in out.items()}
    li = flat - b
    for k in SCALAR_OUT:
        res[k] = cols[k][li].reshape(B, T)
    res.update({k: v.reshape(B, T) for k, v in _names(st.index, cols, li).items()})
    res["mask"] = mask
    last = grid[np.arange(B), history + mask[:, history:].sum(axis=1) - 1]
    # A step past the episode end never came; the last valid one bootstraps.
    tail = read_transitions(st, last, count=False)
    for k in st.schema.observations:
        res[FINAL_PREFIX + k] = tail[FINAL_PREFIX + k]
    res["bootstrap_terminated"] = tail["terminated"]
    res["index"] = starts.astype(np.int64)
    return res


def read_action_chunks(st: TableState, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """The actions of steps ``t .. t + length - 1`` of each start's episode: ``action_chunk``
    ``(B, length, A)`` and ``action_chunk_is_pad`` (bool ``(B, length)``, True past the
    episode's end, where the last real action repeats; LeRobot's ``action_is_pad``)."""
    grid, mask, _ = _sequence_grid(st, starts, length, 0)
    b, t = grid.shape
    actions = st.storage.gather(grid.reshape(-1), ["action"], count=False)["action"]
    return {
        "action_chunk": actions.reshape((b, t, *actions.shape[1:])),
        "action_chunk_is_pad": ~mask,
    }


def _sequence_grid(
    st: TableState, starts: np.ndarray, length: int, history: int
) -> tuple[np.ndarray, np.ndarray, Frame]:
    """Rows ``(B, history + length)`` following the episode links back from and forward of
    each start, the mask of real steps (False: padding repeating the nearest real one) and
    the index's ``(base, cols)`` the grid was read from. Forward only through transitions
    whose own successor is known, so the last real step can bootstrap.

    Raises:
        SegmentGoneError: a start's row is gone (retention deleted it after the pick).
    """
    idx = st.index
    with st.lock:
        frame = idx.frame()
        visible = st.visible
        # History may reach rows retention already deleted: those are padding, not reads.
        kept = st.storage.chunks[0].first_row if st.storage.chunks else visible
    b, cols = frame
    _check_held(starts, b)
    nxt_col, prv_col = cols["next_row"], cols["prev_row"]
    term, trunc = cols["terminated"], cols["truncated"]
    elig = cols["eligible"]
    lo = max(b, kept)
    B, T = len(starts), history + length
    grid = np.empty((B, T), dtype=np.int64)
    mask = np.ones((B, T), dtype=bool)
    grid[:, history] = starts
    cur = starts.copy()
    ok = np.ones(B, dtype=bool)
    for j in range(history - 1, -1, -1):
        p = prv_col[cur - b]
        ok &= p >= lo
        cur = np.where(ok, p, cur)
        grid[:, j] = cur
        mask[:, j] = ok
    cur = starts.copy()
    ok = np.ones(B, dtype=bool)
    for j in range(history + 1, T):
        li = cur - b
        n = nxt_col[li]
        ok &= ~(term[li] | trunc[li]) & (n >= 0) & (n < visible)
        ok &= elig[np.where(ok, n, cur) - b]
        cur = np.where(ok, n, cur)
        grid[:, j] = cur
        mask[:, j] = ok
    return grid, mask, frame


def _names(idx: RowIndex, cols: dict[str, np.ndarray], li: np.ndarray) -> dict[str, np.ndarray]:
    """``task`` and ``robot_id`` (str objects) of positions ``li`` of ``idx``'s ``cols``."""
    return {
        "task": np.asarray(idx.tasks.names, dtype=object)[cols["task"][li]],
        "robot_id": np.asarray(idx.robots.names, dtype=object)[cols["robot"][li]],
    }
