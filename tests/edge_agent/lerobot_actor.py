"""LeRobot's own actor-side client code against a gateway: its stub, its send/receive
helpers from ``lerobot.rl.actor`` and its transport utils, run on threads as the actor runs
them (``concurrency.actor = "threads"``); plus the pieces of LeRobot's policy the tests load
parameters into."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace
from typing import Any

import grpc
import torch
from lerobot.rl import actor
from lerobot.transport import services_pb2_grpc
from lerobot.transport.utils import grpc_channel_options


def actor_cfg(port: int) -> Any:
    """The fields of LeRobot's ``TrainRLServerPipelineConfig`` its transport helpers read."""
    links = SimpleNamespace(learner_host="127.0.0.1", learner_port=port, queue_get_timeout=0.05)
    policy = SimpleNamespace(
        concurrency=SimpleNamespace(actor="threads"), actor_learner_config=links
    )
    return SimpleNamespace(policy=policy, output_dir="/nonexistent")


class Actor:
    """One LeRobot actor's transport: a channel and stub of LeRobot's, and its three streams
    (``receive_policy``, ``send_transitions``, ``send_interactions``) on threads."""

    def __init__(self, port: int) -> None:
        self.cfg = actor_cfg(port)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", grpc_channel_options())
        self.stub = services_pb2_grpc.LearnerServiceStub(self.channel)
        self.shutdown = threading.Event()
        self.parameters: queue.Queue[bytes] = queue.Queue()
        self.transitions: queue.Queue[bytes] = queue.Queue()
        self.interactions: queue.Queue[bytes] = queue.Queue()
        self.threads: list[threading.Thread] = []

    def ready(self, attempts: int = 1) -> bool:
        """LeRobot's ``establish_learner_connection`` (blocks in ``Ready``)."""
        return bool(actor.establish_learner_connection(self.stub, self.shutdown, attempts))

    def start_streams(self) -> None:
        for target, q in (
            (actor.receive_policy, self.parameters),
            (actor.send_transitions, self.transitions),
            (actor.send_interactions, self.interactions),
        ):
            t = threading.Thread(
                target=target,
                args=(self.cfg, q, self.shutdown, self.stub, self.channel),
                daemon=True,
            )
            t.start()
            self.threads.append(t)

    def send_transitions(self, transitions: list[dict[str, Any]]) -> None:
        """LeRobot's ``push_transitions_to_transport_queue`` (its NaN warning included)."""
        actor.push_transitions_to_transport_queue(transitions, self.transitions)

    def close(self) -> None:
        """Stop as LeRobot's actor stops: the send streams end at the shutdown event; the
        parameter stream (which only checks it when a message arrives) ends with the channel."""
        self.shutdown.set()
        for t in self.threads[1:]:
            t.join(10)
        self.channel.close()
        for t in self.threads[:1]:
            t.join(10)


def sac_version(state_dim: int = 4, action_dim: int = 2) -> dict[str, torch.Tensor]:
    """A ``lerobot-sac`` run's version as its publisher stores it (policy card included):
    LeRobot's Gaussian actor and SAC built by the cloud learner, small."""
    from cloud_learner.factory import build_algorithm
    from cloud_learner.policy_card import CardPublisher, card_for
    from cloud_learner.publisher import InMemoryWeightPublisher
    from cloud_learner.run_plan import RunPlan, parse_spec

    spec = {
        "algorithm": "lerobot-sac",
        "tasks": ["pick_cube"],
        "robots": {"robot_type": "lerobot-actor"},
        "policy": {
            "hidden_sizes": [16],
            "config": {
                "latent_dim": 8,
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
    publisher = CardPublisher(
        InMemoryWeightPublisher(), card_for(settings.algorithm, algorithm.policy)
    )
    publisher.publish(1, algorithm.get_weights())
    versions: dict[int, dict[str, torch.Tensor]] = publisher.inner.versions
    return versions[1]


def shifted(version: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    """The version with every ``policy.`` float tensor moved by ``by`` (card unchanged)."""
    return {
        k: v + by if k.startswith("policy.") and v.is_floating_point() else v
        for k, v in version.items()
    }


def lerobot_sac(version: dict[str, torch.Tensor]) -> Any:
    """LeRobot's actor-side SAC algorithm, built as ``lerobot.rl.actor`` builds it from the
    actor config its user wrote (here: the one the version was trained with)."""
    from lerobot.policies.gaussian_actor.modeling_gaussian_actor import GaussianActorPolicy
    from lerobot.rl.algorithms.factory import make_algorithm
    from lerobot.rl.algorithms.sac.configuration_sac import SACAlgorithmConfig

    from cloud_learner.lerobot_parameters import actor_config

    cfg = actor_config(version)
    policy = GaussianActorPolicy(cfg).eval()
    return make_algorithm(cfg=SACAlgorithmConfig(policy_config=cfg), policy=policy)


def loads_into_lerobot(data: bytes, version: dict[str, torch.Tensor]) -> None:
    """LeRobot's ``update_policy_parameters`` loads ``data``; its actor then equals the
    version's ``policy.`` tensors (AssertionError naming the first that differs)."""
    q: queue.Queue[bytes] = queue.Queue()
    q.put(data)
    algorithm = lerobot_sac(version)
    actor.update_policy_parameters(algorithm=algorithm, parameters_queue=q, device="cpu")
    for key, value in algorithm.policy.actor.state_dict().items():
        assert torch.equal(value, version[f"policy.{key}"]), key


def transition(
    state: torch.Tensor,
    action: torch.Tensor,
    *,
    done: bool = False,
    truncated: bool = False,
    intervention: bool = False,
    reward: float = 0.0,
) -> dict[str, Any]:
    """One transition as LeRobot's actor builds it (batch dimension 1)."""
    return {
        "state": {"observation.state": state.reshape(1, -1)},
        "action": action.reshape(1, -1),
        "reward": reward,
        "next_state": {"observation.state": (state + 1).reshape(1, -1)},
        "done": done,
        "truncated": truncated,
        "complementary_info": {
            "discrete_penalty": torch.tensor([0.0]),
            "is_intervention": intervention,
        },
    }
