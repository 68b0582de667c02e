"""Step schema: construction from LeRobot feature dicts and validation on ingest."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer import StepSchema, StepValidationError
from tests.buffer.helpers import episodes, open_buffer, small_schema, step


def test_from_features_builds_columns() -> None:
    s = small_schema()
    names = s.arrow_schema.names
    for col in (
        "seq",
        "robot_id",
        "task",
        "reward",
        "terminated",
        "truncated",
        "is_intervention",
        "policy_version",
        "episode_index",
        "frame_index",
        "timestamp",
        "run_id",
        "observation.state",
        "observation.images.front",
        "action",
        "action.policy",
        "action.operator",
        "next.observation.state",
    ):
        assert col in names
    assert s.observations["observation.images.front"].is_image
    assert s.observations["observation.images.front"].dtype == np.uint8
    assert StepSchema.from_json(s.to_json()).same_columns(s)


def test_prefix_added_and_bad_features_rejected() -> None:
    s = StepSchema.from_features(
        {"state": {"dtype": "float32", "shape": (2,)}}, {"a": {"dtype": "float32", "shape": (1,)}}
    )
    assert "observation.state" in s.observations
    with pytest.raises(ValueError, match="shape"):
        StepSchema.from_features(
            {"s": {"dtype": "float32", "shape": (0,)}}, {"a": {"dtype": "float32", "shape": (1,)}}
        )
    with pytest.raises(ValueError, match="dtype"):
        StepSchema.from_features(
            {"s": {"dtype": "complex", "shape": (1,)}}, {"a": {"dtype": "float32", "shape": (1,)}}
        )
    with pytest.raises(ValueError, match="HWC"):
        StepSchema.from_features(
            {"images.x": {"dtype": "image", "shape": (3, 4)}},
            {"a": {"dtype": "float32", "shape": (1,)}},
        )


BAD_CASES = [
    (
        "observation.state",
        lambda r: r.update({"observation.state": np.zeros(4, np.float32)}),
        "shape",
    ),
    (
        "observation.images.front",
        lambda r: r.update({"observation.images.front": np.zeros((6, 5, 3), np.float32)}),
        "dtype",
    ),
    (
        "observation.state",
        lambda r: r.update({"observation.state": np.array([0, np.nan, 0], np.float32)}),
        "NaN",
    ),
    ("action", lambda r: r.update({"action": np.array([np.inf, 0], np.float32)}), "NaN or Inf"),
    ("reward", lambda r: r.update({"reward": float("nan")}), "finite"),
    ("task", lambda r: r.pop("task"), "missing"),
    ("frame_index", lambda r: r.update({"frame_index": -1}), "negative"),
    ("robot_id", lambda r: r.update({"robot_id": ""}), "empty"),
]


@pytest.mark.parametrize("field,mutate,what", BAD_CASES)
def test_bad_record_names_record_and_field(tmp_path, field, mutate, what) -> None:
    recs = episodes(0, [5])
    mutate(recs[3])
    with open_buffer(tmp_path / "b") as buf:
        with pytest.raises(StepValidationError, match=what) as err:
            buf.append(recs)
        assert err.value.field == field
        assert err.value.record == 3
        assert "record 3" in str(err.value)
        assert buf.num_steps == 0  # all-or-nothing: nothing of the batch is stored


def test_oversize_record_rejected(tmp_path) -> None:
    schema = small_schema(max_record_bytes=100)
    with open_buffer(tmp_path / "b", schema) as buf:
        with pytest.raises(StepValidationError, match="max_record_bytes") as err:
            buf.append(episodes(0, [3]))
        assert err.value.field == "(record)"
        assert buf.num_steps == 0


def test_missing_final_observation_rejected_unless_optional(tmp_path) -> None:
    recs = episodes(0, [3])
    del recs[-1]["next.observation.state"]
    with open_buffer(tmp_path / "a") as buf:
        with pytest.raises(StepValidationError, match="final observation") as err:
            buf.append(recs)
        assert err.value.field == "next.observation.state"
    with open_buffer(tmp_path / "b", small_schema(require_final_observation=False)) as buf:
        buf.append(recs)
        assert buf.num_steps == 3


def test_unknown_and_wrong_type_columns_in_record_batch(tmp_path) -> None:
    s = small_schema()
    batch = s.batch_from_records(episodes(0, [4]))
    with open_buffer(tmp_path / "b") as buf:
        extra = batch.append_column("bogus", pa.array([1, 2, 3, 4]))
        with pytest.raises(StepValidationError, match="unknown field") as err:
            buf.append(extra)
        assert err.value.field == "bogus"
        wrong = batch.set_column(
            batch.schema.get_field_index("reward"), "reward", pa.array(["x"] * 4)
        )
        with pytest.raises(StepValidationError, match="reward"):
            buf.append(wrong)
        # Variable-length lists of the right length are accepted (wire encodings differ).
        state = pa.array([[1.0, 2.0, 3.0]] * 4, type=pa.list_(pa.float32()))
        ok = batch.set_column(
            batch.schema.get_field_index("observation.state"), "observation.state", state
        )
        assert buf.append(ok).stored == 4
        short = pa.array([[1.0, 2.0, 3.0]] * 3 + [[1.0]], type=pa.list_(pa.float32()))
        bad = batch.set_column(
            batch.schema.get_field_index("observation.state"), "observation.state", short
        )
        with pytest.raises(StepValidationError, match="record 3") as err:
            buf.append(bad)
        assert err.value.field == "observation.state"


def _with_column(batch: pa.RecordBatch, name: str, col: pa.Array) -> pa.RecordBatch:
    """``batch`` with column ``name`` replaced, its schema (metadata and flags) kept."""
    cols = batch.columns
    cols[batch.schema.get_field_index(name)] = col
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def test_a_batch_in_the_stored_schema_is_checked_like_any_other(tmp_path) -> None:
    # What robots send (the edge agent validates with the run's schema) is stored as it
    # is once checked: the same errors, with the record and field, nothing stored.
    s = small_schema()
    sent = s.validate(s.batch_from_records(episodes(0, [5])))
    assert sent.schema.equals(s.arrow_schema, check_metadata=True)
    assert s._plan(sent.schema).stored  # the path under test
    reward = pa.array([0.0, 0.0, None, 0.0, 0.0], pa.float32())
    policy = pa.FixedSizeListArray.from_arrays(
        pa.array([0, 0, 0, 0, np.nan, 0, 0, 0, 0, 0], pa.float32()),
        2,
        mask=pa.array([True, True, False, True, True]),
    )
    with open_buffer(tmp_path / "b", s) as buf:
        with pytest.raises(StepValidationError, match="is null") as err:
            buf.append(_with_column(sent, "reward", reward))
        assert err.value.field == "reward" and err.value.record == 2
        with pytest.raises(StepValidationError, match="NaN") as err:
            buf.append(_with_column(sent, "action.policy", policy))
        assert err.value.field == "action.policy" and err.value.record == 2
        assert buf.num_steps == 0
        assert buf.append(sent).stored == 5
        # Optional actions sent as nulls are the executed action, as in any other batch.
        out = buf.read_transitions(np.arange(5))
        np.testing.assert_array_equal(out["action.policy"], out["action"])
        np.testing.assert_array_equal(out["action.operator"], out["action"])


def test_seq_must_increase_within_batch_and_across(tmp_path) -> None:
    recs = episodes(0, [6])
    swapped = recs[:2] + [recs[3], recs[2]] + recs[4:]
    with open_buffer(tmp_path / "b") as buf:
        with pytest.raises(StepValidationError, match="strictly increasing") as err:
            buf.append(swapped)
        assert err.value.field == "seq" and err.value.record == 3
        assert buf.num_steps == 0
        buf.append([recs[0], recs[2]])  # seq 0 and 2; a gap is allowed
        with pytest.raises(StepValidationError, match="out of order") as err:
            buf.append([recs[1]])  # seq 1 < highest stored and never stored
        assert err.value.seq == 1
        assert buf.num_steps == 2


def test_seq_put_out_of_order_by_a_concurrent_append_is_refused_not_acked(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Append B (seq 0..2) finds no room in the rate limiter and waits for it (outside the
    combiner); meanwhile append A (seq 3..5 of the same robot) is stored: B's seqs are out of
    order when it is staged again. Once, B stored nothing and returned ``acked {robot-0: 5}``
    as if its rows were duplicates."""
    recs = episodes(0, [6])
    with open_buffer(tmp_path / "b") as buf:
        limit = buf.writer.admission._limit
        stored: list[object] = []
        waited: list[bool] = []

        def no_room_at_first(claim: Any, ticket: Any) -> bool:
            return bool(waited) and limit(claim, ticket)

        def await_room(ticket: Any) -> None:  # A goes first while B waits
            waited.append(True)
            stored.append(buf.append(recs[3:]))
            ticket.needs_room = 0

        monkeypatch.setattr(buf.writer.admission, "_limit", no_room_at_first)
        monkeypatch.setattr(buf.writer.admission, "_await_room", await_room)
        with pytest.raises(StepValidationError, match="out of order") as err:
            buf.append(recs[:3])
        assert err.value.seq == 0
        assert buf.stored_seqs("robot-0").tolist() == [3, 4, 5]
        assert stored[0].acked == {"robot-0": 5}  # type: ignore[attr-defined]


