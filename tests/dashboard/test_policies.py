"""Policy versions (promote, roll back) and checkpoint downloads."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Checkpoint, Event, PolicyVersion, Run
from robofleet.settings import Settings

Client = Callable[[Role], TestClient]


def _versions(store: MetadataStore) -> dict[int, int]:
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
        s.flush()
        ids = {}
        for v in (1, 2, 3):
            pv = PolicyVersion(run_id="run-a", version=v, learner_step=v * 100, sha256="ab" * 32)
            s.add(pv)
            s.flush()
            ids[v] = pv.id
        return ids


def test_promote_then_roll_back(as_role: Client, store: MetadataStore) -> None:
    ids = _versions(store)
    op = as_role(Role.OPERATOR)
    assert op.post(f"/api/policy-versions/{ids[3]}/promote").json()["promoted"] is True
    assert op.post(f"/api/policy-versions/{ids[1]}/promote").json()["promoted"] is True
    listed = as_role(Role.VIEWER).get("/api/policy-versions?run_id=run-a").json()
    assert {v["version"]: v["promoted"] for v in listed} == {1: True, 2: False, 3: False}
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.run_id == "run-a"))]
    assert kinds == ["policy_version.promoted", "policy_version.rolled_back"]
    assert op.post("/api/policy-versions/999/promote").status_code == 404


def test_checkpoint_download_file_dir_missing_and_outside(
    as_role: Client, store: MetadataStore, settings: Settings, tmp_path: Path
) -> None:
    ckdir = settings.data_dir / "runs" / "run-a" / "checkpoints"
    (ckdir / "step-200").mkdir(parents=True)
    (ckdir / "step-100.safetensors").write_bytes(b"\x00weights")
    (ckdir / "step-200" / "model.safetensors").write_bytes(b"\x01weights")
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
        s.flush()
        rows = [
            Checkpoint(
                run_id="run-a",
                learner_step=100,
                policy_version=1,
                path=str(ckdir / "step-100.safetensors"),
            ),
            Checkpoint(
                run_id="run-a",
                learner_step=200,
                policy_version=2,
                path="runs/run-a/checkpoints/step-200",
            ),
            Checkpoint(
                run_id="run-a", learner_step=300, policy_version=3, path=str(ckdir / "gone")
            ),
            Checkpoint(run_id="run-a", learner_step=400, policy_version=4, path=str(outside)),
        ]
        s.add_all(rows)
        s.flush()
        ids = [c.id for c in rows]
    viewer = as_role(Role.VIEWER)
    assert viewer.get(f"/api/checkpoints/{ids[0]}/download").content == b"\x00weights"
    r = viewer.get(f"/api/checkpoints/{ids[1]}/download")
    assert r.status_code == 200
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        assert z.read("model.safetensors") == b"\x01weights"
    assert viewer.get(f"/api/checkpoints/{ids[2]}/download").status_code == 404
    r = viewer.get(f"/api/checkpoints/{ids[3]}/download")
    assert r.status_code == 403 and b"not yours" not in r.content
    assert viewer.get("/api/checkpoints/12345/download").status_code == 404
    assert len(viewer.get("/api/checkpoints?run_id=run-a").json()) == 4


def test_policy_versions_come_a_page_at_a_time_and_filter(
    as_role: Client, store: MetadataStore
) -> None:
    """A 10-minute demo publishes thousands of versions: the API hands them out a page at a
    time (a cursor, so versions published meanwhile do not shift the pages) with the total."""
    with store.session() as s:
        s.add_all([Run(id="run-a", algorithm="hg-dagger"), Run(id="run-b", algorithm="sac")])
        s.flush()
        s.add_all(
            PolicyVersion(run_id="run-a", version=v, learner_step=v, sha256="ab" * 32)
            for v in range(1, 2721)
        )
        s.add(PolicyVersion(run_id="run-b", version=1, learner_step=1, sha256="cd" * 32))
    viewer = as_role(Role.VIEWER)
    r = viewer.get("/api/policy-versions?run_id=run-a")
    assert r.headers["x-total-count"] == "2720"
    assert [v["version"] for v in r.json()] == list(range(2720, 2620, -1))  # 100, newest first
    seen: list[int] = []
    cursor = ""
    while True:
        page = viewer.get(f"/api/policy-versions?run_id=run-a&limit=1000{cursor}").json()
        if not page:
            break
        seen += [v["version"] for v in page]
        cursor = f"&before_id={page[-1]['id']}"
    assert seen == list(range(2720, 0, -1))
    r = viewer.get("/api/policy-versions?run_id=run-a&min_version=10&max_version=12")
    assert [v["version"] for v in r.json()] == [12, 11, 10] and r.headers["x-total-count"] == "3"
    r = viewer.get("/api/policy-versions?promoted=false&limit=1")
    assert len(r.json()) == 1 and r.headers["x-total-count"] == "2721"
    assert viewer.get("/api/policy-versions?promoted=true").json() == []
    assert viewer.get("/api/policy-versions?limit=1001").status_code == 422
