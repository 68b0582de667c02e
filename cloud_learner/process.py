"""The learner process of a run: ``python -m cloud_learner.process --run-dir DIR ...``.

The run driver starts it (and restarts it after a crash) beside the cloud process, under a
``ProcessSupervisor``. It reads the run's ``spec.json`` and its buffer's ``schema.json`` from
the run directory, builds the spec's policy (any kind: MLP, CNN on the robots' cameras,
flow-matching chunks, LeRobot's ACT and Diffusion, SmolVLA/pi0 from a local checkpoint) and
resumes from the directory's latest checkpoint. On a fresh run it loads its starting weights
(``--init-weights``: an earlier run's promoted version or a checkpoint,
``cloud_learner.init_weights``), waits for the demonstrations the robots' operators record
(``demonstrations.episodes_per_task``), fits the normalisation (unless the starting weights
brought theirs) and trains the weak initial policy on the demonstrations and the mounted
offline data (each algorithm's ``bc_update``), publishes it as version 1 and checkpoints.
Then, once the buffer holds the spec's ``buffer.min_size`` robot transitions (the
demonstrations do not count), it trains online (:class:`cloud_learner.loop.Learner`) on
batches from the run's buffer service (``buffer.service.batches.BatchServer``, another process), at
most ``updates_per_s`` updates per second and, when the spec sets
``buffer.samples_per_insert``, no faster than the robots insert data (the sampling side of
``buffer.RateLimiter``: robots are never blocked).

Weights go to ``<run-dir>/weights`` (``comms.cloud.weight_file.WeightDirectory``); the cloud process
hands each new version to comms' distributor, so encoding and streaming never slow the updates
here, and records the versions (from the learner's journal, ``cloud_learner.loop.PUBLISHED``)
and checkpoints in the metadata store: this process needs no store access. Signals: SIGTERM = final checkpoint and exit 0; SIGUSR1 = checkpoint at
the next update boundary. The process also stops when its parent (the cloud) is gone.
Its batch requests carry the batch token the cloud puts in its environment
(``ROBOFLEET_BATCH_TOKEN``, ``buffer.service.batch_token``).
Exit codes: 0 stopped, 4 refused (no GPU where one was asked for, a checkpoint the spec no
longer fits, no batch token): restarting cannot help, so the refusal is also written, durably, to
``<run-dir>/learner.refused`` (:func:`read_refusal`) for the run driver to end the run with;
each start removes the last one first.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from buffer import StepSchema
from buffer.service.batch_token import token_from_env
from buffer.service.batches import RemoteBuffer, RemoteNothingToSample
from buffer.service.sharded_batches import ShardedRemoteBuffer
from cloud_learner.checkpoint import CheckpointError
from cloud_learner.classifier_training import ClassifierPublisher, ClassifierTrainer
from cloud_learner.factory import build_algorithm, model_config
from cloud_learner.help_probe_training import ProbePublisher, ProbeTrainer
from cloud_learner.init_weights import card_spec, load_into, read_initial
from cloud_learner.loop import Learner
from cloud_learner.mix_losses import TaskLossWindow, per_row_bc_loss
from cloud_learner.policy_card import CardPublisher, card_for
from cloud_learner.run_plan import RunPlan
from cloud_learner.sources import TransitionBatchSource
from cloud_learner.warm_start import fit_state_normalization
from comms.cloud.weight_file import WeightDirectory
from foundation.durable import atomic_write_text
from foundation.runspec import RunParams, parse_run_spec

EXIT_REFUSED = 4
REFUSAL = "learner.refused"  # in the run dir: why the last start was refused
log = logging.getLogger("robofleet.learner")


class Refused(RuntimeError):
    """The learner cannot start this run here; ``str`` says why (exit code 4)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(message)s")
    torch.set_num_threads(1)
    lock_fd = _lock(args.run_dir)
    (args.run_dir / REFUSAL).unlink(missing_ok=True)
    try:
        proc = RunLearner.open(args.run_dir, args.batches, args.init_weights, token=_batch_token())
    except Refused as exc:
        print(f"learner: refused: {exc}", file=sys.stderr)
        try:
            atomic_write_text(args.run_dir / REFUSAL, f"{exc}\n")
        except OSError as err:  # still refused: the run driver then points at the log
            print(f"learner: could not write {REFUSAL}: {err}", file=sys.stderr)
        os.close(lock_fd)
        return EXIT_REFUSED
    flags = {"stop": False, "checkpoint": False}
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("stop", True))
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("checkpoint", True))
    parent = os.getppid()

    def should_stop() -> bool:
        if os.getppid() != parent:
            log.warning("the cloud process is gone; stopping")
            return True
        return flags["stop"] or (args.max_updates > 0 and proc.learner.step >= args.max_updates)

    def checkpoint_requested() -> bool:
        asked, flags["checkpoint"] = flags["checkpoint"], False
        return asked

    try:
        proc.run(should_stop, checkpoint_requested)
    finally:
        proc.close()
        os.close(lock_fd)
    return 0


