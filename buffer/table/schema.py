"""Step schema: the columns of one step record, built from LeRobot-style feature dicts.

A step (one control tick of one robot) holds scalar columns (``seq``, ``robot_id``,
``run_id``, ``task``, episode and frame indices, ``timestamp``, ``reward``, done flags,
``is_intervention``, ``policy_version``; ``buffer.table.features``), its ``observation.*``
and ``action`` features as fixed-size lists, the optional ``action.policy`` /
``action.operator`` (absent means "same as ``action``", stored as a copy) and, on done steps,
``next.observation.*``: the real final observation as raw C-order bytes. The column table:
docs/buffer.md ("Step schema").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa

from buffer.columns import (
    StepColumns,
    all_finite,
    binary_lengths,
    fixed_list_values,
    valid_mask,
)
from buffer.errors import StepValidationError
from buffer.table.features import FINAL_PREFIX, OPTIONAL_ACTIONS, SCALAR_COLUMNS, FeatureSpec
from buffer.table.records import batch_from_records


@dataclass(frozen=True)
class _Plan:
    """How to build a stored batch from batches of one incoming schema.

    Attributes:
        fields: per stored field, ``(field, its column in the incoming batch or -1 when
            absent, whether its type needs conforming)``.
        absent_actions: stored positions of the optional actions the batch leaves out (they
            are the ``action`` column: "same as the executed action").
        present_actions: an optional action is sent (its nulls are filled per row).
        finite_checks: the float payload columns sent (checked for NaN and Inf).
        stored: the incoming schema is the stored one, metadata included (the batch is
            stored as it is, once its non-nullable columns are checked).
        required: positions of the stored schema's non-nullable fields.
    """

    fields: list[tuple[pa.Field, int, bool]]
    absent_actions: list[int]
    present_actions: bool
    finite_checks: list[str]
    stored: bool = False
    required: list[int] = dataclasses.field(default_factory=list)
    _nulls: dict[tuple[int, int], pa.Array] = dataclasses.field(default_factory=dict)

    def nulls(self, pos: int, n: int) -> pa.Array:
        """The all-null column of ``n`` rows for absent stored field ``pos`` (arrays are
        immutable, so one is shared: ``pa.nulls`` per append allocates and releases the GIL
        on the staging's serial path)."""
        col = self._nulls.get((pos, n))
        if col is None:
            if len(self._nulls) > 64:  # batch sizes vary little; bound it regardless
                self._nulls.clear()
            col = self._nulls[(pos, n)] = pa.nulls(n, self.fields[pos][0].type)
        return col


class StepSchema:
    """The columns of a buffer's steps. Build with :meth:`from_features`.

    Attributes:
        observations: ``observation.*`` features by name, in a fixed order.
        action: the ``action`` feature.
        arrow_schema: the exact Arrow schema of stored record batches.
        require_final_observation: done steps must carry ``next.observation.*``.
    """

    def __init__(
        self,
        observations: Sequence[FeatureSpec],
        action: FeatureSpec,
        *,
        max_record_bytes: int = 16 * 1024**2,
        require_final_observation: bool = True,
    ) -> None:
        if not observations:
            raise ValueError("a step schema needs at least one observation.* feature")
        for f in observations:
            if not f.name.startswith("observation."):
                raise ValueError(f"observation feature {f.name!r} must start with 'observation.'")
        self.observations: dict[str, FeatureSpec] = {f.name: f for f in observations}
        self.action = action
        self.max_record_bytes = max_record_bytes
        self.require_final_observation = require_final_observation
        self.payload: dict[str, FeatureSpec] = dict(self.observations)
        self.payload["action"] = action
        for name in OPTIONAL_ACTIONS:
            self.payload[name] = FeatureSpec(name, action.dtype, action.shape, action.names)
        fields = [pa.field(k, t, nullable=False) for k, t in SCALAR_COLUMNS.items()]
        for name, f in self.payload.items():
            fields.append(pa.field(name, f.arrow_type, nullable=name in OPTIONAL_ACTIONS))
        for name in self.observations:
            fields.append(pa.field(FINAL_PREFIX + name, pa.large_binary(), nullable=True))
        self.arrow_schema = pa.schema(fields, metadata={b"robofleet.step_schema": self.to_json()})
        self.fixed_row_bytes = sum(f.nbytes for f in self.payload.values()) + 8 * 8
        self._plans: list[tuple[pa.Schema, _Plan]] = []
        self._positions = {name: i for i, name in enumerate(self.arrow_schema.names)}
        self._action_pos = self._positions["action"]

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_features(
        cls,
        observation_features: Mapping[str, Mapping[str, Any]],
        action_features: Mapping[str, Mapping[str, Any]],
        *,
        max_record_bytes: int = 16 * 1024**2,
        require_final_observation: bool = True,
    ) -> StepSchema:
        """Build a schema from LeRobot-style feature dicts.

        Args:
            observation_features: ``{"observation.state": {"dtype": "float32", "shape": (39,),
                "names": [...]}, "observation.images.front": {"dtype": "image", "shape":
                (H, W, 3)}}``. Keys without the ``observation.`` prefix get it.
            action_features: ``{"action": {...}}`` (one entry; any single key is taken as the
                action).
            max_record_bytes: a record larger than this is rejected on ingest.
            require_final_observation: done steps must carry ``next.observation.*``.

        Raises:
            ValueError: a feature dict is malformed (names the feature).
        """
        obs = []
        for key, spec in observation_features.items():
            name = key if key.startswith("observation.") else f"observation.{key}"
            obs.append(FeatureSpec.from_lerobot(name, spec))
        if len(action_features) != 1:
            raise ValueError(
                f"action_features must hold exactly one feature, got {list(action_features)}"
            )
        ((_, aspec),) = action_features.items()
        action = FeatureSpec.from_lerobot("action", aspec)
        if action.is_image:
            raise ValueError("the action cannot be an image")
        return cls(
            obs,
            action,
            max_record_bytes=max_record_bytes,
            require_final_observation=require_final_observation,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "observation_features": {k: f.to_lerobot() for k, f in self.observations.items()},
                "action_features": {"action": self.action.to_lerobot()},
                "max_record_bytes": self.max_record_bytes,
                "require_final_observation": self.require_final_observation,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> StepSchema:
        d = json.loads(text)
        return cls.from_features(
            d["observation_features"],
            d["action_features"],
            max_record_bytes=d["max_record_bytes"],
            require_final_observation=d["require_final_observation"],
        )

    def same_columns(self, other: StepSchema) -> bool:
        return self.arrow_schema.remove_metadata().equals(other.arrow_schema.remove_metadata())

    def differences(self, other: StepSchema) -> list[str]:
        """Each feature whose presence, dtype or shape differs between ``self`` (the run's)
        and ``other`` (offline data), one readable line each; empty when they match (then
        ``same_columns`` holds and ``other`` can be mounted)."""
        mine = {**self.observations, "action": self.action}
        theirs = {**other.observations, "action": other.action}
        out = []
        for name in sorted(set(mine) | set(theirs)):
            a, b = mine.get(name), theirs.get(name)
            if a is None or b is None:
                where = "missing from the data" if b is None else "not in the run"
                out.append(f"{name}: {where}")
            elif (a.dtype, a.shape, a.is_image) != (b.dtype, b.shape, b.is_image):
                want = f"{'image' if a.is_image else a.dtype} {a.shape}"
                got = f"{'image' if b.is_image else b.dtype} {b.shape}"
                out.append(f"{name}: the run has {want}, the data {got}")
        return out

    # -- records ------------------------------------------------------------------------
    def batch_from_records(self, records: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        """Build a record batch from a list of step dicts (``{column: value}``).

        Array values may be numpy arrays or nested lists; float features accept any float
        dtype (cast to the schema's), integer and uint8 features need a dtype that casts safely.
        ``action.policy``, ``action.operator`` and ``next.observation.*`` may be left out.

        Raises:
            StepValidationError: a value is missing or has the wrong shape or dtype.
        """
        return batch_from_records(self, records)

    def validate(self, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Check a batch against the schema and return it with the exact stored schema.

        Checks, naming the record (row in the batch, robot_id, seq) and field on failure:
        a missing or unknown column; a null in a required column; wrong dtype or shape; NaN
        or Inf in a float field; negative episode_index/frame_index; an empty robot_id; a
        record over ``max_record_bytes``; ``seq`` not strictly increasing per robot inside
        the batch; a done step without its final observation (when required); a final
        observation of the wrong byte size.

        Raises:
            StepValidationError: the first problem found. Nothing of the batch is stored.
        """
        return self.validate_columns(batch)[0]

    def validate_columns(
        self, batch: pa.RecordBatch | pa.Table
    ) -> tuple[pa.RecordBatch, StepColumns]:
        """:meth:`validate`, also returning the batch's small columns as numpy
        (``buffer.columns``), which the insert path reads instead of asking Arrow again.

        Raises:
            StepValidationError: as :meth:`validate`.
        """
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else None  # type: ignore[assignment]
            if batch is None:
                batch = self.arrow_schema.empty_table().to_batches(max_chunksize=1)[0]
        plan = self._plan(batch.schema)
        n = batch.num_rows
        given = batch.columns  # one call: each ``batch.column(i)`` costs as much as a check
        if plan.stored:  # the stored schema as it is (what robots send): nothing to build
            for pos in plan.required:
                if given[pos].null_count:
                    self._null_err(batch, given[pos], pos)
            out, cols = batch, given
        else:
            cols = []
            for pos, (field, i, conform) in enumerate(plan.fields):
                if i < 0:  # absent: a final observation (nulls) or an optional action (below)
                    cols.append(plan.nulls(pos, n))
                    continue
                col = given[i]
                if conform:
                    col = self._conform(batch, field, col)
                if not field.nullable and col.null_count:
                    self._null_err(batch, col, pos)
                cols.append(col)
            for pos in plan.absent_actions:  # "same as action": the action column itself
                cols[pos] = cols[self._action_pos]
            out = pa.RecordBatch.from_arrays(cols, schema=self.arrow_schema)
        columns = StepColumns.of(out, self._positions, cols)
        if n == 0:
            return out, columns
        self._check_values(out, columns, plan.finite_checks, cols)
        if plan.present_actions:
            out = self._fill_optional_actions(out)
        return out, columns

    def _null_err(self, batch: pa.RecordBatch, col: pa.Array, pos: int) -> NoReturn:
        """Raise the error for a null in stored field ``pos`` (not nullable)."""
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise self._row_err(batch, row, self.arrow_schema.field(pos).name, "is null")

    def _plan(self, schema: pa.Schema) -> _Plan:
        """How to build the stored columns from a batch of ``schema`` (see :class:`_Plan`),
        cached per incoming schema (a robot sends the same one every time).

        Raises:
            StepValidationError: an unknown column, or a required one missing.
        """
        for known, plan in self._plans:
            if known is schema or known.equals(schema):
                return plan
        names = schema.names
        unknown = set(names) - set(self.arrow_schema.names)
        if unknown:
            raise StepValidationError(
                f"unknown field(s) {sorted(unknown)}; the schema has {self.arrow_schema.names}",
                field=sorted(unknown)[0],
            )
        fields: list[tuple[pa.Field, int, bool]] = []
        for field in self.arrow_schema:
            if field.name not in names:
                if not field.nullable:
                    raise StepValidationError(f"field {field.name!r} is missing", field=field.name)
                fields.append((field, -1, False))
                continue
            i = names.index(field.name)
            fields.append((field, i, schema.field(i).type != field.type))
        plan = _Plan(
            fields,
            absent_actions=[self._positions[k] for k in OPTIONAL_ACTIONS if k not in names],
            present_actions=any(k in names for k in OPTIONAL_ACTIONS),
            finite_checks=[
                k for k, f in self.payload.items() if f.dtype.kind == "f" and k in names
            ],
            stored=schema.equals(self.arrow_schema, check_metadata=True),
            required=[pos for pos, f in enumerate(self.arrow_schema) if not f.nullable],
        )
        self._plans = [(schema, plan), *self._plans[:7]]  # a handful of encodings at most
        return plan

    def _fill_optional_actions(self, b: pa.RecordBatch) -> pa.RecordBatch:
        """An absent ``action.policy``/``action.operator`` equals the executed ``action``:
        all absent is the ``action`` column itself (no copy), some absent are filled."""
        action = b.column("action")
        for name in OPTIONAL_ACTIONS:
            col = b.column(name)
            if not col.null_count:
                continue
            i = b.schema.get_field_index(name)
            if col.null_count == len(col):
                filled = action
            else:
                filled = pa.compute.if_else(col.is_null(), action, col).cast(col.type)
            b = b.set_column(i, b.schema.field(i), filled)
        return b

    # -- helpers ------------------------------------------------------------------------
    def _row_err(self, batch: pa.RecordBatch, row: int, field: str, what: str) -> Exception:
        rid = seq = None
        if "robot_id" in batch.schema.names:
            rid = batch.column("robot_id")[row].as_py()
        if "seq" in batch.schema.names:
            seq = batch.column("seq")[row].as_py()
        return StepValidationError(
            f"record {row} (robot_id={rid!r}, seq={seq}): field {field!r} {what}",
            record=row,
            field=field,
            robot_id=rid,
            seq=seq,
        )

    def _conform(self, batch: pa.RecordBatch, field: pa.Field, col: pa.Array) -> pa.Array:
        """Accept an equivalent encoding (variable lists, string views); reject the rest."""
        want = field.type
        got = col.type
        if pa.types.is_fixed_size_list(want):
            if not (
                pa.types.is_list(got)
                or pa.types.is_large_list(got)
                or pa.types.is_fixed_size_list(got)
            ):
                raise StepValidationError(
                    f"field {field.name!r}: expected {want}, got {got}", field=field.name
                )
            if got.value_type != want.value_type:
                raise StepValidationError(
                    f"field {field.name!r}: expected dtype {want.value_type}, got {got.value_type}",
                    field=field.name,
                )
            size = want.list_size
            if pa.types.is_fixed_size_list(got):
                raise StepValidationError(
                    f"field {field.name!r}: expected {size} values (shape "
                    f"{self.payload[field.name].shape}), got {got.list_size}",
                    field=field.name,
                )
            lengths = col.value_lengths().to_numpy(zero_copy_only=False)
            valid = ~col.is_null().to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(valid & (lengths != size))
            if bad.size:
                row = int(bad[0])
                raise self._row_err(
                    batch,
                    row,
                    field.name,
                    f"has {int(lengths[row])} values, expected {size} (shape "
                    f"{self.payload[field.name].shape})",
                )
            flat = col.flatten()
            mask = col.is_null() if col.null_count else None
            return pa.FixedSizeListArray.from_arrays(flat, size, mask=mask)
        try:
            return col.cast(want, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise StepValidationError(
                f"field {field.name!r}: expected {want}, got {got}", field=field.name
            ) from None

    def _check_values(
        self, b: pa.RecordBatch, c: StepColumns, floats: list[str], cols: list[pa.Array]
    ) -> None:
        """Every value check of a batch with the right columns (``cols``: its columns), in the
        order their errors are reported: indices, ids, scalars, payload floats (the columns
        ``floats``), final observations, record size, seq order."""
        str_lens = self._check_scalars(b, c)
        self._check_payload_finite(b, floats, cols)
        sizes = self.fixed_row_bytes + str_lens + self._check_finals(b, c)
        row_bytes = np.broadcast_to(np.asarray(sizes, dtype=np.int64), (b.num_rows,))
        big = np.flatnonzero(row_bytes > self.max_record_bytes)
        if big.size:
            raise self._row_err(
                b,
                int(big[0]),
                "(record)",
                f"is {int(row_bytes[big[0]])} bytes, over max_record_bytes={self.max_record_bytes}",
            )
        self._check_seq_order(b, c)

    def _check_scalars(self, b: pa.RecordBatch, c: StepColumns) -> np.ndarray | int:
        """Indices not negative, ``robot_id`` not empty, ``reward``/``timestamp`` finite;
        returns the byte lengths of the three string columns together (int64, per row)."""
        for name in ("episode_index", "frame_index"):
            v = c.num[name]
            if v.min() < 0:
                bad = np.flatnonzero(v < 0)
                raise self._row_err(b, int(bad[0]), name, f"is negative ({v[bad[0]]})")
        if "" in c.robot.names:
            empty = np.flatnonzero(c.robot.codes == c.robot.names.index(""))
            raise self._row_err(b, int(empty[0]), "robot_id", "is empty")
        for name in ("reward", "timestamp"):
            v = c.num[name]
            if not np.isfinite(v).all():
                bad = np.flatnonzero(~np.isfinite(v))
                raise self._row_err(b, int(bad[0]), name, f"is not finite ({v[bad[0]]})")
        if c.robot.single and c.run.single and c.task.single:  # the usual batch
            return sum(len(x.names[0].encode()) for x in (c.robot, c.run, c.task))
        return c.robot.byte_lengths() + c.run.byte_lengths() + c.task.byte_lengths()

    def _check_payload_finite(
        self, b: pa.RecordBatch, names: list[str], cols: list[pa.Array]
    ) -> None:
        """No NaN or Inf in the float payload columns ``names`` (``cols``: the columns of
        ``b``)."""
        for name in names:
            col = cols[self._positions[name]]
            if col.null_count == len(col):  # an optional action not sent: no values
                continue
            vals = fixed_list_values(col)
            if all_finite(vals):  # the usual case
                continue
            finite = np.isfinite(vals.reshape(-1, self.payload[name].size)).all(axis=1)
            if col.null_count:
                # flatten() drops null slots, so map rows back through the validity mask.
                rows = np.flatnonzero(valid_mask(col))
                bad = rows[~finite]
            else:
                bad = np.flatnonzero(~finite)
            raise self._row_err(b, int(bad[0]), name, "contains NaN or Inf")

    def _check_finals(self, b: pa.RecordBatch, c: StepColumns) -> np.ndarray | int:
        """Final observations (``next.observation.*``): the right size, present on done steps
        when required, finite; returns their bytes per row (0 when none is checked)."""
        n = b.num_rows
        done = c.done
        any_done = bool(done.any())
        total: np.ndarray | int = 0
        for name, f in self.observations.items():
            key = FINAL_PREFIX + name
            col = b.column(key)
            if col.null_count == n and not (any_done and self.require_final_observation):
                continue  # no final observations and none required: nothing to check
            has = valid_mask(col)
            lens = binary_lengths(col, has)
            bad = np.flatnonzero(has & (lens != f.nbytes))
            if bad.size:
                raise self._row_err(
                    b,
                    int(bad[0]),
                    key,
                    f"has {int(lens[bad[0]])} bytes, expected {f.nbytes} ({f.dtype} {f.shape})",
                )
            if self.require_final_observation:
                missing = np.flatnonzero(done & ~has)
                if missing.size:
                    raise self._row_err(
                        b,
                        int(missing[0]),
                        key,
                        "is missing on a terminated/truncated step (its real final observation)",
                    )
            if f.dtype.kind == "f" and has.any():
                for row in np.flatnonzero(has):
                    arr = np.frombuffer(col[int(row)].as_py(), dtype=f.dtype)
                    if not np.isfinite(arr).all():
                        raise self._row_err(b, int(row), key, "contains NaN or Inf")
            total = total + lens
        return total

    def _check_seq_order(self, b: pa.RecordBatch, c: StepColumns) -> None:
        """Each robot's seqs strictly increase within the batch."""
        robots = c.robot.codes
        seqs = c.seq
        if c.robot.single:  # the usual batch: one robot's steps
            back = np.flatnonzero(np.diff(seqs) <= 0)
            if back.size:
                raise self._row_err(
                    b,
                    int(back[0]) + 1,
                    "seq",
                    "is not strictly increasing for its robot within the batch",
                )
            return
        order = np.lexsort((np.arange(len(seqs)), robots))
        same = robots[order][1:] == robots[order][:-1]
        back = np.flatnonzero(same & (np.diff(seqs[order]) <= 0))
        if back.size:
            row = int(order[back[0] + 1])
            raise self._row_err(
                b, row, "seq", "is not strictly increasing for its robot within the batch"
            )
