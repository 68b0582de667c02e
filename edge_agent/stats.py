"""The control loop's accounting: counters and recent step timings, reported in heartbeats."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoopStats:
    """Control-loop accounting (latencies in seconds, last ``window`` steps)."""

    window: int = 20_000
    steps: int = 0
    overruns: int = 0
    episodes: int = 0
    interventions: int = 0
    demonstrations: int = 0
    discarded_episodes: int = 0
    weight_swaps: int = 0
    weight_errors: int = 0
    version_lag_sum: int = 0  # sum over steps of (received - applied) versions at act time
    version_lag_max: int = 0
    stale_steps: int = 0  # steps acted with a newer version already received
    apply_delay_sum: float = 0.0  # seconds received versions waited for their boundary
    apply_delay_max: float = 0.0
    hold_s: float = 0.0  # seconds held by a cloud e-stop or pause
    weights_wait_s: float = 0.0  # seconds waited for the first policy version
    labels: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})
    proposals: int = 0  # successes a reward classifier proposed
    overrules: int = 0  # of those, the ones the operator overruled
    latencies: deque[float] = field(default_factory=deque)
    periods: deque[float] = field(default_factory=deque)

    def record(self, latency: float, period: float | None) -> None:
        self.steps += 1
        self.latencies.append(latency)
        if len(self.latencies) > self.window:
            self.latencies.popleft()
        if period is not None:
            self.periods.append(period)
            if len(self.periods) > self.window:
                self.periods.popleft()

    def counters(self) -> dict[str, float]:
        """The counters and per-step means a heartbeat reports (floats)."""
        return {
            "steps": float(self.steps),
            "overruns": float(self.overruns),
            "episodes": float(self.episodes),
            "interventions": float(self.interventions),
            "demonstrations": float(self.demonstrations),
            "discarded_episodes": float(self.discarded_episodes),
            "weight_swaps": float(self.weight_swaps),
            "weight_errors": float(self.weight_errors),
            "version_lag_mean": self.version_lag_sum / self.steps if self.steps else 0.0,
            "version_lag_max": float(self.version_lag_max),
            "stale_steps": float(self.stale_steps),
            "apply_delay_mean_s": (
                self.apply_delay_sum / self.weight_swaps if self.weight_swaps else 0.0
            ),
            "apply_delay_max_s": self.apply_delay_max,
            "hold_s": self.hold_s,
            "weights_wait_s": self.weights_wait_s,
            "reward_proposals": float(self.proposals),
            "reward_overrules": float(self.overrules),
        }

    def percentiles_ms(self) -> dict[str, float]:
        lat = np.asarray(self.latencies, np.float64) * 1e3
        per = np.asarray(self.periods, np.float64)
        out = {
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else 0.0,
            "latency_p99_ms": float(np.percentile(lat, 99)) if lat.size else 0.0,
            "latency_max_ms": float(lat.max()) if lat.size else 0.0,
            "loop_hz": float(1.0 / per.mean()) if per.size else 0.0,
            "period_p99_ms": float(np.percentile(per, 99) * 1e3) if per.size else 0.0,
        }
        return out
