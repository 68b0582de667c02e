"""Edge agent settings (the ``edge:`` section, ``ROBOFLEET_EDGE__*``).

Durations are seconds, sizes bytes. The spool lives under ``spool_dir`` (relative paths are
taken from the working directory of the agent).
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator


class RiskRegion(BaseModel):
    """An axis-aligned box over ``observation.state``; the operator takes over inside it.

    ``dims`` index ``observation.state``; ``low``/``high`` bound them (same length).
    """

    dims: list[int] = Field(min_length=1)
    low: list[float]
    high: list[float]


class EdgeSettings(BaseModel):
    """Control loop, HG-DAgger gating, remote inference, the offline spool, weight apply."""

    # --- spool / uplink
    spool_dir: Path = Field(
        default=Path("./robofleet-edge-spool"), description="Directory of the durable spool."
    )
    spool_max_bytes: int = Field(
        default=1024**3, gt=0, description="Upper bound of the on-disk spool."
    )
    spool_full_policy: Literal["drop_oldest", "drop_newest"] = Field(
        default="drop_oldest",
        description=(
            "When the spool is full: drop the oldest unsent batches (keep the freshest data) or "
            "drop the new batch (keep the oldest). Either way the dropped steps are counted, "
            "their seq ranges logged in dropped.jsonl, and reported in heartbeats."
        ),
    )
    batch_max_steps: int = Field(default=20, ge=1, description="Steps per uploaded batch.")
    batch_max_delay_s: float = Field(
        default=0.5,
        gt=0,
        description=(
            "A partial batch is cut for upload after this long (each step is durable on the "
            "robot as soon as it is recorded, whatever the batch)."
        ),
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="Heartbeat period.")

    # --- HG-DAgger gating (simulated operator)
    gating_threshold: float = Field(
        default=0.3, gt=0, description="Operator takes over when |novice - expert| exceeds this."
    )
    gating_norm: Literal["l2", "linf"] = Field(
        default="l2", description="Norm of novice - expert compared with gating_threshold."
    )
    handback_steps: int = Field(
        default=5, ge=1, description="Agreeing steps before the operator hands control back."
    )
    risk_regions: list[RiskRegion] = Field(
        default_factory=list, description="State boxes in which the operator always acts."
    )

    # --- inference
    inference: Literal["local", "remote"] = Field(
        default="local", description="Run the policy here or call the cloud's Act service."
    )
    remote_deadline_s: float = Field(
        default=0.03, gt=0, description="Longest a control step waits for a remote action chunk."
    )
    hold_keep_dims: list[int] = Field(
        default_factory=list,
        description=(
            "Safe hold = zeros, except these action dims keep their last executed value "
            "(e.g. [3] keeps a Meta-World gripper closed on its object)."
        ),
    )

    # --- weights
    weight_apply_at: Literal["episode_end", "chunk_boundary", "every_n_steps"] = Field(
        default="chunk_boundary",
        description=(
            "Safe boundary at which a new policy version applies: episode start only; any "
            "action-chunk boundary (every step for single-action policies); or a chunk "
            "boundary every weight_apply_every_steps steps. Episode start always is one."
        ),
    )
    weight_apply_every_steps: int = Field(
        default=25, ge=1, description="Step spacing of the every_n_steps boundary."
    )
    wait_for_first_weights: bool = Field(
        default=True,
        description=(
            "With a weight source attached, start no episode before the first policy version "
            "has arrived: the network's random initialisation never drives the robot (and "
            "the operator is not asked to label what it does)."
        ),
    )

    # --- the simulated person (the scripted operator of a robot that hides its success)
    scripted_labelled_episodes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Episodes the simulated person labels success/failure on a simulated robot "
            "that hides its success (edge_agent.simulated_person); None: every one."
        ),
    )
    scripted_ready_after_s: float = Field(
        default=1.0,
        ge=0,
        description="Seconds the simulated person takes to put the scene back after an episode.",
    )

    # --- success measured on the robot
    evaluate_every_episodes: int = Field(
        default=0,
        ge=0,
        description=(
            "Every Nth episode is a policy-only evaluation episode (operator takeovers not "
            "executed; an operator's episode command ends it as a failure); 0: none "
            "(edge_agent.evaluation). A run sets it for its robots."
        ),
    )

    # --- resets by people (robots whose spec has capabilities.can_reset false)
    reset_timeout_s: float | None = Field(
        default=300.0,
        gt=0,
        description=(
            "A robot that cannot reset itself holds after each episode until its operator "
            "signals ready (edge_agent.resets); after this many seconds without ready it is "
            "paused (heartbeat paused, this robot alone) and still waits. None: never paused."
        ),
    )

    # --- cloud control
    cloud_control: bool = Field(
        default=True,
        description=(
            "Subscribe to the cloud's Control stream (e-stop, pause, resume) when connected."
        ),
    )

    # --- site relay (edge_agent.site_relay)
    relay: str | None = Field(
        default=None,
        description=(
            "host:port of the site relay's gRPC: weights come from it, and a run's uploads and "
            "episode marks go through it unless the run is sharded; None: all to the cloud."
        ),
    )
    relay_zmq_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "The relay's ZeroMQ fan-out port (None: comms.relay_zmq_port; 0: weights over the "
            "relay's gRPC only)."
        ),
    )

    @field_validator("relay")
    @classmethod
    def _relay_is_host_port(cls, relay: str | None) -> str | None:
        if relay is not None:
            from edge_agent.site_relay import zmq_address  # here: it imports this module

            zmq_address(relay, 1)  # raises ValueError naming edge.relay
        return relay

    # --- episodes
    control_hz: float | None = Field(
        default=None, gt=0, description="Loop rate; None runs at the driver's control rate."
    )
    episode_commit: Literal["stream", "episode_end"] = Field(
        default="stream",
        description=(
            "stream: steps upload as they happen, and an episode the operator rerecords or "
            "discards is marked in the cloud's buffer, never trained on; episode_end: an "
            "episode's steps are held on the robot until it ends, so such an episode never "
            "leaves the robot."
        ),
    )
    realtime_priority: int | None = Field(
        default=None,
        ge=1,
        le=99,
        description=(
            "Run the control thread under SCHED_FIFO at this priority (Linux, needs "
            "CAP_SYS_NICE), as real-time robot stacks do; None keeps the default scheduler."
        ),
    )
    max_episode_steps: int | None = Field(
        default=None, gt=0, description="Override the driver's episode length."
    )
