"""``robofleet bench lerobot``: LeRobot's HIL-SERL actor transport, through ``robofleet
lerobot-gateway`` and through LeRobot's own ``LearnerService``, side by side in one run.

Both sides are driven by LeRobot's own actor code (``lerobot.rl.actor``'s
``push_transitions_to_transport_queue``, ``send_transitions`` and ``receive_policy`` on
threads, its stub and channel options), on loopback, in this process:

* **transitions/s**: one actor streams episodes of transitions (state-only, as
  :func:`_config` describes). Ours: the gateway (assigned to a run, first version handed) loads
  and checks each message, makes it durable in the robot's spool, and the uploader sends it to
  a cloud whose sink is a :class:`buffer.ReplayBuffer`; the clock stops when the cloud has
  acknowledged every step (fsynced in the spool and in the cloud's buffer). LeRobot: its
  ``LearnerService`` puts the bytes in a RAM queue and a consumer decodes them with
  ``bytes_to_transitions`` as its learner loop does; the clock stops when every transition is
  decoded (nothing is written to disk).
* **parameter push**: a ``lerobot-sac`` version to 1 and N actors. Ours: publish on the
  cloud's distributor; each gateway receives, converts (``parameter_bytes``) and streams it;
  the clock stops when every actor's ``receive_policy`` queue holds the message. LeRobot: one
  learner serves one actor (its parameters go to whichever stream drains its single queue), so
  N actors need N ``LearnerService`` instances; the version is serialized once as its learner
  does (``state_to_bytes`` of the state dicts) and put in each queue; the same bytes the
  gateways hand out.

Each figure is the median of ``--rounds`` rounds. Prints a table, then one JSON object as the
last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from foundation.clitext import plain_text

if TYPE_CHECKING:
    import torch

    from comms.bench.common import BenchCloud
    from edge_agent.lerobot_gateway.gateway import LeRobotGateway
    from edge_agent.lerobot_gateway.run import RunLink


def _config(state_dim: int, action_dim: int, fps: float = 10.0) -> dict[str, Any]:
    """The part of a LeRobot training config the gateway reads (features and fps)."""
    return {
        "env": {"fps": fps},
        "policy": {
            "input_features": {"observation.state": {"type": "STATE", "shape": [state_dim]}},
            "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
        },
    }


def _episode(steps: int, state_dim: int, action_dim: int, seed: int) -> list[dict[str, Any]]:
    """One episode of transitions as LeRobot's actor builds them (batch dimension 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    states = torch.rand(steps + 1, 1, state_dim, generator=g)
    out = []
    for i in range(steps):
        out.append(
            {
                "state": {"observation.state": states[i]},
                "action": torch.rand(1, action_dim, generator=g) * 2 - 1,
                "reward": float(i == steps - 1),
                "next_state": {"observation.state": states[i + 1]},
                "done": i == steps - 1,
                "truncated": False,
                "complementary_info": {
                    "discrete_penalty": torch.tensor([0.0]),
                    "is_intervention": i % 5 == 0,
                },
            }
        )
    return out


def _sac_version(state_dim: int, action_dim: int, hidden: int) -> dict[str, torch.Tensor]:
    """A ``lerobot-sac`` run's version as its publisher stores it (policy card included)."""
    import torch

    from cloud_learner.factory import build_algorithm
    from cloud_learner.policy_card import CardPublisher, card_for
    from cloud_learner.publisher import InMemoryWeightPublisher
    from cloud_learner.run_plan import RunPlan, parse_spec

    spec = {
        "algorithm": "lerobot-sac",
        "tasks": ["pick_cube"],
        "robots": {"robot_type": "lerobot-actor"},
        "policy": {
            "hidden_sizes": [hidden, hidden],
            "config": {
                "state_min": [-10.0] * state_dim,
                "state_max": [10.0] * state_dim,
                "action_min": [-1.0] * action_dim,
                "action_max": [1.0] * action_dim,
            },
        },
    }
    features = {"observation.state": {"dtype": "float32", "shape": (state_dim,)}}
    settings = RunPlan.from_spec(parse_spec(spec)).learner_settings(features, action_dim)
    algorithm = build_algorithm(settings, torch.device("cpu"))
    inner = InMemoryWeightPublisher()
    CardPublisher(inner, card_for(settings.algorithm, algorithm.policy)).publish(
        1, algorithm.get_weights()
    )
    version: dict[str, torch.Tensor] = inner.versions[1]
    return version


