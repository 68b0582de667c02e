"""Ground-truth success against wall time, one line per run: the figure of the learning benches
(``bench rewards``, ``bench operators``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def save_success_figure(
    curves: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], path: Path, title: str
) -> None:
    """Write a PNG at ``path`` (its directory made): for each ``(label, history)``, the
    history's ``success_mean`` (0..1) against its ``wall_s`` (seconds since the run started),
    history being a run's ``evals.jsonl`` rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, history in curves:
        ax.plot([e["wall_s"] for e in history], [e["success_mean"] for e in history],
                marker=".", label=label)  # fmt: skip
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("ground-truth success (policy alone, simulator)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
