"""The small columns of one step batch as numpy arrays, taken out of Arrow once per append.

Validation, de-duplication, the row index and the acknowledgement all read ``seq``,
``robot_id``, the episode columns and the flags. Each ``pyarrow`` call costs microseconds of
interpreter time under the GIL, so asking the batch again in every part cost more than the
checks themselves; :func:`StepColumns.of` does it once (one ``dictionary_encode`` per string
column: a batch usually holds one robot, one run and one task).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUMERIC = (
    "seq",
    "episode_index",
    "frame_index",
    "timestamp",
    "reward",
    "terminated",
    "truncated",
    "is_intervention",
    "policy_version",
)
STRINGS = ("robot_id", "run_id", "task")


@dataclass(frozen=True)
class Strings:
    """A string column dictionary-encoded: ``names[codes[i]]`` is row ``i``'s value.

    Attributes:
        names: the distinct values, in first-seen order.
        codes: int32 ``(n,)`` positions into ``names``.
    """

    names: list[str]
    codes: np.ndarray

    @classmethod
    def of(cls, arr: pa.Array) -> Strings:
        """Encode a ``string`` array without nulls."""
        one = _single_value(arr)
        if one is not None:  # the usual batch: one value, no compute kernel
            return cls([one], np.zeros(len(arr), dtype=np.int32))
        enc = pc.dictionary_encode(arr)
        names = [str(v) for v in enc.dictionary.to_pylist()]
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return cls(names, codes)

    @property
    def single(self) -> bool:
        """Every row holds the same value."""
        return len(self.names) == 1

    def value(self, row: int) -> str:
        return self.names[int(self.codes[row])]

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 byte length of each row's value, int64 ``(n,)``."""
        per_name = np.array([len(s.encode()) for s in self.names], dtype=np.int64)
        return per_name[self.codes] if len(self.codes) else np.zeros(0, np.int64)

    def take(self, rows: np.ndarray) -> Strings:
        return Strings(self.names, self.codes[rows])


def _single_value(arr: pa.Array) -> str | None:
    """The value of a ``string`` array whose rows all hold the same one, else None.

    Read from the offsets and data buffers with numpy: a compute kernel call costs more
    (it releases and retakes the GIL, which under contention is a context switch)."""
    n = len(arr)
    if n == 0 or arr.null_count or arr.type != pa.string():
        return None
    _, offsets_buf, data_buf = arr.buffers()
    off = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    width = int(off[1] - off[0])
    if not (np.diff(off) == width).all():
        return None
    if width == 0:
        return ""
    data = np.frombuffer(data_buf, dtype=np.uint8, count=n * width, offset=int(off[0]))
    rows = data.reshape(n, width)
    if not (rows == rows[0]).all():
        return None  # equal total length by chance (or different values)
    return bytes(rows[0]).decode()


@dataclass(frozen=True)
class StepColumns:
    """The small columns of a batch of ``n`` steps (see the module docstring).

    Attributes:
        n: rows.
        num: ``seq``, ``episode_index``, ``frame_index``, ``policy_version`` (int64),
            ``timestamp`` (float64), ``reward`` (float32), ``terminated``, ``truncated``,
            ``is_intervention`` (bool), each ``(n,)``.
        robot, run, task: the string columns, dictionary-encoded.
    """

    n: int
    num: dict[str, np.ndarray]
    robot: Strings
    run: Strings
    task: Strings

    @classmethod
    def of(cls, batch: pa.RecordBatch, positions: dict[str, int] | None = None) -> StepColumns:
        """Read the columns of ``batch`` (it must have them, with the step schema's types);
        ``positions``: their indices in the batch, when known (faster than by name)."""
        pos = positions or {name: i for i, name in enumerate(batch.schema.names)}
        num = {k: batch.column(pos[k]).to_numpy(zero_copy_only=False) for k in NUMERIC}
        strings = [Strings.of(batch.column(pos[k])) for k in STRINGS]
        return cls(batch.num_rows, num, *strings)

    @property
    def seq(self) -> np.ndarray:
        return self.num["seq"]

    @property
    def done(self) -> np.ndarray:
        return self.num["terminated"] | self.num["truncated"]

    def take(self, rows: np.ndarray) -> StepColumns:
        """The rows ``rows`` (an int index or a bool mask), in that order."""
        num = {k: v[rows] for k, v in self.num.items()}
        n = len(next(iter(num.values())))
        return StepColumns(n, num, self.robot.take(rows), self.run.take(rows), self.task.take(rows))