def test_duplicates_are_acked_not_stored_twice(tmp_path) -> None:
    recs = episodes(0, [4, 4])
    with open_buffer(tmp_path / "b") as buf:
        r1 = buf.append(recs[:5])
        assert r1.stored == 5 and r1.acked == {"robot-0": 4}
        r2 = buf.append(recs[3:])  # 2 duplicates, 3 new
        assert (r2.stored, r2.duplicates) == (3, 2)
        assert r2.acked == {"robot-0": 7}
        r3 = buf.append(recs)
        assert (r3.stored, r3.duplicates) == (0, 8)
        assert buf.num_steps == 8
        seqs = buf.index.view("seq")
        assert sorted(seqs.tolist()) == list(range(8))


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 12),
    states=st.lists(st.lists(finite, min_size=3, max_size=3), min_size=12, max_size=12),
    bad_row=st.integers(0, 11),
    kind=st.sampled_from(["nan", "shape", "dtype", "none"]),
)
def test_property_validation_all_or_nothing(tmp_path_factory, n, states, bad_row, kind) -> None:
    """Any valid batch round-trips exactly; one corrupted record rejects the whole batch
    and the error names exactly that record."""
    s = small_schema()
    recs = [step(0, i, 0, i, terminated=i == n - 1) for i in range(n)]
    for i, r in enumerate(recs):
        r["observation.state"] = np.asarray(states[i], dtype=np.float32)
    bad_row = bad_row % n
    if kind == "nan":
        recs[bad_row]["observation.state"] = np.array([np.nan, 0, 0], dtype=np.float32)
    elif kind == "shape":
        recs[bad_row]["action"] = np.zeros(3, dtype=np.float32)
    elif kind == "dtype":
        recs[bad_row]["observation.images.front"] = np.zeros((6, 5, 3), dtype=np.int64)
    path = tmp_path_factory.mktemp("prop")
    with open_buffer(path / "b", s) as buf:
        if kind == "none":
            res = buf.append(recs)
            assert res.stored == n
            got = buf.read_transitions(np.arange(n, dtype=np.int64))
            want = np.stack([r["observation.state"] for r in recs])
            np.testing.assert_array_equal(got["observation.state"], want)
        else:
            with pytest.raises(StepValidationError) as err:
                buf.append(recs)
            assert err.value.record == bad_row
            assert buf.num_steps == 0
