"""Persistent, cache-aware replay buffer: step schema, WAL, Arrow segments, samplers, rate
limiter, and its batch service for a learner in another process.

Every acknowledged step is durable (fdatasync'ed in a checksummed write-ahead log of Arrow IPC
record batches; a full log is sealed into an immutable segment by renaming its files, so each
byte is written once); the learner samples from RAM (hot tier) and memory-mapped
segments (cold tier) within a byte budget; a directory outlives runs and can be mounted by
later runs as offline data or exported to LeRobotDataset v3.

The whole public API::

    from buffer import BufferSettings, ReplayBuffer, StepSchema, RateLimiter, samplers

    schema = StepSchema.from_features(
        {"observation.state": {"dtype": "float32", "shape": (39,), "names": [...]},
         "observation.images.front": {"dtype": "image", "shape": (84, 84, 3)}},
        {"action": {"dtype": "float32", "shape": (4,)}},
    )
    buf = ReplayBuffer.open("data/buffer", schema, BufferSettings(memory_budget_bytes=2**30))
    # later: ReplayBuffer.open("data/buffer") reopens with the stored schema (after a crash
    # too: the WAL is replayed, a torn tail dropped, nothing acknowledged lost).

    # Ingest (comms/edge): an Arrow RecordBatch (the wire format) or a list of step dicts.
    # Columns: seq, robot_id, run_id, task, episode_index, frame_index, timestamp, reward,
    # terminated, truncated, is_intervention, policy_version, observation.*, action,
    # optional action.policy / action.operator, and on done steps next.observation.* (the
    # real final observation). See buffer.schema for types; schema.batch_from_records(dicts)
    # builds the batch.
    result = buf.append(batch)          # returns only after fdatasync
    result.acked                        # {robot_id: highest durable seq}
    # All-or-nothing: one invalid record -> StepValidationError (names record + field) and
    # nothing of the batch is stored. Records whose (robot_id, seq) is already stored are
    # acknowledged again without being stored twice (safe retries). A full disk ->
    # DiskFullError (nothing of the batch stored; retry): appends are taken again by
    # themselves once space is back, no reopen needed.

    # An operator's verdict (edge -> comms): the episode is never trained on, durably.
    buf.mark_episode("robot-3", "run-1", episode_index=7, kind="rerecord")  # or "discard"
    # Its rows (stored before or after) are never eligible: no sampler returns them, len,
    # select and export leave them out. Outcomes exclude nothing and label the episode:
    buf.mark_episode("robot-3", "run-1", episode_index=8, kind="success")  # or "failure"
    buf.select(success_only=True, time_range=(0.0, 5.0))  # successful episodes' first 5 s An episode whose robot went on to another without a
    # done step (its agent was killed) is closed as truncated at its last transition.

    # Backpressure (uplink): with a rate limiter, buf.can_accept(n) says whether an insert of
    # n would go through now; append(batch, timeout=0.5) raises BackpressureError (with
    # .retry_after_s) instead of blocking longer.

    # Learner:
    limiter = RateLimiter(samples_per_insert=4.0, min_size_to_sample=1000)  # Reverb's rule
    buf = ReplayBuffer.open(path, schema, settings, rate_limiter=limiter)
    # (a learner in another process: RateLimiter.sampling_side(spi).allows_sample(n,
    # inserts=online_rows, samples=drawn) -- robots' inserts are never blocked)
    batch = buf.sample(256)                                   # uniform
    batch = buf.sample(256, sampler=samplers.PrioritizedSampler())
    # keys: observation.*, next.observation.*, action, action.policy, action.operator,
    # reward, terminated, truncated, is_intervention, policy_version, episode_index,
    # frame_index, timestamp, task, robot_id, index, source, weight (all numpy, dim 0 = B)
    seqs = buf.sample_sequences(64, length=10, history=2)   # action chunks, n-step, stacks
    # (B, history + length, ...) arrays + mask; never crosses an episode boundary.

    # Reuse: mount an earlier run's directory as offline data (no copy), mix per task.
    buf.mount("data/old_run", tasks=["reach-v3"], interventions_only=True)
    batch = buf.sample(256, sampler=samplers.MixSampler(online_fraction=0.5))  # RLPD 50/50
    # prior="interventions": the window's operator-labelled steps are the prior data instead
    # (HIL-SERL's demonstrations beside online data); prior="both": those and the mounts.
    state = sampler.state_dict()  # into the learner checkpoint; sampler.load_state_dict(state)

    # Another process (the learner): buffer.service.batches.BatchServer(buf, tasks, sampler,
    # demonstration_robots=[...]) serves batches drawn with that sampler over ZeroMQ;
    # buffer.service.batches.RemoteBuffer(address) asks it (foundation.contracts.TransitionSource:
    # numpy columns, task_index, is_demonstration, success).

    # A lab's datasets (LeRobotDataset v3, ROS 2 bags) come in and go out through lab_data.

    buf.stats()   # size_transitions, bytes_on_disk, bytes_in_cache, cache_hit_rate,
                  # prefetch_lag_s, ack_latency_p50_s/p99_s, discarded_episodes, ...
    buf.close()

On-disk format: version ``buffer.files.format.FORMAT_VERSION`` (2). WAL files start with the
marker ``RFWAL002``; sealed segments are those WAL files renamed (``buffer.files.sealed``).
Version-1 directories are still read (``RFWAL001`` WALs, Arrow segments carrying
``robofleet.buffer.format_version`` in their schema metadata). ``open`` refuses a file of another version or with an unknown marker with
``UnsupportedFormatError`` naming the file, the version found and the versions supported
(nothing is read, dropped or changed); a torn WAL tail (or a header never fully written)
is still dropped as before.

Memory: payload (hot chunks, the open tail and its pre-faulted spare, the small columns of
cold chunks while they fit) stays inside ``memory_budget_bytes``; cold rows are read from
their segment files with ``pread``, final observations of sealed rows too. The open tail
holds only its small columns: its camera frames are read back from its WAL files
(``tail_reads``), and a sealed tail is cold until sampling makes the prefetch thread
promote it. Outside the budget
only the row index grows with the data: 85 bytes per stored row (``buffer.table.index``), plus a
few KB per sealed segment (its record table, file names). Measured in a fresh process by
``python -m buffer.bench.memory_probe`` (a row of ``robofleet bench buffer``): with a 16 MiB
budget and 64x64x3 frames, resident memory stays at or under the budget at 2x, 10x and 20x
its worth of data.

Per-robot lookups (durable rows only, i.e. acknowledged)::

    buf.durable_seq("robot-3")          # highest durable seq of that robot, or None
    buf.stored_seqs("robot-3")          # int64 array of its durable seqs, ascending
    buf.contains("robot-3", seqs)       # bool mask, same shape as seqs

Threads: ``append`` may be called from many threads (one per robot) and ``sample`` from
several at once; readers never see a partly written row (rows become visible only after
their fdatasync, in log order).

Where things are (``ReplayBuffer`` owns the parts, Reverb's table shape)::

    replay_buffer  ReplayBuffer: open, window, sample, mount, stats, close
    state          what the parts share: lock, row index, tiered storage, visible rows
    writer         durable appends: validation, WAL, group commit, watermark, acks
    admission      the appends' flat combiner: one thread stages the waiting appends
    sealer         full tails -> sealed segments (a rename), the pre-faulted spare tail
    tail_reads     the open tail's camera frames, read back from its WAL files (pread)
    retention      the remover: segment catalogue, oldest segments deleted past the limit
    recovery       open: finish seals, map segments, replay the WAL's contiguous prefix
    reading        transitions, sequences, the one merge of sampled parts (and across shards)
    lookups        per-robot durable seqs;  prefetch: the cold -> hot promotion thread
    marks          episode marks (discard, rerecord; outcomes success, failure)
    view           what samplers see (SamplingView, Source);  samplers: which rows
    rate_limiter   samples per insert;  service: BatchServer / RemoteBuffer
    schema, wal, sealed, segments, storage, index, format: the step schema and the files
"""

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
from buffer.sampling import samplers
from buffer.sampling.rate_limiter import RateLimiter
from buffer.sampling.samplers import (
    CacheAwareSampler,
    InterventionSampler,
    MixSampler,
    PrioritizedSampler,
    RecencySampler,
    Sampler,
    UniformSampler,
)
from buffer.table.replay_buffer import AppendResult, OfflineView, ReplayBuffer
from buffer.table.schema import FeatureSpec, StepSchema

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
