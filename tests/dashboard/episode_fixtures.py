"""A run with a real buffer for the episode viewer's tests: two robots' episodes, one with an
intervention segment, a help request, a camera, and a first episode retention partly deleted."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from buffer import ReplayBuffer
from foundation.store.help_requests import HelpRequest
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Run
from tests.buffer.helpers import IMAGE, open_buffer, step
from tests.dashboard.helpers import add_robot

RUN = "run-view"
SMALL = {"segment_target_bytes": 1300, "retention_max_bytes": 16000}
FIRST_LEN = 30  # robot a's episode 0: retention deletes its first steps


def _episode(robot: int, seq0: int, ep: int, n: int, takeover: range = range(0)) -> list[Any]:
    out = []
    for f in range(n):
        rec = step(robot, seq0 + f, ep, f, terminated=f == n - 1, intervention=f in takeover)
        rec["robot_id"], rec["run_id"] = str(robot), RUN
        out.append(rec)
    return out


def make_run(store: MetadataStore, root: Path, *, keep_open: bool = False) -> dict[str, Any]:
    """The run ``run-view`` under ``root``; returns the robots' ids, and the buffer when
    ``keep_open`` (the caller closes it)."""
    a, b = add_robot(store, "arm-a"), add_robot(store, "arm-b")
    run_dir = root / RUN
    with store.session() as s:
        s.add(Run(id=RUN, algorithm="hg-dagger", run_dir=str(run_dir)))
        s.add(
            HelpRequest(
                run_id=RUN,
                robot_id=b,
                key="b:0:2",
                episode_index=0,
                step=2,
                risk=0.8,
                timeout_s=30.0,
                requested_at=datetime.now(UTC),
                outcome="took_over",
            )
        )
    buf = open_buffer(run_dir / "buffer", **SMALL)
    first = _episode(a, 0, 0, FIRST_LEN)
    for i in range(0, FIRST_LEN, 10):  # a segment each: retention deletes the oldest
        buf.append(first[i : i + 10])
    buf.append(_episode(b, 0, 0, 10, takeover=range(3, 6)))
    buf.append(_episode(a, FIRST_LEN, 1, 10))
    buf.append(_episode(b, 10, 1, 10))
    buf.flush()
    out: dict[str, Any] = {"a": a, "b": b, "image": IMAGE}
    if keep_open:
        out["buffer"] = buf
    else:
        buf.close()
    return out


class Sinks:
    """The cloud's ``run_sink`` over one live buffer (``comms.cloud.server.CloudServer``)."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        from comms.cloud.replay_buffer_sink import ReplayBufferSink

        self.sink = ReplayBufferSink(buffer)

    def run_sink(self, run_id: str) -> Any:
        return self.sink if run_id == RUN else None

    def push_control(self, robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        return False
