"""Shared machinery of robofleet's own policies: observation encoding, task conditioning,
the RECAP improvement indicator, weights as flat tensor dicts and single-step ``act``.

A subclass supplies the action head: ``bc_loss(batch, indicator) -> (B,)`` and
``predict(batch, indicator) -> (B, A)`` or ``(B, T, A)``. Everything else lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from cloud_learner.core import Batch, Weights

# RECAP's improvement indicator I: 0 = "not an improvement", 1 = "improvement",
# NULL = dropped (the unconditional branch of classifier-free guidance).
INDICATOR_NEGATIVE = 0
INDICATOR_POSITIVE = 1
INDICATOR_NULL = 2

TaskConditioning = Literal["onehot", "embedding", "text"]


@dataclass
class PolicySpec:
    """Shapes and sizes of a policy; JSON-able, stored in checkpoints.

    Attributes:
        state_dim: D of ``observation.state``.
        action_dim: A of ``action``.
        num_tasks: tasks of the multi-task run (``task_index`` in ``[0, num_tasks)``).
        chunk_size: T; 1 means the policy outputs a single action ``(A,)``.
        image_keys: camera keys (``observation.images.<cam>``) fed to the CNN encoder.
        image_shape: (H, W) of every camera frame.
        hidden: width of hidden layers (when ``hidden_sizes`` is empty).
        depth: number of hidden layers of the head (when ``hidden_sizes`` is empty).
        hidden_sizes: widths of the head's hidden layers, one per layer (any number, any
            sizes); empty: ``depth`` layers of ``hidden``.
        task_conditioning: ``onehot`` (fixed), ``embedding`` (learned, ``task_dim`` wide), or
            ``text`` (a fixed table of text embeddings, projected to ``task_dim``).
        task_dim: width of the learned task / text projection.
        text_embedding_dim: width of the text table when ``task_conditioning == "text"``.
        indicator: condition on RECAP's improvement indicator (adds a 3-entry embedding).
    """

    state_dim: int
    action_dim: int
    num_tasks: int = 1
    chunk_size: int = 1
    image_keys: list[str] = field(default_factory=list)
    image_shape: tuple[int, int] = (64, 64)
    hidden: int = 256
    depth: int = 2
    task_conditioning: TaskConditioning = "onehot"
    task_dim: int = 16
    text_embedding_dim: int = 0
    indicator: bool = False
    hidden_sizes: list[int] = field(default_factory=list)

    @property
    def widths(self) -> list[int]:
        """The head's hidden layer widths."""
        return list(self.hidden_sizes) if self.hidden_sizes else [self.hidden] * self.depth

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_shape"] = list(self.image_shape)
        return d


def mlp(sizes: Sequence[int], activate_last: bool = False) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or activate_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class ConvEncoder(nn.Module):
    """Small CNN: (B, H, W, 3) uint8 -> (B, out_dim) float32; one encoder shared by cameras."""

    def __init__(self, image_shape: tuple[int, int], out_dim: int = 64) -> None:
        super().__init__()
        if min(image_shape) < 8:
            raise ValueError(f"camera frames must be at least 8x8, got {image_shape}")
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 16, out_dim),
            nn.ReLU(),
        )
        self.out_dim = out_dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"images must be (B, H, W, 3) uint8, got {tuple(images.shape)} {images.dtype}"
            )
        x = images.permute(0, 3, 1, 2).float() / 255.0
        out: torch.Tensor = self.net(x)
        return out


