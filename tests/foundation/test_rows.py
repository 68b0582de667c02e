"""The one row filter (``foundation.rows.RowFilter``) and a run's offline source's use of it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from foundation.rows import RowFilter
from foundation.runspec import OfflineSource


def test_a_filter_is_frozen_and_holds_tuples() -> None:
    rows = RowFilter(tasks=["push"], robot_ids=["robot-0", "robot-1"], time_range=[0.0, 1.5])  # type: ignore[arg-type]
    assert rows.tasks == ("push",) and rows.robot_ids == ("robot-0", "robot-1")
    assert rows.time_range == (0.0, 1.5)
    with pytest.raises(AttributeError):
        rows.tasks = ("reach",)  # type: ignore[misc]
    assert RowFilter(policy_versions=[1, 3]).policy_versions == [1, 3]  # a list: these versions


def test_a_time_range_that_ends_before_it_starts_is_refused() -> None:
    assert RowFilter(time_range=(2.0, 2.0)).time_range == (2.0, 2.0)
    with pytest.raises(ValueError, match="before the start"):
        RowFilter(time_range=(1.0, 0.5))


def test_given_names_only_what_filters() -> None:
    assert RowFilter().given() == {}
    rows = RowFilter(tasks=("push",), success_only=True, time_range=(0.0, 5.0))
    assert rows.given() == {"tasks": ("push",), "success_only": True, "time_range": (0.0, 5.0)}


def test_an_offline_source_keeps_its_keys_and_gives_the_row_filter() -> None:
    source = OfflineSource.model_validate(
        {
            "source": "demo",
            "tasks": ["push"],
            "robots": ["r1"],
            "success_only": True,
            "time_range": [0.0, 3.0],
        }
    )
    assert source.rows() == RowFilter(
        tasks=("push",), robot_ids=("r1",), success_only=True, time_range=(0.0, 3.0)
    )
    assert OfflineSource(source="demo").rows() == RowFilter()
    with pytest.raises(ValidationError, match="before the start"):
        OfflineSource.model_validate({"source": "demo", "time_range": [2.0, 1.0]})
    with pytest.raises(ValidationError):
        OfflineSource.model_validate({"source": "demo", "robot_ids": ["r1"]})  # not a key
