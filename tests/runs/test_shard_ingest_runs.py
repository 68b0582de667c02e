"""A run with ``buffer.shards: 2`` on a real ``robofleet cloud`` process tree whose robot
computers upload to their shards' own ingest endpoints (shard tickets from the cloud), not to
the cloud's ingest; a shard SIGKILLed mid-upload is restarted by Ray and its robots reconnect
to it through the cloud's routes, with nothing acknowledged lost or stored twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from buffer import ReplayBuffer
from buffer.service.shards import shard_dir, shard_of
from tests.fakes.cloud import RobofleetCloud, store_for
from tests.runs.helpers import (
    SHARDS,
    events,
    ids_apart,
    progress,
    run_dir,
    spec_file,
    start_run,
    stop_and_report,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _stored_once(buffer_dir: Path, k: int) -> dict[str, int]:
    """Robot -> rows in shard ``k`` of a run that is not running, each (robot, seq) once."""
    with ReplayBuffer.open(shard_dir(buffer_dir, k), read_only=True) as buf:
        rows = buf.read_transitions(buf.select(), count=False)
        robots = np.asarray(rows["robot_id"]).astype(str)
        out: dict[str, int] = {}
        for r in sorted(set(robots.tolist())):
            seqs = buf.stored_seqs(r)
            assert len(seqs) == len(np.unique(seqs)), (k, r)  # nothing stored twice
            assert shard_of(r, SHARDS) == k
            out[r] = len(seqs)
        return out


def test_a_two_shard_runs_robots_upload_to_their_shards_and_follow_a_killed_one(
    tmp_path: Path,
) -> None:
    ids_apart(tmp_path)
    cloud = RobofleetCloud(tmp_path, sim_robots=2)
    store = store_for(tmp_path)
    spec = spec_file(tmp_path / "spec.yaml", "shard-ingest", 2, buffer={"shards": SHARDS})
    try:
        run_id = start_run(tmp_path, store, spec, cloud, 40)
        [started] = events(store, run_id, "buffer.shards_started")
        assert len(started["ingest"]) == SHARDS and all(started["ingest"]), started

        # SIGKILL shard 0 while its robot uploads: Ray starts it again with its endpoint; the
        # robot keeps its steps, asks the cloud for the route and resends from its last ack.
        os.kill(int(started["pids"][0]), signal.SIGKILL)
        wait_until(lambda: bool(events(store, run_id, "buffer.shard_restarted")), 90)
        steps = progress(store, run_id)["env_steps"]
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 40, 90, cloud.fail_text)

        report = stop_and_report(tmp_path, store, run_id, cloud)
    finally:
        cloud.stop()

    # Every stored step came through the shards' endpoints: the cloud's ingest stored none of
    # the run's, and the restarted shard's endpoint (its counter starts at 0) stored steps.
    [ingest] = events(store, run_id, "buffer.ingest")
    assert ingest["cloud_rows"] == 0, ingest
    assert len(ingest["shard_rows"]) == SHARDS and all(n > 0 for n in ingest["shard_rows"]), ingest
    # The robots take the shards' ZeroMQ data planes as they take the cloud's.
    assert sum(ingest["shard_data_plane_batches"]) > 0, ingest

    directory = run_dir(store, run_id)
    assert report["acked_lost"] == 0
    homes: dict[str, int] = {}
    for k in range(SHARDS):
        held = _stored_once(directory / "buffer", k)
        assert held, k
        homes.update(dict.fromkeys(held, k))
    assert sorted(homes.values()) == list(range(SHARDS))
