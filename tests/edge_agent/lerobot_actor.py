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


def gaussian_actor(state_dim: int = 4, action_dim: int = 2) -> Any:
    """LeRobot's HIL-SERL policy (``gaussian_actor``), small."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.gaussian_actor.configuration_gaussian_actor import (
        ActorNetworkConfig,
        GaussianActorConfig,
    )
    from lerobot.policies.gaussian_actor.modeling_gaussian_actor import GaussianActorPolicy

    config = GaussianActorConfig(
        input_features={"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
        state_encoder_hidden_dim=16,
        latent_dim=16,
        actor_network_kwargs=ActorNetworkConfig(hidden_dims=[16]),
        dataset_stats=None,
    )
    return GaussianActorPolicy(config)


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