class TorchPolicy(nn.Module):
    """Base of robofleet's policies (MLP, CNN+MLP, flow-matching chunk head).

    ``encode`` turns a batch into one feature vector per row: state, camera features, the task
    (one-hot, learned embedding, or projected text embedding) and, for RECAP, the indicator.
    ``act`` runs one observation and conditions on ``inference_indicator`` with
    ``guidance_weight`` (classifier-free guidance; w = 1 means plain conditioning).
    """

    def __init__(self, spec: PolicySpec, text_embeddings: torch.Tensor | None = None) -> None:
        super().__init__()
        self.spec = spec
        # Observation normalisation (LeRobot's MEAN_STD): buffers, so they ship with the weights.
        self.register_buffer("state_mean", torch.zeros(spec.state_dim))
        self.register_buffer("state_std", torch.ones(spec.state_dim))
        feat = spec.state_dim
        self.image_encoder: ConvEncoder | None = None
        if spec.image_keys:
            self.image_encoder = ConvEncoder(tuple(spec.image_shape))  # type: ignore[arg-type]
            feat += self.image_encoder.out_dim * len(spec.image_keys)
        self.task_embedding: nn.Module | None = None
        if spec.num_tasks > 1 or spec.task_conditioning == "text":
            if spec.task_conditioning == "onehot":
                feat += spec.num_tasks
            elif spec.task_conditioning == "embedding":
                self.task_embedding = nn.Embedding(spec.num_tasks, spec.task_dim)
                feat += spec.task_dim
            else:
                if text_embeddings is None:
                    text_embeddings = torch.zeros(spec.num_tasks, spec.text_embedding_dim)
                if tuple(text_embeddings.shape) != (spec.num_tasks, spec.text_embedding_dim):
                    raise ValueError(
                        "text_embeddings must be (num_tasks, text_embedding_dim) = "
                        f"({spec.num_tasks}, {spec.text_embedding_dim}), "
                        f"got {tuple(text_embeddings.shape)}"
                    )
                # A buffer, so it travels with the weights to every robot.
                self.register_buffer("task_text", text_embeddings.float().clone())
                self.task_embedding = nn.Linear(spec.text_embedding_dim, spec.task_dim)
                feat += spec.task_dim
        self.indicator_embedding: nn.Embedding | None = None
        if spec.indicator:
            self.indicator_embedding = nn.Embedding(3, 8)
            feat += 8
        self.feature_dim = feat
        self.inference_indicator: int | None = INDICATOR_POSITIVE if spec.indicator else None
        self.guidance_weight = 1.0

    # -- features -------------------------------------------------------------------------

    def encode(
        self, batch: Mapping[str, torch.Tensor], indicator: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, feature_dim) float32 features of a batch; ``indicator`` is (B,) int64 or None."""
        state = batch["observation.state"]
        if state.ndim != 2 or state.shape[1] != self.spec.state_dim:
            raise ValueError(
                f"observation.state must be (B, {self.spec.state_dim}), got {tuple(state.shape)}"
            )
        mean: torch.Tensor = self.state_mean  # type: ignore[assignment]
        std: torch.Tensor = self.state_std  # type: ignore[assignment]
        parts = [(state.float() - mean) / std]
        if self.image_encoder is not None:
            for key in self.spec.image_keys:
                if key not in batch:
                    raise KeyError(f"policy needs camera {key!r}; batch has {sorted(batch)}")
                parts.append(self.image_encoder(batch[key]))
        if self.spec.num_tasks > 1 or self.spec.task_conditioning == "text":
            task = batch["task_index"].long()
            if int(task.min()) < 0 or int(task.max()) >= self.spec.num_tasks:
                raise ValueError(
                    f"task_index out of range [0, {self.spec.num_tasks}): "
                    f"{sorted(set(task.tolist()))}"
                )
            if self.spec.task_conditioning == "onehot":
                parts.append(nn.functional.one_hot(task, self.spec.num_tasks).float())
            elif self.spec.task_conditioning == "embedding":
                assert self.task_embedding is not None
                parts.append(self.task_embedding(task))
            else:
                assert self.task_embedding is not None
                text: torch.Tensor = self.task_text  # type: ignore[assignment]
                parts.append(self.task_embedding(text[task]))
        if self.indicator_embedding is not None:
            if indicator is None:
                indicator = torch.full(
                    (state.shape[0],), INDICATOR_NULL, dtype=torch.long, device=state.device
                )
            parts.append(self.indicator_embedding(indicator.long()))
        return torch.cat(parts, dim=-1)

    def set_state_normalization(
        self, states: torch.Tensor | np.ndarray, min_std: float = 1e-2
    ) -> None:
        """Standardise ``observation.state`` with the mean and std of ``states`` (N, D);
        stds below ``min_std`` (constant or barely-seen features) are raised to it."""
        x = torch.as_tensor(np.asarray(states), dtype=torch.float32)
        with torch.no_grad():
            self.state_mean.copy_(x.mean(0))  # type: ignore[operator]
            self.state_std.copy_(x.std(0, unbiased=False).clamp_min(min_std))  # type: ignore[operator]

    # -- the head (subclasses) ------------------------------------------------------------

    def bc_loss(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        """Per-row behaviour-cloning loss, shape (B,)."""
        raise NotImplementedError

    def predict(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        """Actions (B, A), or chunks (B, T, A), conditioned on ``indicator``."""
        raise NotImplementedError

    def predict_guided(self, batch: Batch) -> torch.Tensor:
        """Inference-time prediction: conditioned on ``inference_indicator`` with CFG.

        With an indicator and ``guidance_weight`` w != 1:
        ``a = a(null) + w * (a(positive) - a(null))`` (Ho & Salimans 2022, as used by RECAP).
        """
        if self.inference_indicator is None or self.indicator_embedding is None:
            return self.predict(batch, None)
        b = batch["observation.state"].shape[0]
        dev = batch["observation.state"].device
        cond = torch.full((b,), self.inference_indicator, dtype=torch.long, device=dev)
        pos = self.predict(batch, cond)
        if self.guidance_weight == 1.0:
            return pos
        null = self.predict(batch, torch.full_like(cond, INDICATOR_NULL))
        return null + self.guidance_weight * (pos - null)

    # -- Policy protocol ------------------------------------------------------------------

    @torch.no_grad()
    def act(self, observation: Mapping[str, np.ndarray], task: int = 0) -> np.ndarray:
        """One observation (no batch dim) -> action (A,) or chunk (T, A), float32 numpy."""
        device = next(self.parameters()).device
        batch: Batch = {}
        for key, value in observation.items():
            if key == "observation.state" or key.startswith("observation.images."):
                batch[key] = torch.as_tensor(np.asarray(value)).unsqueeze(0).to(device)
        if "observation.state" not in batch:
            raise KeyError(f"observation needs 'observation.state'; got {sorted(observation)}")
        batch["observation.state"] = batch["observation.state"].float()
        batch["task_index"] = torch.tensor([task], dtype=torch.long, device=device)
        was_training = self.training
        self.eval()
        try:
            out = self.predict_guided(batch)[0]
        finally:
            self.train(was_training)
        result: np.ndarray = out.cpu().numpy().astype(np.float32)
        return result

    def get_weights(self) -> Weights:
        """Flat ``{name: tensor}`` (CPU, detached, contiguous): ready for safetensors."""
        return {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load a flat weight dict; raises ValueError naming missing/unexpected/mis-shaped keys."""
        load_weights_strict(self, weights)


