"""The learner's settings: what it trains, on what, and how it checkpoints and publishes.

A run's learner gets them from its run spec (``cloud_learner.run_plan.RunPlan``); they are not
a section of robofleet's settings file, so nothing a user sets there can be silently ignored.
"""

from typing import Any, Literal

from pydantic import BaseModel, Field


class PolicySettings(BaseModel):
    """Which policy the learner trains and its sizes (see ``cloud_learner.policies``)."""

    kind: Literal["mlp", "flow", "gaussian", "lerobot", "lerobot_gaussian"] = Field(
        default="mlp",
        description="mlp: regression (CNN+MLP with cameras); flow: flow-matching "
        "action chunks; gaussian: SAC's tanh-Gaussian actor; lerobot: a LeRobot policy "
        "(lerobot_kind) behind cloud_learner.policies.lerobot_adapter; lerobot_gaussian: "
        "LeRobot's HIL-SERL Gaussian actor (cloud_learner.policies.lerobot_gaussian, "
        "lerobot_config: its GaussianActorConfig fields and bounds).",
    )
    state_dim: int = Field(default=39, ge=1, description="D of observation.state.")
    action_dim: int = Field(default=4, ge=1, description="A of action.")
    num_tasks: int = Field(default=1, ge=1)
    chunk_size: int = Field(default=1, ge=1, description="T; 1 = single actions.")
    image_keys: list[str] = Field(default_factory=list)
    image_shape: tuple[int, int] = (64, 64)
    hidden: int = Field(default=256, ge=1)
    depth: int = Field(default=2, ge=0)
    hidden_sizes: list[int] = Field(
        default_factory=list, description="Head widths, one per layer (empty: depth x hidden)."
    )
    lerobot_kind: Literal["act", "diffusion", "smolvla", "pi0"] | None = Field(
        default=None, description="The LeRobot policy of kind lerobot."
    )
    lerobot_config: dict[str, Any] = Field(
        default_factory=dict, description="LeRobot config fields (kinds lerobot, lerobot_gaussian)."
    )
    pretrained_path: str | None = Field(
        default=None,
        description="A local LeRobot pretrained_model directory a lerobot policy is loaded "
        "from (config and weights; required for smolvla and pi0, whose configs need one).",
    )
    task_conditioning: Literal["onehot", "embedding", "text"] = "onehot"
    task_dim: int = 16
    text_embedding_dim: int = 0


class LearnerSettings(BaseModel):
    """Where the learner trains, what it trains and how it checkpoints and publishes."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="'auto' picks CUDA when present, else CPU."
    )
    keep_checkpoints: int = Field(default=3, ge=1, description="Checkpoints kept per run.")
    algorithm: Literal["hg_dagger", "recap", "sac_rlpd", "lerobot_sac"] = "hg_dagger"
    algorithm_config: dict[str, Any] = Field(
        default_factory=dict, description="Hyper-parameters of the algorithm's config dataclass."
    )
    policy: PolicySettings = Field(default_factory=PolicySettings)
    seed: int = 0
    batch_size: int = Field(default=256, ge=1)
    min_transitions: int = Field(
        default=1000,
        ge=0,
        description=(
            "Online updates start once the source holds this many robot transitions"
            " (``online_transitions``: demonstrations and other offline rows do not count);"
            " a run's is its spec's ``buffer.min_size``."
        ),
    )
    publish_every_updates: int = Field(default=100, ge=1)
    publish_every_seconds: float = Field(default=30.0, gt=0)
    checkpoint_every_updates: int = Field(default=500, ge=1)
    log_every_updates: int = Field(default=10, ge=1)
    max_updates: int = Field(default=0, ge=0, description="Stop after this many; 0 = never.")
    tasks: list[str] = Field(
        default_factory=list, description="Task names in task_index order (buffer's 'task')."
    )
    sampler: Literal["uniform", "intervention", "mix"] = Field(
        default="uniform", description="Buffer sampler: mix = per-task online/offline (RLPD)."
    )
    online_fraction: float = Field(default=0.5, ge=0, le=1, description="For sampler=mix.")
    samples_per_insert: float | None = Field(
        default=None, gt=0, description="Rate limiter: bound on the update-to-data ratio."
    )
    torch_threads: int = Field(default=2, ge=1, description="CPU threads for torch.")
