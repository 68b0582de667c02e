"""LeRobot transitions -> robofleet step rows, each checked before it is accepted.

LeRobot's actor sends ``torch.save`` of a list of transition dicts (``state``, ``action``,
``reward``, ``next_state``, ``done``, ``truncated``, ``complementary_info`` with
``is_intervention`` and ``discrete_penalty``), one list per finished episode. They are loaded
with ``torch.load(weights_only=True)`` only (tensors, dicts, lists and plain values; anything
else fails to load). Each transition is checked against the run's
:class:`~buffer.table.schema.StepSchema` (names, shapes, dtypes, NaN/inf) and becomes one row
(the fields of :mod:`edge_agent.recording`); a bad one is refused with a reason that names the
transition and the field, and is not stored. The row's reward is the run's reward source's
(:mod:`.rewards`): LeRobot's for ``robot``, the run's classifier's for ``classifier``.

Episodes and frames are numbered here: the episode index comes from the run spool's
:class:`~edge_agent.episodes.EpisodeLog` (never reused across restarts), the frame counts the
accepted transitions of the episode, and ``done`` / ``truncated`` end it. LeRobot tensors carry
a leading batch dimension of 1, which is dropped; LeRobot's float images ``(C, H, W)`` in
``[0, 1]`` become ``uint8`` ``(H, W, C)``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from buffer.table.features import FeatureSpec
from buffer.table.schema import StepSchema
from edge_agent.episodes import EpisodeLog
from edge_agent.lerobot_gateway.rewards import GatewayReward

Row = dict[str, Any]


class TransitionRefused(ValueError):
    """One transition the run cannot store; the message names it and the field."""


def load_transitions(data: bytes) -> list[Any]:
    """The list LeRobot's ``transitions_to_bytes`` wrote, loaded with ``weights_only=True``.

    Raises:
        TransitionRefused: the bytes do not load under ``weights_only`` or hold no list.
    """
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # a torch.save of foreign classes, or not a torch file at all
        raise TransitionRefused(
            f"message refused: does not load with weights_only ({exc})"
        ) from None
    if not isinstance(loaded, list):
        raise TransitionRefused(f"message refused: a {type(loaded).__name__}, not a list")
    return loaded


def _scalar(value: Any, where: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TransitionRefused(f"{where} has {value.numel()} values, not one")
        value = value.item()
    if not isinstance(value, bool | int | float):
        raise TransitionRefused(f"{where} is a {type(value).__name__}, not a number")
    if not math.isfinite(float(value)):
        raise TransitionRefused(f"{where} is {value}")
    return float(value)


def _array(value: Any, f: FeatureSpec, where: str) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise TransitionRefused(f"{where} is a {type(value).__name__}, not a tensor")
    want = (f.shape[2], f.shape[0], f.shape[1]) if f.is_image else f.shape
    t = value.detach()
    if tuple(t.shape) == (1, *want):  # LeRobot's batch dimension
        t = t[0]
    if tuple(t.shape) != want:
        raise TransitionRefused(
            f"{where} has shape {tuple(value.shape)}, the run's schema says {want}"
        )
    if f.is_image and t.dtype == torch.uint8:
        return t.permute(1, 2, 0).contiguous().numpy()
    if not t.is_floating_point():
        raise TransitionRefused(f"{where} has dtype {t.dtype}, the run's schema says {f.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise TransitionRefused(f"{where} holds NaN or inf")
    if f.is_image:
        if float(t.min()) < 0.0 or float(t.max()) > 1.0:
            raise TransitionRefused(f"{where} is a float image outside [0, 1]")
        return (t * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    return t.to(torch.float32).numpy()


def _observation(obs: Any, schema: StepSchema, where: str) -> dict[str, np.ndarray]:
    if not isinstance(obs, Mapping):
        raise TransitionRefused(f"{where} is a {type(obs).__name__}, not a dict")
    missing = sorted(set(schema.observations) - set(obs))
    if missing:
        raise TransitionRefused(f"{where} lacks {missing}")
    return {k: _array(obs[k], f, f"{where}[{k!r}]") for k, f in schema.observations.items()}


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, bool | int):
        raise TransitionRefused(f"{where} is a {type(value).__name__}, not a flag")
    return bool(value)


class TransitionIntake:
    """Turns LeRobot transition messages into rows of one robot in one run.

    Args:
        schema: the run's step schema.
        episodes: the run spool's episode log (indices survive restarts).
        ids: ``robot_id`` (str), ``run_id``, ``task`` of every row.
        fps: steps per second (``timestamp = frame / fps``).
        reward: the run's reward source (``rewards``); None stores LeRobot's reward.
    """

    def __init__(
        self,
        schema: StepSchema,
        episodes: EpisodeLog,
        ids: Row,
        fps: float,
        reward: GatewayReward | None = None,
    ) -> None:
        self.schema = schema
        self.episodes = episodes
        self.ids = ids
        self.fps = fps
        self.reward = reward or GatewayReward("robot")
        self._episode: int | None = None
        self._frame = 0
        self._seen = 0  # transitions received (names refused ones)

    def convert(self, data: bytes, policy_version: int) -> tuple[list[Row], list[str]]:
        """Rows of the transitions in ``data`` and the refusals (one line each, naming the
        transition by its number since the gateway started and the field).

        The message's rows are checked against the schema together (one Arrow batch, as the
        spool stores them); only when that fails is each row checked alone, to name the bad
        ones. Episodes and frames are numbered after the checks, so a refused transition
        takes no frame.

        Raises:
            TransitionRefused: the whole message is unreadable (does not load with
                ``weights_only``, or is not a list).
        """
        # (row or None, its refusal, whether it ends its episode), in the message's order
        parsed: list[tuple[Row | None, str, bool]] = []
        named: list[tuple[str, Row]] = []  # the rows, with the transitions' names
        for t in load_transitions(data):
            n, self._seen = self._seen, self._seen + 1
            try:
                row, ends = self._row(t, f"transition {n}", policy_version)
            except TransitionRefused as exc:
                parsed.append((None, str(exc), self._ends(t)))
            else:
                parsed.append((row, "", ends))
                named.append((f"transition {n}", row))
        bad = self._invalid(named)
        rows: list[Row] = []
        refused: list[str] = []
        k = 0  # index among the parsed rows (what ``bad`` counts)
        for got, why, ends in parsed:
            if self._episode is None:
                self._episode, self._frame = self.episodes.begin(), 0
            if got is not None:
                why, k = bad.get(k, ""), k + 1
            if got is None or why:
                refused.append(why)
            else:
                row = got
                row.update(
                    episode_index=self._episode,
                    frame_index=self._frame,
                    timestamp=self._frame / self.fps,
                )
                rows.append(row)
                self._frame += 1
            if ends:
                self.episodes.log(self._episode, str(self.ids["task"]), self._frame, None)
                self._episode = None
        return rows, refused

    def _invalid(self, rows: list[tuple[str, Row]]) -> dict[int, str]:
        """Index -> refusal of each of ``(name, row)`` the schema refuses
        (``StepSchema.validate``); one check of them all, then one per row only when that
        fails."""

        def check(batch: list[Row]) -> str:
            try:
                self.schema.validate(self.schema.batch_from_records(batch))
            except ValueError as exc:
                return str(exc)
            return ""

        def numbered(i: int, row: Row) -> Row:  # the fields numbering gives later
            return {**row, "seq": i, "episode_index": 0, "frame_index": i, "timestamp": 0.0}

        if not rows or not check([numbered(i, r) for i, (_, r) in enumerate(rows)]):
            return {}
        out = {}
        for i, (name, row) in enumerate(rows):
            why = check([numbered(0, row)])
            if why:
                out[i] = f"{name}: {why}"
        return out

    @staticmethod
    def _ends(t: Any) -> bool:
        """Whether a refused transition still ends its episode (when its flags are readable)."""
        if not isinstance(t, Mapping):
            return False
        try:
            return _flag(t.get("done", False), "done") or _flag(t.get("truncated", False), "")
        except TransitionRefused:
            return False

    def _row(self, t: Any, name: str, policy_version: int) -> tuple[Row, bool]:
        if not isinstance(t, Mapping):
            raise TransitionRefused(f"{name} is a {type(t).__name__}, not a dict")
        for key in ("state", "action", "reward", "next_state", "done", "truncated"):
            if key not in t:
                raise TransitionRefused(f"{name} has no {key!r}")
        info = t.get("complementary_info") or {}
        if not isinstance(info, Mapping):
            raise TransitionRefused(f"{name}: complementary_info is a {type(info).__name__}")
        done = _flag(t["done"], f"{name}: done")
        truncated = _flag(t["truncated"], f"{name}: truncated")
        sent = _scalar(t["reward"], f"{name}: reward")
        final = None
        if done or truncated or self.reward.needs_next_observation:
            final = _observation(t["next_state"], self.schema, f"{name}: next_state")
        row: Row = {
            **self.ids,
            "reward": self.reward.reward(sent, final, done, truncated),
            "terminated": done,
            "truncated": truncated and not done,
            "is_intervention": _flag(
                info.get("is_intervention", False), f"{name}: complementary_info.is_intervention"
            ),
            "policy_version": policy_version,
            "action": _array(t["action"], self.schema.action, f"{name}: action"),
            **_observation(t["state"], self.schema, f"{name}: state"),
        }
        if (done or truncated) and final is not None:
            row.update({f"next.{k}": v for k, v in final.items()})
        return row, done or truncated
