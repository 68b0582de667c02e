"""The learner process's placement: the device a spec's ``learner.num_gpus`` asks for. Its
pacing (samples per insert, sampling side) is ``buffer.RateLimiter``'s: tests/buffer/
test_rate_limiter.py."""

from __future__ import annotations

import pytest
import torch

from robofleet.app.orchestration.learner_proc import learner_device


def test_a_spec_without_gpus_trains_on_the_cpu() -> None:
    assert learner_device(0.0) == torch.device("cpu")


def test_a_gpu_the_node_lacks_is_refused_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="learner.num_gpus is 1"):
        learner_device(1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert learner_device(0.5) == torch.device("cuda")
