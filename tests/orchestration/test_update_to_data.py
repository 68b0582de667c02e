"""The learner process's pacing and placement: the samples-per-insert rule (Reverb's
SampleToInsertRatio, sampling side) and the device a spec's ``learner.num_gpus`` asks for."""

from __future__ import annotations

import pytest
import torch

from robofleet.app.orchestration.learner_proc import learner_device, updates_allowed


def test_half_an_update_per_env_step_at_batch_128() -> None:
    # 64 samples per insert at batch 128: 1000 robot rows allow exactly 500 updates.
    assert updates_allowed(499, 64.0, 1000, 128)
    assert not updates_allowed(500, 64.0, 1000, 128)
    assert not updates_allowed(0, 64.0, 0, 128)  # no robot data yet: the learner waits
    assert updates_allowed(0, 64.0, 2, 128)


def test_the_warm_start_is_not_charged_to_the_robots_data() -> None:
    # learner.step - bc_updates is negative while the warm start's updates are replayed.
    assert updates_allowed(-300, 64.0, 2, 128)


def test_the_allowance_grows_with_the_data_whatever_the_fleet() -> None:
    # 8 robots or 1: the same rows allow the same updates (the schedule is per env step).
    allowed = [max(u for u in range(5000) if updates_allowed(u, 64.0, rows, 128)) + 1
               for rows in (200, 400, 800)]  # fmt: skip
    assert allowed == [100, 200, 400]


@pytest.mark.parametrize(("spi", "batch"), [(0.0, 128), (-1.0, 128), (64.0, 0)])
def test_bad_rates_are_refused_by_name(spi: float, batch: int) -> None:
    with pytest.raises(ValueError, match="samples_per_insert"):
        updates_allowed(0, spi, 100, batch)


def test_a_spec_without_gpus_trains_on_the_cpu() -> None:
    assert learner_device(0.0) == torch.device("cpu")


def test_a_gpu_the_node_lacks_is_refused_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="learner.num_gpus is 1"):
        learner_device(1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert learner_device(0.5) == torch.device("cuda")
