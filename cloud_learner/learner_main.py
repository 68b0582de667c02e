"""The learner process: ``python -m cloud_learner.learner_main --run-dir DIR --source SRC``.

Sources:
  * ``npz:PATH``   numpy columns (LeRobot keys) loaded with ``allow_pickle=False``;
  * ``buffer:DIR`` the replay buffer at DIR (``buffer.ReplayBuffer``), once buffer/ exports it.

Weights are published as safetensors files under ``<run-dir>/weights`` (``--publish-dir``
to change). Exit codes: 0 done, 2 bad settings or arguments, 4 refused (checkpoints exist
without ``--resume``, or an incompatible checkpoint).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cloud_learner.checkpoint import CheckpointError
from cloud_learner.config import LearnerSettings
from cloud_learner.core import BatchSource
from cloud_learner.factory import build_algorithm, model_config, resolve_device
from cloud_learner.loop import Learner, set_torch_threads
from cloud_learner.sources import BufferSource, InMemorySource
from comms.weight_file import WeightDirectory

EXIT_REFUSED = 4
log = logging.getLogger("robofleet.learner")


def open_source(spec: str, settings: LearnerSettings, device: Any) -> BatchSource:
    """Parse ``npz:PATH`` or ``buffer:DIR`` into a batch source."""
    kind, _, where = spec.partition(":")
    if kind == "npz":
        with np.load(where, allow_pickle=False) as data:
            columns = {k: data[k] for k in data.files}
        return InMemorySource(columns, seed=settings.seed, device=device)
    if kind == "buffer":
        from buffer import InterventionSampler, MixSampler, RateLimiter, ReplayBuffer

        limiter = None
        if settings.samples_per_insert:
            limiter = RateLimiter(
                samples_per_insert=settings.samples_per_insert,
                min_size_to_sample=max(1, settings.min_transitions),
                max_sample=settings.batch_size,
            )
        sampler: Any = None
        if settings.sampler == "intervention":
            sampler = InterventionSampler()
        elif settings.sampler == "mix":
            sampler = MixSampler(online_fraction=settings.online_fraction)
        buf = ReplayBuffer.open(where, rate_limiter=limiter)
        return BufferSource(buf, tasks=settings.tasks, sampler=sampler, device=device)
    raise SystemExit(f"--source must be npz:PATH or buffer:DIR, got {spec!r}")


def make_evaluate(settings: LearnerSettings, policy: Any) -> Any:
    """Success rate per task on Meta-World (tasks named in ``settings.tasks``), or None."""
    if not settings.eval_every_updates or not settings.tasks:
        return None
    from cloud_learner.evaluation import evaluate_metaworld

    def evaluate(step: int) -> dict[str, float]:
        seeds = list(range(100_000, 100_000 + settings.eval_episodes))  # held out, fixed
        results = evaluate_metaworld(
            policy, settings.tasks, seeds, settings.eval_max_steps, settings.eval_state_indices
        )
        metrics = {f"success/{r.task}": r.success_rate for r in results}
        metrics["success/mean"] = float(np.mean([r.success_rate for r in results]))
        log.info("evaluation at step %d: %s", step, metrics)
        return metrics

    return evaluate


def metadata_hook(database_url: str, run_id: str) -> Any:
    """Records published versions and checkpoints in the metadata store (for the dashboard)."""
    from robofleet.store.models import Checkpoint, PolicyVersion
    from robofleet.store.store import MetadataStore

    store = MetadataStore(database_url)

    def hook(kind: str, data: Mapping[str, Any]) -> None:
        with store.session() as s:
            if kind == "published":
                s.add(
                    PolicyVersion(
                        run_id=run_id,
                        version=int(data["version"]),
                        learner_step=int(data["learner_step"]),
                        num_bytes=int(data["num_bytes"]),
                    )
                )
            elif kind == "checkpoint":
                s.add(
                    Checkpoint(
                        run_id=run_id,
                        learner_step=int(data["learner_step"]),
                        policy_version=int(data["policy_version"]),
                        path=str(data["path"]),
                    )
                )
            store.record_event(f"learner.{kind}", run_id=run_id, session=s, **dict(data))

    return hook


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cloud_learner.learner_main",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=None, help="robofleet YAML settings")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--source", required=True, help="npz:PATH or buffer:DIR")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run dir's latest checkpoint (else refuse)",
    )
    parser.add_argument("--publish-dir", type=Path, default=None)
    parser.add_argument("--run-id", default=None, help="record versions/checkpoints in the DB")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override a learner setting, e.g. --set max_updates=200",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from robofleet.app.settings import SettingsError, load_settings

    try:
        overrides: dict[str, Any] = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise SettingsError(f"--set needs KEY=VALUE, got {item!r}")
            overrides[key] = json.loads(value)
        settings = load_settings(args.config)
        unknown = sorted(set(overrides) - set(LearnerSettings.model_fields))
        if unknown:
            raise SettingsError(f"--set: unknown learner settings {unknown}")
        merged = {**settings.learner.model_dump(), **overrides}
        learner_settings = LearnerSettings.model_validate(merged)
    except (SettingsError, ValueError) as exc:
        print(f"learner: {exc}", file=sys.stderr)
        return 2

    set_torch_threads(learner_settings.torch_threads)
    device = resolve_device(learner_settings.device)
    algorithm = build_algorithm(learner_settings, device)
    source = open_source(args.source, learner_settings, device)
    publisher = WeightDirectory(args.publish_dir or args.run_dir / "weights")
    hook = metadata_hook(settings.database_url, args.run_id) if args.run_id else None
    evaluate = make_evaluate(learner_settings, algorithm.policy)
    learner = Learner(
        args.run_dir,
        algorithm,
        source,
        publisher,
        learner_settings,
        model_config(learner_settings),
        hook=hook,
        evaluate=evaluate,
        eval_every_updates=learner_settings.eval_every_updates,
    )
    try:
        learner.start(resume=args.resume)
    except (CheckpointError, ValueError) as exc:
        print(f"learner: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    try:
        learner.run(should_stop=lambda: stop["now"])
        learner.save_checkpoint()
    finally:
        learner.close()
    log.info("stopped at learner step %d, policy version %d", learner.step, learner.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
