"""``foundation.naming.unknown_names``: what was asked and does not exist, in one line."""

from __future__ import annotations

from foundation.naming import SHOWN, unknown_names


def test_known_names_give_nothing_and_unknown_ones_their_closest() -> None:
    known = ["reach-v3", "push-v3", "pick-place-v3"]
    assert unknown_names(["reach-v3", "push-v3"], known) == ""
    assert unknown_names(["reach-v2", "fly-v9"], known) == (
        "'reach-v2' (did you mean 'reach-v3'?), 'fly-v9'; known: pick-place-v3, push-v3, reach-v3"
    )
    assert unknown_names(["x"], []) == "'x'; known: none"


def test_many_known_names_are_sampled() -> None:
    known = [f"task-{i:02d}" for i in range(50)]
    line = unknown_names(["nothing-like-it"], known)
    assert line.endswith(f"task-{SHOWN - 1:02d} and {50 - SHOWN} more")
    assert f"task-{SHOWN:02d}" not in line