def load_weights_strict(module: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """``module.load_state_dict`` with one readable error that names every mismatch."""
    own = module.state_dict()
    problems = describe_mismatch(own, weights)
    if problems:
        raise ValueError("weights do not fit this policy: " + "; ".join(problems))
    module.load_state_dict(dict(weights), strict=True)


def describe_mismatch(
    expected: Mapping[str, torch.Tensor],
    got: Mapping[str, torch.Tensor],
    *,
    prefix: str = "",
    expected_as: str = "expected",
    got_as: str = "got",
) -> list[str]:
    """Human-readable differences between two tensor dicts (keys and shapes): keys missing
    from ``got``, keys it has beyond ``expected``, and ``<key>: expected shape (8, 16), got
    (4, 16)`` for each shape that differs; every key written ``prefix + key``, the two sides
    called ``expected_as`` and ``got_as``."""
    problems: list[str] = []
    missing = sorted(prefix + k for k in set(expected) - set(got))
    extra = sorted(prefix + k for k in set(got) - set(expected))
    if missing:
        problems.append(f"missing keys {missing}")
    if extra:
        problems.append(f"unexpected keys {extra}")
    for key in sorted(set(expected) & set(got)):
        want, have = tuple(expected[key].shape), tuple(got[key].shape)
        if want != have:
            problems.append(f"{prefix}{key}: {expected_as} shape {want}, {got_as} {have}")
    return problems