def read_refusal(run_dir: Path) -> str | None:
    """Why the learner of ``run_dir`` refused its last start (exit code 4); None: it did not
    (or its refusal could not be written)."""
    try:
        return (run_dir / REFUSAL).read_text().strip() or None
    except FileNotFoundError:
        return None


def _batch_token() -> str:
    """The batch service's token the cloud put in this process's environment
    (``buffer.service.batch_token.TOKEN_ENV``; not an argument: other users read those).

    Raises:
        Refused: it is missing (restarting cannot bring it).
    """
    try:
        return token_from_env()
    except ValueError as exc:
        raise Refused(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cloud_learner.process", description=__doc__)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument(
        "--batches",
        required=True,
        help="the run's BatchServer address (tcp://...), or its shards' comma-separated",
    )
    p.add_argument(
        "--init-weights",
        type=Path,
        default=None,
        help="a fresh run starts from these weights (cloud_learner.init_weights)",
    )
    p.add_argument(
        "--max-updates",
        type=int,
        default=0,
        help="stop (final checkpoint, exit 0) at this learner step; 0 = when signalled",
    )
    return p


class RunLearner:
    """One run's learner: its plan, its batches, its publisher, and the loop's pacing."""

    def __init__(
        self,
        plan: RunPlan,
        learner: Learner,
        source: TransitionBatchSource,
        remote: RemoteBuffer | ShardedRemoteBuffer,
        resumed: bool,
        classifier: ClassifierTrainer | None = None,
        probe: ProbeTrainer | None = None,
    ):
        self.plan = plan
        # ``reward.source: classifier``: the reward classifier, retrained every
        # ``classifier.every_updates`` updates (``cloud_learner.classifier_training``).
        self.classifier = classifier
        # ``help.risk: probe``: the help probe, retrained every ``help.probe_every_updates``
        # updates (``cloud_learner.help_probe_training``).
        self.probe = probe
        self.params: RunParams = plan.params
        self.learner = learner
        self.source = source  # the learner's batches: the run's buffer service behind ``remote``
        self.remote = remote
        self.resumed = resumed
        # The algorithm's rate limiter, applied here where the sample counts are (the warm
        # start's excluded, restored with each checkpoint): robots are never blocked.
        self.limiter = plan.rate_limiter()
        self._window: list[float] = []
        self._starved = False  # the last update found nothing to sample
        self._disk_full = False  # the last turn could not write (checkpoint, version)
        self._last: dict[str, float] = {"loss": float("nan")}
        # The warm start clones the demonstrations and offline data; without any, no BC.
        cloned = plan.spec.demonstrations.episodes_per_task or plan.spec.buffer.offline_data
        self._bc_updates = self.params.bc_updates if cloned else 0
        buffer = plan.spec.buffer
        # SOP's adaptive mix: the per-task losses the batch service turns into shares.
        self.mix_losses = (
            TaskLossWindow(plan.spec.tasks, buffer.adaptive.window_updates)
            if buffer.mix == "adaptive"
            else None
        )

    @classmethod
    def open(
        cls,
        run_dir: Path,
        batches: str,
        init_weights: Path | None = None,
        *,
        token: str,
    ) -> RunLearner:
        """Build everything from the run directory and resume or start fresh (from
        ``init_weights`` when given: ``cloud_learner.init_weights``); ``token``: the batch
        service's (``buffer.service.batch_token``).

        Raises:
            Refused: a GPU asked for and none here, a policy that cannot be built, a
                checkpoint or starting weights that do not fit (each tensor and spec key
                named).
        """
        plan = RunPlan.from_spec(parse_run_spec(json.loads((run_dir / "spec.json").read_text())))
        spec = plan.spec
        features, action_size = run_features(run_dir)
        try:
            settings = plan.learner_settings(features, action_size)
            device = learner_device(spec.learner.num_gpus)
            algorithm = build_algorithm(settings, device)
        except (RuntimeError, ValueError) as exc:  # no GPU; a policy that cannot be built
            raise Refused(str(exc)) from None
        layout = plan.batch_layout(
            images=list(settings.policy.image_keys),
            chunk=int(getattr(algorithm.policy, "chunk_size", settings.policy.chunk_size)),
        )
        remote = remote_buffer(batches, layout, token)
        source = TransitionBatchSource(remote, device=device, reward_scale=plan.reward_scale)
        # Every version carries its policy card, so robots and the evaluator build the right
        # policy (MLP, RECAP's indicator MLP, SAC's Gaussian) from the weights alone.
        publisher: Any = CardPublisher(
            WeightDirectory(run_dir / "weights", keep=5),
            card_for(settings.algorithm, algorithm.policy),
        )
        trainer = None
        if spec.reward.source == "classifier":  # the classifier travels in every version
            trainer = ClassifierTrainer(spec.reward.classifier, features, run_dir)
            publisher = ClassifierPublisher(publisher, trainer)
        probe = None
        if spec.help.risk == "probe":  # the probe travels in every version too
            probe = ProbeTrainer(spec.help, run_dir)
            publisher = ProbePublisher(publisher, probe)
        learner = Learner(
            run_dir,
            algorithm,
            source,
            publisher,
            settings,
            model_config(settings),
            spec=plan.model_spec(),
        )
        try:
            resumed = learner.start(resume=True)
            if not resumed and init_weights is not None:
                _start_from(learner, plan, settings, init_weights)
        except (CheckpointError, ValueError) as exc:
            remote.close()
            raise Refused(str(exc)) from None
        return cls(plan, learner, source, remote, resumed, trainer, probe)

    def run(self, should_stop: Callable[[], bool], checkpoint_now: Callable[[], bool]) -> None:
        """Warm start (fresh runs), then update until ``should_stop``; a final checkpoint,
        except when the cloud stopped answering (then the last checkpoint stands)."""
        if not self.resumed:
            self.warm_start(should_stop)
        period = 1.0 / self.params.updates_per_s if self.params.updates_per_s > 0 else 0.0
        try:
            while not should_stop():
                t0 = time.monotonic()
                try:
                    if checkpoint_now():
                        self.learner.save_checkpoint()
                    stepped = self._step(t0)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    # A full disk: checkpoints and versions wait for space, the run goes on.
                    if not self._disk_full:
                        log.warning("disk full, training on without writing: %s", exc)
                    self._disk_full = True
                    time.sleep(1.0)
                    continue
                self._disk_full = False
                if not stepped:
                    time.sleep(0.05)
                    continue
                spare = period - (time.monotonic() - t0)
                if spare > 0:
                    time.sleep(spare)
            self.learner.save_checkpoint()
        except TimeoutError as exc:
            log.warning("%s; exiting without a final checkpoint", exc)
        learner = self.learner
        log.info("stopped at learner step %d, policy version %d", learner.step, learner.version)

    def _step(self, t0: float) -> bool:
        """One online update once the buffer holds ``buffer.min_size`` robot transitions
        (``Learner.ready``) and when the samples-per-insert rate allows it; the learner's
        figures go to the batch server with the next request (the run driver shows them).
        False: waiting."""
        p = self.params
        if not self.learner.ready() or (
            self.limiter is not None
            and not self.limiter.allows_sample(
                p.batch_size,
                inserts=self.source.online_transitions(),
                # The warm start's updates are not charged to the robots' rows.
                samples=(self.learner.step - self._bc_updates) * p.batch_size,
            )
        ):
            self._window = [t for t in self._window if t0 - t < 5.0]
            self.remote.stats = {**self.remote.stats, "updates_per_s": len(self._window) / 5.0}
            return False
        if not self.learner.normalized:  # no offline rows, no starting weights: robots' rows
            self._fit_normalization()
        try:
            metrics = self.learner.train_step()
        except RemoteNothingToSample as exc:
            # The sampling window holds no row this algorithm trains on (e.g. retention or
            # the capacity window dropped every labelled row): wait for the robots' next ones.
            if not self._starved:
                log.warning("waiting for rows to train on: %s", exc)
            self._starved = True
            return False
        self._starved = False
        batch = self.learner.last_batch
        if batch is not None and self.mix_losses is not None and self.learner.step % 5 == 0:
            self.mix_losses.add(batch, per_row_bc_loss(self.learner.algorithm.policy, batch))
            metrics = {**metrics, **self.mix_losses.stats()}
        if self.classifier is not None:
            metrics = {**metrics, **self._train_classifier()}
        if self.probe is not None:
            metrics = {**metrics, **self._train_probe()}
        # The algorithm's own losses (e.g. SAC's critic_loss, RECAP's value_loss) go to the
        # run driver with the counters.
        self._last.update({k: float(v) for k, v in metrics.items()})
        self._window = [t for t in (*self._window, t0) if t0 - t < 5.0]
        self.remote.stats = {
            **self._last,
            "learner_step": float(self.learner.step),
            "policy_version": float(self.learner.version),
            "updates_per_s": len(self._window) / 5.0,
        }
        return True

    def _train_classifier(self) -> dict[str, float]:
        """Retrain the reward classifier when due (its figures logged with prefix
        ``classifier``); the latest version's figures (none before the first)."""
        trainer, learner = self.classifier, self.learner
        assert trainer is not None and learner.metrics is not None
        if trainer.due(learner.step):
            figures = trainer.train(self.remote)
            if figures is not None:
                learner.metrics.write(learner.step, figures, prefix="classifier")
        return trainer.figures()

    def _train_probe(self) -> dict[str, float]:
        """Retrain the help probe when due (figures logged with prefix ``help_probe``); the
        latest version's figures (none before the first)."""
        trainer, learner = self.probe, self.learner
        assert trainer is not None and learner.metrics is not None
        if trainer.due(learner.step):
            figures = trainer.train(self.remote, learner.algorithm.policy)
            if figures is not None:
                learner.metrics.write(learner.step, figures, prefix="help_probe")
        return trainer.figures()

    def _fit_normalization(self) -> None:
        """State (and a LeRobot policy's action) normalisation from 4,096 sampled rows; kept
        from then on (``Learner.normalized`` is checkpointed)."""
        rows = self.source.sample_numpy(4096)
        actions = rows.get("action_chunk", rows["action"])
        fit_state_normalization(
            self.learner.algorithm, rows["observation.state"], self.params.min_state_std, actions
        )
        self.learner.normalized = True

    def warm_start(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Wait for the run's demonstrations (the robots' operators record them), then
        normalisation from the demonstrations and offline data (unless starting weights
        brought theirs), ``bc_updates`` behaviour-cloning updates on them (the algorithm's own
        ``bc_update``), publish version 1 and checkpoint."""
        learner, p, source = self.learner, self.params, self.source
        wanted = self.plan.spec.demonstrations
        if wanted.episodes_per_task:
            self._await_demonstrations(wanted.episodes_per_task, wanted.wait_s, should_stop)
        learner.version = max(learner.version, int(learner.publisher.latest_version()))
        if source.num_transitions() == 0:
            # A run with no demonstrations nor offline data (e.g. SAC from scratch): version 1
            # is the untrained (or starting) policy; the normalisation, unless starting weights
            # brought it, is fitted on the robots' first transitions (``_step``).
            log.info("initial policy: no demonstrations, version 1 is the starting policy")
            learner.publish()
            learner.save_checkpoint()
            return
        if not learner.normalized:
            self._fit_normalization()
        metrics: dict[str, float] = {}
        for _ in range(p.bc_updates):
            metrics = learner.algorithm.bc_update(source.sample(p.batch_size))
            learner.step += 1
        log.info(
            "initial policy: %d BC updates on the demonstrations (last %s)", p.bc_updates, metrics
        )
        learner.publish()  # the weak initial policy is version 1 of the run
        learner.save_checkpoint()

    def _await_demonstrations(
        self, per_task: int, wait_s: float, should_stop: Callable[[], bool]
    ) -> None:
        """Until the buffer holds ``per_task`` demonstration episodes of every task (or
        ``wait_s`` passed: the warm start takes what there is)."""
        tasks = list(self.plan.spec.tasks)
        deadline = time.monotonic() + wait_s
        last_log = 0.0
        while not should_stop():
            got = self.remote.demonstrations()
            missing = {t: per_task - got.get(t, 0) for t in tasks if got.get(t, 0) < per_task}
            if not missing:
                log.info("demonstrations recorded: %s", got)
                return
            now = time.monotonic()
            if now > deadline:
                log.warning("demonstrations still missing after %.0fs: %s", wait_s, missing)
                return
            if now - last_log > 10:
                log.info("waiting for demonstrations on the robots: missing %s", missing)
                last_log = now
            time.sleep(0.5)

    def close(self) -> None:
        self.learner.close()
        self.remote.close()


def _start_from(learner: Learner, plan: RunPlan, settings: Any, path: Path) -> None:
    """Load starting weights into the fresh run's policy (its normalisation comes with them).

    Raises:
        InitialWeightsError (a ValueError): unreadable, or not fitting (named).
    """
    initial = read_initial(path)
    policy = learner.algorithm.policy
    assert isinstance(policy, torch.nn.Module)
    mine = card_spec(card_for(settings.algorithm, policy)) if initial.card else plan.model_spec()
    load_into(policy, initial, mine)
    learner.normalized = True
    log.info("starting weights: %s", initial.source)


def learner_device(num_gpus: float) -> torch.device:
    """The learner's torch device: CUDA when the spec reserves a GPU (``learner.num_gpus``),
    else the CPU. The learner runs beside the cloud process, so the GPU must be on that node.

    Raises:
        RuntimeError: a GPU was asked for and torch sees no CUDA device here.
    """
    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"learner.num_gpus is {num_gpus} but torch sees no CUDA device on the cloud's node "
            "(the learner process runs beside the cloud); set learner.num_gpus: 0"
        )
    return torch.device("cuda")


def remote_buffer(batches: str, layout: Any, token: str) -> RemoteBuffer | ShardedRemoteBuffer:
    """The run's batch service at ``batches``: one server's address, or the shards' servers'
    comma-separated (sampled in proportion to their sizes, one batch drawn ahead); every
    request carries ``token``."""
    addresses = [a.strip() for a in batches.split(",") if a.strip()]
    if len(addresses) == 1:
        return RemoteBuffer(addresses[0], layout=layout, token=token)
    return ShardedRemoteBuffer(addresses, layout=layout, prefetch=True, token=token)


def run_features(run_dir: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """(observation features, A): the run's buffer schema's observation features (LeRobot
    feature dicts: dtype, shape) and the size of its ``action``."""
    schema = StepSchema.from_json((run_dir / "buffer" / "schema.json").read_text())
    features = {k: f.to_lerobot() for k, f in schema.observations.items()}
    return features, schema.action.size


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


if __name__ == "__main__":
    sys.exit(main())