def _shifted(version: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    """The version with its ``policy.`` float tensors moved by ``by`` (another version)."""
    return {
        k: v + by if k.startswith("policy.") and v.is_floating_point() else v
        for k, v in version.items()
    }


class _Actor:
    """LeRobot's actor transport (its stub, channel options and stream functions on threads,
    as its actor runs them with ``concurrency.actor = "threads"``) toward one port."""

    def __init__(self, port: int) -> None:
        import grpc
        from lerobot.rl import actor
        from lerobot.transport import services_pb2_grpc
        from lerobot.transport.utils import grpc_channel_options

        links = SimpleNamespace(learner_host="127.0.0.1", learner_port=port, queue_get_timeout=0.01)
        policy = SimpleNamespace(
            concurrency=SimpleNamespace(actor="threads"), actor_learner_config=links
        )
        self.cfg = SimpleNamespace(policy=policy, output_dir="/nonexistent")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", grpc_channel_options())
        self.stub = services_pb2_grpc.LearnerServiceStub(self.channel)
        self.shutdown = threading.Event()
        self.parameters: queue.Queue[bytes] = queue.Queue()
        self.transitions: queue.Queue[bytes] = queue.Queue()
        self._actor = actor
        self._threads: list[threading.Thread] = []

    def ready(self) -> None:
        if not self._actor.establish_learner_connection(self.stub, self.shutdown, 60):
            raise RuntimeError("the actor's Ready() was never answered")

    def start(self, *, transitions: bool, parameters: bool) -> None:
        targets: list[tuple[Callable[..., None], queue.Queue[bytes]]] = []
        if transitions:
            targets.append((self._actor.send_transitions, self.transitions))
        if parameters:
            targets.append((self._actor.receive_policy, self.parameters))
        for target, q in targets:
            t = threading.Thread(
                target=target, args=(self.cfg, q, self.shutdown, self.stub, self.channel)
            )
            t.daemon = True
            t.start()
            self._threads.append(t)

    def push(self, episode: list[dict[str, Any]]) -> None:
        """LeRobot's ``push_transitions_to_transport_queue`` (one message an episode)."""
        self._actor.push_transitions_to_transport_queue(episode, self.transitions)

    def close(self) -> None:
        self.shutdown.set()
        self.channel.close()
        for t in self._threads:
            t.join(10)


# -- robofleet: gateways beside the actors, a cloud with a durable buffer ----------------------


class _Lab:
    """A cloud (comms server, replay-buffer sink) and ``n`` gateways assigned to its run."""

    def __init__(self, n: int, cfg: dict[str, Any], tmp: Path) -> None:
        from buffer import BufferSettings, ReplayBuffer
        from comms.bench.common import RUN, start_cloud
        from comms.cloud.replay_buffer_sink import ReplayBufferSink
        from edge_agent.assignment import Assignment
        from edge_agent.config import EdgeSettings
        from edge_agent.lerobot_gateway.features import actor_config
        from edge_agent.lerobot_gateway.gateway import GatewayOptions, LeRobotGateway

        actor = actor_config(cfg)
        settings = BufferSettings(memory_budget_bytes=128 * 1024**2)
        self.buffer = ReplayBuffer.open(tmp / "buffer", actor.schema(), settings)
        self.cloud: BenchCloud = start_cloud(ReplayBufferSink(self.buffer))
        self.gateways: list[LeRobotGateway] = []
        self._runners: list[threading.Thread] = []
        edge = EdgeSettings(heartbeat_interval_s=0.5, batch_max_delay_s=0.05)
        for i in range(n):
            opts = GatewayOptions(
                robot_name=f"bench-arm-{i}",
                server=self.cloud.server.address,
                root=tmp / f"arm-{i}",
                actor=actor,
                token=self.cloud.store.create_enrollment_token(timedelta(minutes=10)),
                listen="127.0.0.1:0",
                drain_s=5.0,
                poll_s=0.05,
            )
            gw = LeRobotGateway(edge, self.cloud.settings, opts)
            gw.start()
            runner = threading.Thread(target=gw.run, daemon=True)
            runner.start()
            self.gateways.append(gw)
            self._runners.append(runner)
        ids = [gw.robot_id for gw in self.gateways]
        self.cloud.store.lease_robots(RUN, ids)
        text = Assignment(run_id=RUN, tasks=["pick_cube"], max_episode_steps=1000).to_json()
        for rid in ids:
            _wait(
                lambda r=rid: self.cloud.server.push_control(  # type: ignore[misc]
                    r, "assign", run_id=RUN, assignment=text
                ),
                "a gateway's Control stream",
            )
        _wait(lambda: all(gw.state.run is not None for gw in self.gateways), "the assignments")
        self.distributor = self.cloud.server.distributor(RUN)

    def close(self) -> None:
        for gw in self.gateways:
            gw.stop()
        for t in self._runners:
            t.join(30)
        self.cloud.close()
        self.buffer.close()


def _wait(cond: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise RuntimeError(f"bench lerobot: timed out waiting for {what}")
        time.sleep(0.005)


def _ours_transitions(
    episodes: list[list[list[dict[str, Any]]]], cfg: dict[str, Any], version: Any
) -> list[float]:
    """Seconds per round from the first message queued until the cloud acknowledged every
    step of the round (``episodes[round][episode]``)."""
    with tempfile.TemporaryDirectory(prefix="robofleet-bench-lerobot-") as tmp:
        lab = _Lab(1, cfg, Path(tmp))
        gw = lab.gateways[0]
        actor = _Actor(gw.port)
        try:
            lab.distributor.publish(version, version=1)
            actor.ready()
            actor.start(transitions=True, parameters=False)
            link = cast("RunLink", gw.state.run)
            out = []
            for rnd in episodes:
                n = sum(len(e) for e in rnd)
                want = gw.state.counters.transitions_stored + n
                t0 = time.perf_counter()
                for e in rnd:
                    actor.push(e)
                _wait(lambda w=want: gw.state.counters.transitions_stored >= w, "stored steps")  # type: ignore[misc]
                if not link.uplink.wait_acked(120):
                    raise RuntimeError("bench lerobot: the cloud did not acknowledge the steps")
                out.append(time.perf_counter() - t0)
            assert gw.state.counters.transitions_refused == 0, gw.state.refusals
        finally:
            actor.close()
            lab.close()
    return out


def _ours_push(version: Any, n_actors: int, cfg: dict[str, Any], rounds: int) -> list[float]:
    """Seconds per round from publishing a version until all ``n_actors`` actors hold it."""
    with tempfile.TemporaryDirectory(prefix="robofleet-bench-lerobot-") as tmp:
        lab = _Lab(n_actors, cfg, Path(tmp))
        actors = [_Actor(gw.port) for gw in lab.gateways]
        try:
            lab.distributor.publish(version, version=1)  # opens the streams (not timed)
            for a in actors:
                a.ready()
                a.start(transitions=False, parameters=True)
            for a in actors:
                a.parameters.get(timeout=120)
            out = []
            for r in range(rounds):
                nxt = _shifted(version, 0.01 * (r + 1))
                t0 = time.perf_counter()
                lab.distributor.publish(nxt, version=r + 2)
                for a in actors:
                    a.parameters.get(timeout=120)
                out.append(time.perf_counter() - t0)
        finally:
            for a in actors:
                a.close()
            lab.close()
    return out


# -- LeRobot: its LearnerService, RAM queues -------------------------------------------------


class _LeRobotLearner:
    """LeRobot's ``LearnerService`` on a gRPC server of its own options (one per actor)."""

    def __init__(self) -> None:
        import grpc
        from lerobot.rl.learner_service import LearnerService
        from lerobot.transport import services_pb2_grpc
        from lerobot.transport.utils import grpc_channel_options

        self.shutdown = threading.Event()
        self.parameters: queue.Queue[bytes] = queue.Queue()
        self.transitions: queue.Queue[bytes] = queue.Queue()
        service = LearnerService(
            self.shutdown, self.parameters, 0.0, self.transitions, queue.Queue(), 0.01
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), options=grpc_channel_options()
        )
        services_pb2_grpc.add_LearnerServiceServicer_to_server(service, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.shutdown.set()
        self.server.stop(grace=1.0).wait(5)


def _lerobot_transitions(episodes: list[list[list[dict[str, Any]]]]) -> list[float]:
    """Seconds per round from the first message queued until LeRobot's learner side decoded
    every transition of the round (``bytes_to_transitions``, RAM only)."""
    from lerobot.transport.utils import bytes_to_transitions

    learner = _LeRobotLearner()
    actor = _Actor(learner.port)
    try:
        actor.ready()
        actor.start(transitions=True, parameters=False)
        out = []
        for rnd in episodes:
            n = sum(len(e) for e in rnd)
            t0 = time.perf_counter()
            for e in rnd:
                actor.push(e)
            got = 0
            while got < n:
                got += len(bytes_to_transitions(learner.transitions.get(timeout=120)))
            out.append(time.perf_counter() - t0)
    finally:
        actor.close()
        learner.close()
    return out


def _lerobot_push(version: Any, n_actors: int, rounds: int) -> list[float]:
    """Seconds per round from serializing a version (as LeRobot's learner does) until all
    ``n_actors`` actors hold it; one ``LearnerService`` per actor."""
    from lerobot.transport.utils import state_to_bytes

    from cloud_learner.lerobot_parameters import lerobot_state_dicts

    learners = [_LeRobotLearner() for _ in range(n_actors)]
    actors = [_Actor(lr.port) for lr in learners]
    try:
        for a in actors:
            a.ready()
            a.start(transitions=False, parameters=True)
        first = state_to_bytes(lerobot_state_dicts(version))
        for lr in learners:  # opens the streams (not timed)
            lr.parameters.put(first)
        for a in actors:
            a.parameters.get(timeout=120)
        out = []
        for r in range(rounds):
            nxt = _shifted(version, 0.01 * (r + 1))
            t0 = time.perf_counter()
            data = state_to_bytes(lerobot_state_dicts(nxt))
            for lr in learners:
                lr.parameters.put(data)
            for a in actors:
                a.parameters.get(timeout=120)
            out.append(time.perf_counter() - t0)
    finally:
        for a in actors:
            a.close()
        for lr in learners:
            lr.close()
    return out


# -- main ---------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet bench lerobot", description=plain_text(__doc__))
    p.add_argument("--episodes", type=int, default=20, help="episodes a round (one message each)")
    p.add_argument("--episode-steps", type=int, default=100, help="transitions an episode")
    p.add_argument("--state-dim", type=int, default=18, help="observation.state size")
    p.add_argument("--action-dim", type=int, default=4, help="action size")
    p.add_argument("--hidden", type=int, default=256, help="the policy's hidden layer width")
    p.add_argument("--actors", type=int, default=4, help="actors of the wide parameter push")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each measurement (median)")
    p.add_argument(
        "--learning-minutes",
        type=float,
        default=5.0,
        help="each side's wall-clock budget of the learning comparison (0: skip it)",
    )
    p.add_argument(
        "--episode-s", type=float, default=3.0, help="the actor's episode limit (seconds)"
    )
    p.add_argument(
        "--learning-starts", type=int, default=100, help="online transitions before learning"
    )
    p.add_argument(
        "--demo-episodes",
        type=int,
        default=20,
        help="scripted demonstrations both learners mount (LeRobot's learner needs a dataset)",
    )
    p.add_argument(
        "--bucket-s", type=float, default=60.0, help="the success curve's bucket (seconds)"
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the learning comparison's logs and configs here (default: a temporary dir)",
    )
    return p


def _learning(args: argparse.Namespace) -> dict[str, Any]:
    from robofleet.bench.lerobot_learning import Setup, learning

    logging.disable(logging.NOTSET)
    setup = Setup(
        minutes=args.learning_minutes,
        episode_s=args.episode_s,
        learning_starts=args.learning_starts,
        demo_episodes=args.demo_episodes,
        bucket_s=args.bucket_s,
    )
    if args.work is not None:
        return learning(setup, args.work)
    with tempfile.TemporaryDirectory(prefix="robofleet-bench-lerobot-learning-") as tmp:
        return learning(setup, Path(tmp))


def main(argv: Sequence[str]) -> int:
    import torch

    args = _parser().parse_args(list(argv))
    for name in ("episodes", "episode_steps", "state_dim", "action_dim", "hidden", "actors"):
        if getattr(args, name) < 1:
            print(f"bench lerobot: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.rounds < 1:
        print("bench lerobot: --rounds must be >= 1", file=sys.stderr)
        return 2
    bad = [
        name
        for name, ok in (
            ("--learning-minutes", args.learning_minutes >= 0),
            ("--episode-s", args.episode_s > 0),
            ("--learning-starts", args.learning_starts >= 1),
            ("--demo-episodes", args.demo_episodes >= 1),
            ("--bucket-s", args.bucket_s > 0),
        )
        if not ok
    ]
    if bad:
        print(f"bench lerobot: out of range: {', '.join(bad)}", file=sys.stderr)
        return 2
    # LeRobot's actor threads log an ERROR when their channel closes at the end of a measure.
    logging.disable(logging.ERROR)
    torch.set_num_threads(1)
    cfg = _config(args.state_dim, args.action_dim)
    version = _sac_version(args.state_dim, args.action_dim, args.hidden)
    episodes = [
        [
            _episode(args.episode_steps, args.state_dim, args.action_dim, 1000 * r + e)
            for e in range(args.episodes)
        ]
        for r in range(args.rounds)
    ]
    n = args.episodes * args.episode_steps
    ours_t = statistics.median(_ours_transitions(episodes, cfg, version))
    lerobot_t = statistics.median(_lerobot_transitions(episodes))
    widths = sorted({1, args.actors})
    ours_p = {k: statistics.median(_ours_push(version, k, cfg, args.rounds)) for k in widths}
    lerobot_p = {k: statistics.median(_lerobot_push(version, k, args.rounds)) for k in widths}

    from cloud_learner.lerobot_parameters import parameter_bytes

    size = len(parameter_bytes(version))
    print(
        f"LeRobot actor transport: {n} transitions a round ({args.episodes} episodes x "
        f"{args.episode_steps}), state {args.state_dim}, action {args.action_dim}; "
        f"parameters {size / 1e6:.2f} MB; median of {args.rounds} rounds"
    )
    print(f"{'measure':<44}{'robofleet gateway':>20}{'LeRobot learner':>18}{'ratio':>8}")
    rows = [
        (
            "transitions/s (ours: cloud-acked, fsynced)",
            n / ours_t,
            n / lerobot_t,
            "{:>20.0f}{:>18.0f}",
        ),
        *[
            (
                f"parameter push to {k} actor(s), ms",
                ours_p[k] * 1e3,
                lerobot_p[k] * 1e3,
                "{:>20.1f}{:>18.1f}",
            )
            for k in widths
        ],
    ]
    for label, ours, theirs, fmt in rows:
        print(f"{label:<44}" + fmt.format(ours, theirs) + f"{ours / theirs:>8.2f}")
    print(
        "ours: durable in the robot's spool and acknowledged by the cloud's replay buffer "
        "(fsynced), authenticated, one gateway per actor; LeRobot: RAM queue, one learner "
        "service per actor"
    )
    result: dict[str, Any] = {
        "transitions": n,
        "parameter_bytes": size,
        "rounds": args.rounds,
        "ours_transitions_per_s": n / ours_t,
        "lerobot_transitions_per_s": n / lerobot_t,
        "transitions_ratio": lerobot_t / ours_t,
    }
    for k in widths:
        result[f"ours_push_{k}_s"] = ours_p[k]
        result[f"lerobot_push_{k}_s"] = lerobot_p[k]
        result[f"push_{k}_ratio"] = ours_p[k] / lerobot_p[k]
    if args.learning_minutes > 0:
        result["learning"] = _learning(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
