"""The episode viewer's API over a real run buffer: the list, one episode's traces and
segments, a frame as PNG, a retention-deleted episode, labels stored as marks and audited."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from sqlalchemy import select

from buffer import ReplayBuffer
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event
from tests.buffer.helpers import episodes
from tests.dashboard.conftest import login
from tests.dashboard.episode_fixtures import FIRST_LEN, RUN, Sinks, make_run


def _app(settings, store, control=None):  # type: ignore[no-untyped-def]
    from dashboard.app import create_app
    from runs.episode_view import RunEpisodes
    from runs.manager import QueuedRunManager

    manager = QueuedRunManager(store, settings.data_dir)
    return create_app(settings, store, manager, control, episodes=RunEpisodes(control))


def test_list_episode_frame_and_label_from_the_directory(
    settings, store: MetadataStore, tmp_path: Path
) -> None:
    run = make_run(store, tmp_path)
    a, b = str(run["a"]), str(run["b"])
    app = _app(settings, store)
    viewer, op = login(app, Role.VIEWER.value), login(app, Role.OPERATOR.value)
    base = f"/api/runs/{RUN}/episodes"

    r = viewer.get(base, params={"limit": 3})
    assert r.status_code == 200 and r.headers["X-Total-Count"] == "4"
    listed = r.json()
    assert [(e["robot"], e["episode_index"]) for e in listed] == [
        ("arm-b", 1),
        ("arm-a", 1),
        ("arm-b", 0),
    ]
    assert listed[2]["interventions"] == 3 and listed[2]["help_requests"] == 1
    oldest = viewer.get(base, params={"offset": 3}).json()[0]
    assert oldest["robot_id"] == a and 0 < oldest["deleted_steps"] < FIRST_LEN
    assert oldest["steps"] + oldest["deleted_steps"] == FIRST_LEN

    one = viewer.get(f"{base}/{b}/0").json()
    assert one["intervention_segments"] == [[3, 5]]
    assert (
        one["help_requests"][0]["step"] == 2 and one["help_requests"][0]["outcome"] == "took_over"
    )
    assert len(one["state"]) == 10 and len(one["state"][0]) == 3 and len(one["action"][0]) == 2
    assert one["state"][4][0] == float(run["b"] * 100_000 + 4)  # tests.buffer.helpers.obs_value
    assert one["cameras"] == ["observation.images.front"] and one["deleted_steps"] == 0
    png = viewer.get(f"{base}/{b}/0/frames/4", params={"camera": "observation.images.front"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    pixels = np.asarray(Image.open(io.BytesIO(png.content)))
    assert pixels.shape == run["image"] and (pixels == 4).all()  # seq 4 % 251

    partial = viewer.get(f"{base}/{a}/0").json()
    assert partial["deleted_steps"] == oldest["deleted_steps"] and "retention" in partial["note"]
    assert partial["frame_index"][0] == partial["deleted_steps"]
    assert viewer.get(f"{base}/{a}/7").status_code == 404
    gone = viewer.get(f"{base}/{a}/0/frames/0", params={"camera": "observation.images.front"})
    assert gone.status_code == 404

    # Labels: operators only, stored as a mark with the person as its reason, audited.
    assert viewer.post(f"{base}/{b}/0/label", json={"label": "success"}).status_code == 403
    r = op.post(f"{base}/{b}/0/label", json={"label": "failure"})
    assert r.status_code == 200, r.text
    assert viewer.get(base).json()[2]["label"] == "failure"
    assert viewer.get(base).json()[2]["label_by"] == "cloud: user:operator"
    assert op.post(f"{base}/{b}/1/label", json={"label": "discard"}).status_code == 200
    assert op.post(f"{base}/{b}/1/label", json={"label": "success"}).status_code == 409
    assert op.post(f"{base}/{b}/1/label", json={"label": "meh"}).status_code == 422
    with ReplayBuffer.open(tmp_path / RUN / "buffer", read_only=True) as buf:
        assert buf.index.outcomes[(RUN, b, 0)] == "failure"
        assert buf.index.outcome_by[(RUN, b, 0)] == "cloud: user:operator"
        assert buf.index.discards[(RUN, b, 1)] == "discard"
    with store.session() as s:
        labels = s.scalars(select(Event).where(Event.kind == "episode.labelled")).all()
        assert [(e.actor, e.data["label"]) for e in labels] == [
            ("user:operator", "failure"),
            ("user:operator", "discard"),
        ]
    anon = login(app, Role.VIEWER.value)
    anon.cookies.clear()
    assert anon.get(base).status_code == 401
    assert anon.post(f"{base}/{b}/0/label", json={"label": "success"}).status_code == 401


def test_live_buffer_read_and_labelled_through_the_runs_sink(
    settings, store: MetadataStore, tmp_path: Path
) -> None:
    run = make_run(store, tmp_path, keep_open=True)
    buf: ReplayBuffer = run["buffer"]
    b = str(run["b"])
    try:
        # Another process (here: a second handle) holding the directory: labels are refused.
        held = login(_app(settings, store), Role.OPERATOR.value)
        r = held.post(f"/api/runs/{RUN}/episodes/{b}/0/label", json={"label": "success"})
        assert r.status_code == 409 and "another process" in r.text
        op = login(_app(settings, store, Sinks(buf)), Role.OPERATOR.value)
        buf.append(  # a step written while the run goes on is seen at once
            [
                {**rec, "robot_id": b, "run_id": RUN}
                for rec in episodes(run["b"], [4], seq0=20, ep0=2)
            ]
        )
        assert op.get(f"/api/runs/{RUN}/episodes").json()[0]["episode_index"] == 2
        r = op.post(f"/api/runs/{RUN}/episodes/{b}/0/label", json={"label": "success"})
        assert r.status_code == 200 and buf.index.outcomes[(RUN, b, 0)] == "success"
        assert buf.index.outcome_by[(RUN, b, 0)] == "cloud: user:operator"
    finally:
        buf.close()


def test_a_sharded_runs_episodes_come_from_every_shard(tmp_path: Path) -> None:
    from buffer.service.shards import ShardedBuffer, shard_of
    from runs.episode_view import RunEpisodes
    from tests.buffer.helpers import small_schema

    robots = ["3", "4"]  # CRC-32 puts them in different shards of two
    assert shard_of(robots[0], 2) != shard_of(robots[1], 2)
    with ShardedBuffer.open(tmp_path / "buffer", small_schema(), shards=2) as sharded:
        for r in robots:
            steps = episodes(int(r), [5], truncate_every=9, run=RUN)
            sharded.append([{**rec, "robot_id": r} for rec in steps])
        sharded.flush()
    source = RunEpisodes()
    listed = source.episodes(RUN, str(tmp_path))
    assert sorted(e["robot_id"] for e in listed) == robots and listed[0]["steps"] == 5
    assert source.label(RUN, str(tmp_path), "4", 0, "success", "cloud: user:operator") == 5
    relisted = {e["robot_id"]: e["label"] for e in source.episodes(RUN, str(tmp_path))}
    assert relisted == {"3": "", "4": "success"}
