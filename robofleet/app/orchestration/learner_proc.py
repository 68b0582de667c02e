"""The learner process of a run: ``python -m robofleet.app.orchestration.learner_proc ...``.

Started (and restarted after a crash) by the run's :class:`~robofleet.app.orchestration.supervisor.
ProcessSupervisor`. It resumes from the run directory's latest checkpoint; on a fresh run it
first fits the state normalisation and trains the weak initial policy by behaviour cloning on
the demonstrations already in the buffer, publishes it as a version and checkpoints. Then it
trains online (``cloud_learner.loop.Learner``) on batches from the cloud's
:class:`~robofleet.app.orchestration.batches.BatchServer`, at most ``updates_per_s`` updates per
second and, when the spec sets ``buffer.samples_per_insert``, no faster than the robots
insert data (:func:`updates_allowed`).

Weights are written with ``comms.weight_file.WeightDirectory`` under ``<run-dir>/weights``;
the cloud process hands each new version to comms' weight distributor, so encoding and
streaming never slow the updates here. Signals: SIGTERM = final checkpoint and
exit 0; SIGUSR1 = checkpoint at the next update boundary. The process also exits when its
parent (the cloud) is gone. Exit codes: 0 stopped, 4 refused (incompatible checkpoint).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_REFUSED = 4
log = logging.getLogger("robofleet.learner")


def _lock(run_dir: Path, timeout_s: float = 30.0) -> int:
    """One learner per run directory: wait for a dying predecessor to let go of the lock."""
    fd = os.open(run_dir / "learner.lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise SystemExit(f"learner: {run_dir} is held by another learner") from None
            time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="robofleet.app.orchestration.learner_proc")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--batches", required=True, help="BatchServer address (tcp://...)")
    parser.add_argument("--database-url", default=None, help="record versions/checkpoints")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(message)s")

    import torch

    from cloud_learner.checkpoint import CheckpointError
    from cloud_learner.factory import build_algorithm, model_config
    from cloud_learner.learner_main import metadata_hook
    from cloud_learner.loop import Learner
    from cloud_learner.policy_card import CardPublisher, card_for
    from comms.weight_file import WeightDirectory
    from robofleet.app.orchestration.batches import RemoteBufferSource
    from robofleet.app.orchestration.params import RunParams, batch_sampling, learner_settings
    from robofleet.runspec import parse_run_spec

    torch.set_num_threads(1)
    parent = os.getppid()
    lock_fd = _lock(args.run_dir)
    spec = parse_run_spec(json.loads((args.run_dir / "spec.json").read_text()))
    params = RunParams.from_spec(spec)
    settings = learner_settings(spec, params)
    try:
        device = learner_device(spec.learner.num_gpus)
    except RuntimeError as exc:
        print(f"learner: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    algorithm = build_algorithm(settings, device)
    sampling = batch_sampling(spec, params)
    reward_scale = float(sampling.pop("reward_scale"))
    source = RemoteBufferSource(
        args.batches, sampling=sampling, reward_scale=reward_scale, device=device
    )
    # Every version carries its policy card, so robots and the evaluator build the right
    # policy (MLP, RECAP's indicator MLP, SAC's Gaussian) from the weights alone.
    publisher = CardPublisher(
        WeightDirectory(args.run_dir / "weights", keep=5),
        card_for(settings.algorithm, algorithm.policy),
    )
    hook = metadata_hook(args.database_url, args.run_id) if args.database_url else None
    learner = Learner(
        args.run_dir,
        algorithm,
        source,
        publisher,
        settings,
        model_config(settings),
        hook=hook,
    )
    try:
        resumed = learner.start(resume=True)
    except (CheckpointError, ValueError) as exc:
        print(f"learner: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED

    flags = {"stop": False, "checkpoint": False}
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("stop", True))
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("checkpoint", True))

    if not resumed:
        _initial_policy(learner, source, params)

    period = 1.0 / params.updates_per_s if params.updates_per_s > 0 else 0.0
    spi = spec.buffer.samples_per_insert
    window: list[float] = []
    last: dict[str, float] = {"loss": float("nan")}
    try:
        while not flags["stop"]:
            if os.getppid() != parent:
                log.warning("the cloud process is gone; stopping")
                break
            if flags["checkpoint"]:
                flags["checkpoint"] = False
                learner.save_checkpoint()
            t0 = time.monotonic()
            if spi is not None and not updates_allowed(
                learner.step - params.bc_updates,
                spi,
                source.online_transitions(),
                params.batch_size,
            ):
                # Robots run in real time and are never blocked: the learner waits for data.
                window = [t for t in window if t0 - t < 5.0]
                source.stats = {**source.stats, "updates_per_s": len(window) / 5.0}
                time.sleep(0.05)
                continue
            metrics = learner.train_step()
            # The algorithm's own losses (e.g. SAC's critic_loss, RECAP's value_loss) go
            # to the run driver with the counters.
            last.update({k: float(v) for k, v in metrics.items()})
            window.append(t0)
            window = [t for t in window if t0 - t < 5.0]
            source.stats = {
                **last,
                "learner_step": float(learner.step),
                "policy_version": float(learner.version),
                "updates_per_s": len(window) / 5.0,
            }
            spare = period - (time.monotonic() - t0)
            if spare > 0:
                time.sleep(spare)
        learner.save_checkpoint()
    except TimeoutError as exc:
        log.warning("%s; exiting without a final checkpoint", exc)
    finally:
        learner.close()
        source.close()
        os.close(lock_fd)
    log.info("stopped at learner step %d, policy version %d", learner.step, learner.version)
    return 0


def learner_device(num_gpus: float) -> Any:
    """The learner's torch device: CUDA when the spec reserves a GPU (``learner.num_gpus``),
    else the CPU. The learner runs beside the cloud process, so the GPU must be on that node.

    Raises:
        RuntimeError: a GPU was asked for and torch sees no CUDA device here.
    """
    import torch

    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"learner.num_gpus is {num_gpus} but torch sees no CUDA device on the cloud's node "
            "(the learner process runs beside the cloud); set learner.num_gpus: 0"
        )
    return torch.device("cuda")


def updates_allowed(
    online_updates: int, samples_per_insert: float, online_rows: int, batch_size: int
) -> bool:
    """Whether the learner may take one more update under the run's samples-per-insert rate.

    The sampling side of Reverb's rate limiter (Cassirer et al. 2021, "Reverb: A Framework
    for Experience Replay", SampleToInsertRatio): each update samples ``batch_size`` rows, so
    after ``online_updates`` updates (BC warm-start updates excluded) the learner has drawn
    ``online_updates * batch_size`` samples against ``online_rows`` rows the robots inserted;
    it may go on while that stays below ``samples_per_insert * online_rows``. The insert side
    is never limited: robots act in real time and an acknowledged step is never refused
    (``buffer.RateLimiter`` blocks both sides, for in-process learners fed from a buffer).

    Args:
        online_updates: updates taken since the warm start (>= 0; negative counts as 0).
        samples_per_insert: sampled rows per inserted online row (> 0); e.g. 64 at batch 128
            is 0.5 updates per environment step.
        online_rows: rows in the buffer from robots (demonstrations excluded).
        batch_size: rows per update (> 0).

    Raises:
        ValueError: a non-positive ``samples_per_insert`` or ``batch_size``.
    """
    if samples_per_insert <= 0 or batch_size <= 0:
        raise ValueError(
            f"samples_per_insert ({samples_per_insert}) and batch_size ({batch_size}) must be > 0"
        )
    return (max(0, online_updates) + 1) * batch_size <= samples_per_insert * online_rows


def _initial_policy(learner: object, source: object, params: object) -> None:
    """Normalisation from the demonstrations, BC updates, publish v1 and checkpoint
    (``cloud_learner.warm_start``: each algorithm's way of cloning the demonstrations)."""
    from cloud_learner.loop import Learner
    from cloud_learner.warm_start import bc_update, fit_state_normalization
    from robofleet.app.orchestration.batches import RemoteBufferSource
    from robofleet.app.orchestration.params import RunParams

    assert isinstance(learner, Learner)
    assert isinstance(source, RemoteBufferSource)
    assert isinstance(params, RunParams)
    learner.version = max(learner.version, int(learner.publisher.latest_version()))  # type: ignore[attr-defined]
    states = source.sample_numpy(4096)["observation.state"]
    fit_state_normalization(learner.algorithm, states, params.min_state_std)
    metrics: dict[str, float] = {}
    for _ in range(params.bc_updates):
        metrics = bc_update(learner.algorithm, source.sample(params.batch_size))
        learner.step += 1
    log.info(
        "initial policy: %d BC updates on the demonstrations (last %s)", params.bc_updates, metrics
    )
    learner._publish()  # the weak initial policy is version 1 of the run
    learner.save_checkpoint()


if __name__ == "__main__":
    sys.exit(main())
