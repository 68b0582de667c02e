"""Step dicts (``{column: value}``) into a record batch of a step schema
(``buffer.table.schema.StepSchema``, seen here as a :class:`RecordLayout`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from buffer.errors import StepValidationError
from buffer.table.features import FINAL_PREFIX, OPTIONAL_ACTIONS, SCALAR_COLUMNS, FeatureSpec


class RecordLayout(Protocol):
    """The columns of a step schema that records are built into (``StepSchema`` is one)."""

    @property
    def arrow_schema(self) -> pa.Schema:
        """The exact Arrow schema of stored record batches."""
        ...

    @property
    def payload(self) -> Mapping[str, FeatureSpec]:
        """``observation.*``, ``action`` and the optional actions, by name, in column order."""
        ...

    @property
    def observations(self) -> Mapping[str, FeatureSpec]:
        """``observation.*`` features by name, in column order."""
        ...


def batch_from_records(
    schema: RecordLayout, records: Sequence[Mapping[str, Any]]
) -> pa.RecordBatch:
    """Build a record batch from a list of step dicts (``{column: value}``).

    Array values may be numpy arrays or nested lists; float features accept any float
    dtype (cast to the schema's), integer and uint8 features need a dtype that casts safely.
    ``action.policy``, ``action.operator`` and ``next.observation.*`` may be left out.

    Raises:
        StepValidationError: a value is missing or has the wrong shape or dtype.
    """
    if len(records) == 0:
        return schema.arrow_schema.empty_table().to_batches(max_chunksize=1)[0].slice(0, 0)
    cols: dict[str, pa.Array] = {}
    for name, typ in SCALAR_COLUMNS.items():
        values = []
        for i, rec in enumerate(records):
            if name not in rec or rec[name] is None:
                raise _err(i, rec, name, "missing")
            values.append(rec[name])
        try:
            cols[name] = pa.array(values, type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            bad = _first_bad_scalar(values, typ)
            raise _err(bad, records[bad], name, f"not a {typ}: {values[bad]!r}") from None
    for name, f in schema.payload.items():
        optional = name in OPTIONAL_ACTIONS
        arrs: list[np.ndarray[Any, Any] | None] = []
        for i, rec in enumerate(records):
            v = rec.get(name)
            if v is None:
                if not optional:
                    raise _err(i, rec, name, "missing")
                arrs.append(None)
                continue
            arrs.append(_coerce(v, f, i, rec, name))
        cols[name] = _fixed_list(arrs, f)
    for name, f in schema.observations.items():
        key = FINAL_PREFIX + name
        blobs: list[bytes | None] = []
        for i, rec in enumerate(records):
            v = rec.get(key)
            blobs.append(None if v is None else _coerce(v, f, i, rec, key).tobytes())
        cols[key] = pa.array(blobs, type=pa.large_binary())
    return pa.RecordBatch.from_arrays(
        [cols[f.name] for f in schema.arrow_schema], schema=schema.arrow_schema
    )


def _err(i: int, rec: Mapping[str, Any], field: str, what: str) -> StepValidationError:
    rid, seq = rec.get("robot_id"), rec.get("seq")
    return StepValidationError(
        f"record {i} (robot_id={rid!r}, seq={seq}): field {field!r} {what}",
        record=i,
        field=field,
        robot_id=rid if isinstance(rid, str) else None,
        seq=seq if isinstance(seq, int) else None,
    )


def _first_bad_scalar(values: list[Any], typ: pa.DataType) -> int:
    for i, v in enumerate(values):
        try:
            pa.array([v], type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return i
    return 0


def _coerce(
    v: Any, f: FeatureSpec, i: int, rec: Mapping[str, Any], name: str
) -> np.ndarray[Any, Any]:
    arr = np.asarray(v)
    if arr.dtype != f.dtype:
        ok = np.can_cast(arr.dtype, f.dtype, "same_kind" if f.dtype.kind == "f" else "safe")
        if arr.dtype == object or not ok:
            raise _err(i, rec, name, f"has dtype {arr.dtype}, expected {f.dtype}")
        arr = arr.astype(f.dtype)
    if arr.shape != f.shape:
        raise _err(i, rec, name, f"has shape {arr.shape}, expected {f.shape}")
    return arr


def _fixed_list(arrs: list[np.ndarray[Any, Any] | None], f: FeatureSpec) -> pa.Array:
    n = len(arrs)
    flat = np.zeros((n, f.size), dtype=f.dtype)
    valid = np.ones(n, dtype=bool)
    for i, a in enumerate(arrs):
        if a is None:
            valid[i] = False
        else:
            flat[i] = a.reshape(-1)
    mask = None if valid.all() else pa.array(~valid)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), f.size, mask=mask)
