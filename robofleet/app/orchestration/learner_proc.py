"""The learner process of a run: ``python -m robofleet.app.orchestration.learner_proc ...``.

Started (and restarted after a crash) by the run's :class:`~robofleet.app.orchestration.supervisor.
ProcessSupervisor`. It resumes from the run directory's latest checkpoint; on a fresh run it
first fits the state normalisation and trains the weak initial policy by behaviour cloning on
the demonstrations already in the buffer, publishes it as a version and checkpoints. Then it
trains online (``cloud_learner.loop.Learner``) on batches from the cloud's
:class:`~buffer.service.BatchServer`, at most ``updates_per_s`` updates per
second and, when the spec sets ``buffer.samples_per_insert``, no faster than the robots
insert data (the sampling side of ``buffer.RateLimiter``: robots are never blocked).

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

    from buffer import RateLimiter
    from buffer.service import RemoteBuffer
    from cloud_learner.checkpoint import CheckpointError
    from cloud_learner.factory import build_algorithm, model_config
    from cloud_learner.learner_main import metadata_hook
    from cloud_learner.loop import Learner
    from cloud_learner.policy_card import CardPublisher, card_for
    from cloud_learner.run_plan import RunPlan
    from cloud_learner.sources import TransitionBatchSource
    from comms.weight_file import WeightDirectory
    from robofleet.runspec import parse_run_spec

    torch.set_num_threads(1)
    parent = os.getppid()
    lock_fd = _lock(args.run_dir)
    spec = parse_run_spec(json.loads((args.run_dir / "spec.json").read_text()))
    plan = RunPlan.from_spec(spec)
    params = plan.params
    settings = plan.learner_settings(*_run_dims(args.run_dir))
    try:
        device = learner_device(spec.learner.num_gpus)
    except RuntimeError as exc:
        print(f"learner: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    algorithm = build_algorithm(settings, device)
    sampling = plan.batch_sampling()
    reward_scale = float(sampling.pop("reward_scale"))
    remote = RemoteBuffer(args.batches, sampling=sampling)
    source = TransitionBatchSource(remote, device=device, reward_scale=reward_scale)
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
    # Robots run in real time and are never blocked: the learner waits for data. Each update
    # samples batch_size rows; the warm start's updates are not charged to the robots' rows.
    limiter = RateLimiter.sampling_side(spi) if spi is not None else None
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
            if limiter is not None and not limiter.allows_sample(
                params.batch_size,
                inserts=source.online_transitions(),
                samples=(learner.step - params.bc_updates) * params.batch_size,
            ):
                window = [t for t in window if t0 - t < 5.0]
                remote.stats = {**remote.stats, "updates_per_s": len(window) / 5.0}
                time.sleep(0.05)
                continue
            metrics = learner.train_step()
            # The algorithm's own losses (e.g. SAC's critic_loss, RECAP's value_loss) go
            # to the run driver with the counters.
            last.update({k: float(v) for k, v in metrics.items()})
            window.append(t0)
            window = [t for t in window if t0 - t < 5.0]
            remote.stats = {
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
        remote.close()
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


def _run_dims(run_dir: Path) -> tuple[int, int]:
    """(D, A): the sizes of ``observation.state`` and ``action`` in the run's buffer schema."""
    from buffer import StepSchema

    schema = StepSchema.from_json((run_dir / "buffer" / "schema.json").read_text())
    return schema.observations["observation.state"].size, schema.action.size


def _initial_policy(learner: object, source: object, params: object) -> None:
    """Normalisation from the demonstrations, BC updates, publish v1 and checkpoint
    (``cloud_learner.warm_start``; each algorithm's ``bc_update`` clones the demonstrations)."""
    from cloud_learner.loop import Learner
    from cloud_learner.sources import TransitionBatchSource
    from cloud_learner.warm_start import fit_state_normalization
    from robofleet.runspec import RunParams

    assert isinstance(learner, Learner)
    assert isinstance(source, TransitionBatchSource)
    assert isinstance(params, RunParams)
    learner.version = max(learner.version, int(learner.publisher.latest_version()))  # type: ignore[attr-defined]
    states = source.sample_numpy(4096)["observation.state"]
    fit_state_normalization(learner.algorithm, states, params.min_state_std)
    metrics: dict[str, float] = {}
    for _ in range(params.bc_updates):
        metrics = learner.algorithm.bc_update(source.sample(params.batch_size))
        learner.step += 1
    log.info(
        "initial policy: %d BC updates on the demonstrations (last %s)", params.bc_updates, metrics
    )
    learner._publish()  # the weak initial policy is version 1 of the run
    learner.save_checkpoint()


if __name__ == "__main__":
    sys.exit(main())
