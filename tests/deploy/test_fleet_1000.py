"""The 1,000-robot KubeRay layout (deploy/k8s-fleet-1000, docs/deploy.md "A 1,000-robot fleet
on KubeRay"): the overlay rendered over the base as kustomize applies it, checked like the base
(settings names, secrets by file, image tags, resources, ports), and the guide's sizing checked
against the manifests and the run spec, so neither can change without the other."""

from __future__ import annotations

import copy
import math
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from buffer.service.shard_actor import NODE_HOST
from buffer.service.shards import shard_of
from comms.cloud.shard_ports import PortRangeTooSmall, check_range, ports_per_shard
from comms.config import CommsSettings
from foundation.runspec import RunSpec, parse_run_spec

from ._paths import DEPLOY, GUIDE, K8S
from .test_manifests import (
    IMAGE_TAG,
    _check_env,
    _containers,
    _docs,
    _env,
    _k8s_objects,
    _setting_exists,
)

OVERLAY = DEPLOY / "k8s-fleet-1000"
SITE = OVERLAY / "site-relay"
COMMS = CommsSettings()
# What docs/deploy.md plans a shard's process for: the robots one cloud process served with
# ack p99 under 100 ms in both runs of docs/benchmarks.md "## fleet", camera and state alike.
ROBOTS_PER_SHARD = 64
# Secrets the operator creates (TLS from cert-manager or by hand), named in the guide.
EXTERNAL = {"robofleet-grpc-tls", "robofleet-relay-tls", "robofleet-cloud-ca"}
GIB = 1024**3
GROUP_KEY = "robofleet/buffer"


# -- rendering ----------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def apply_json6902(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with the JSON 6902 operations ``ops`` applied (add, replace, test: what the
    overlay uses); a failed ``test`` raises AssertionError, as kustomize refuses it."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        kind = op["op"]
        if kind == "test":
            got = node[int(last)] if isinstance(node, list) else node[last]
            assert got == op["value"], f"{op['path']} is {got!r}, the patch expects {op['value']!r}"
        elif kind == "add" and isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
        elif kind in ("add", "replace"):
            if isinstance(node, list):
                node[int(last)] = copy.deepcopy(op["value"])
            else:
                assert kind == "add" or last in node, f"replace of a missing {op['path']}"
                node[last] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"operation {kind} is not used by the overlay")
    return out


def _kustomization(directory: Path) -> dict[str, Any]:
    return _docs(directory / "kustomization.yaml")[0]


def _rendered() -> dict[tuple[str, str], dict[str, Any]]:
    """The base's objects with the overlay's patches applied, by (kind, name)."""
    kust = _kustomization(OVERLAY)
    objs = {(o["kind"], o["metadata"]["name"]): o for _, o in _k8s_objects()}
    for patch in kust["patches"]:
        target = patch["target"]
        key = (target["kind"], target["name"])
        assert key in objs, f"patch target {key} is not in the base"
        obj = objs[key]
        assert obj["apiVersion"] == "/".join(
            p for p in (target.get("group"), target["version"]) if p
        ), key
        (ops,) = _docs(OVERLAY / patch["path"])
        objs[key] = apply_json6902(obj, ops)
    return objs


def _groups(objs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rc = objs[("RayCluster", "robofleet")]
    return {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}


def _ray_resources(group: dict[str, Any]) -> dict[str, float]:
    """The custom resources a group's ``rayStartParams.resources`` advertises."""
    raw = group["rayStartParams"].get("resources")
    return {} if raw is None else yaml.safe_load(yaml.safe_load(raw))


def _spec() -> RunSpec:
    return parse_run_spec(_docs(OVERLAY / "run-fleet-1000.yaml")[0])


def _quantity(text: str) -> float:
    """A Kubernetes quantity (``16``, ``500m``, ``100Gi``, ``20Ti``) as a number."""
    units = {"m": 1e-3, "Ki": 1024, "Mi": 1024**2, "Gi": GIB, "Ti": 1024**4}
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    assert m, text
    return float(m.group(1)) * units.get(m.group(2), 1)


def _section() -> str:
    text = GUIDE.read_text()
    start = text.index("## A 1,000-robot fleet on KubeRay")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _busiest_shard(robots: int, shards: int) -> int:
    """Most robots in one shard when robots 1..``robots`` (their metadata ids) hash to shards."""
    return max(Counter(shard_of(r, shards) for r in range(1, robots + 1)).values())


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_kubectl_kustomize_renders_what_the_suite_checks(tmp_path: Path) -> None:
    """kustomize's own rendering of the overlay (secrets from stand-in files) holds the same
    RayCluster and runs volume as the suite's rendering."""
    root = tmp_path / "deploy"
    shutil.copytree(K8S, root / "k8s")
    shutil.copytree(OVERLAY, root / OVERLAY.name)
    kust = _kustomization(K8S)
    for g in kust["secretGenerator"]:
        for entry in g["files"]:
            f = root / "k8s" / entry.split("=", 1)[1]
            f.parent.mkdir(exist_ok=True)
            f.write_text("stand-in")
    out = subprocess.run(
        ["kubectl", "kustomize", str(root / OVERLAY.name)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}
    ours = _rendered()
    for key in (("RayCluster", "robofleet"), ("PersistentVolumeClaim", "robofleet-runs")):
        assert built[key]["spec"] == ours[key]["spec"], key
        assert built[key]["metadata"]["namespace"] == kust["namespace"]
    site = subprocess.run(["kubectl", "kustomize", str(SITE)], capture_output=True, text=True)
    assert site.returncode == 0, site.stderr


# -- the overlay, checked as the base is ---------------------------------------------------------


def test_the_overlay_is_the_base_plus_its_patches_and_names_every_file() -> None:
    kust = _kustomization(OVERLAY)
    assert kust["resources"] == ["../k8s"]
    assert "namespace" not in kust and "images" not in kust  # the base's, unchanged
    patched = {p["path"] for p in kust["patches"]}
    on_disk = {p.name for p in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == patched | {"run-fleet-1000.yaml"}
    site = _kustomization(SITE)
    assert set(site["resources"]) == {p.name for p in SITE.glob("*.yaml")} - {"kustomization.yaml"}


def test_every_rendered_container_names_settings_mounts_secrets_and_sets_resources() -> None:
    objs = {**_rendered(), **{(o["kind"], o["metadata"]["name"]): o for o in _site_objects()}}
    kust = _kustomization(K8S)
    generated = {g["name"] for g in kust["secretGenerator"]}
    guide = GUIDE.read_text()
    for (kind, name), obj in objs.items():
        text = yaml.safe_dump(obj)
        used = set(re.findall(r"secretName: ([\w-]+)", text))
        used |= {
            ref["secretKeyRef"]["name"]
            for c in _containers(obj)
            for ref in _env(c).values()
            if isinstance(ref, dict) and "secretKeyRef" in ref
        }
        assert used <= generated | EXTERNAL, (kind, name, used)
        for c in _containers(obj):
            where = f"{kind}/{name}/{c['name']}"
            if name == "robofleet-postgres":
                continue
            mounted = {
                m["mountPath"] + "/"
                for m in c.get("volumeMounts", [])
                if m["mountPath"].startswith("/run/secrets")
            }
            plain = {k: v for k, v in _env(c).items() if isinstance(v, str)}
            _check_env(plain, mounted, where)
            image = "robofleet-edge" if name == "robofleet-relay" else "robofleet-cloud"
            assert c["image"] == f"robofleet/{image}:{IMAGE_TAG}", where
            if kind in ("RayCluster", "Deployment"):  # every node and the relay are sized
                for side in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][side]), where
            for key, ref in _env(c).items():
                if isinstance(ref, dict) and "configMapKeyRef" in ref:
                    assert _setting_exists(key), f"{where}: {key} is not a robofleet setting"
    assert all(name in guide for name in EXTERNAL)


def test_the_buffer_group_holds_the_shards_where_the_cloud_places_them() -> None:
    objs = _rendered()
    groups = _groups(objs)
    assert list(groups) == ["learner-gpu", "cpu", "buffer"]
    cloud = groups["learner-gpu"]
    (cc,) = cloud["template"]["spec"]["containers"]
    env = _env(cc)
    buffer = groups["buffer"]
    (bc,) = buffer["template"]["spec"]["containers"]
    # Shards go only to nodes advertising the resource the cloud asks for, which take no CPU
    # work; and their batch servers listen on the node's IP for the learner's node.
    assert env["ROBOFLEET_BUFFER__SHARD_RESOURCE"] == GROUP_KEY
    assert set(_ray_resources(buffer)) == {GROUP_KEY}
    assert GROUP_KEY not in _ray_resources(cloud) | _ray_resources(groups["cpu"])
    assert buffer["rayStartParams"]["num-cpus"] == "0"
    assert env["ROBOFLEET_BUFFER__SHARD_BATCH_HOST"] == NODE_HOST
    # Host network, one buffer pod a node: the endpoint binds the node's own address.
    pod = buffer["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (anti,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == buffer["template"]["metadata"]["labels"]
    assert buffer["replicas"] == buffer["minReplicas"] == buffer["maxReplicas"]
    # Shards get the cloud's paths: the runs volume and the TLS files at the same places.
    cloud_mounts = {m["name"]: m["mountPath"] for m in cc["volumeMounts"]}
    mounts = {m["name"]: m["mountPath"] for m in bc["volumeMounts"]}
    assert mounts["runs"] == cloud_mounts["runs"] == env["ROBOFLEET_DATA_DIR"]
    assert str(Path(env["ROBOFLEET_COMMS__TLS_CERT_FILE"]).parent) == mounts["tls"]
    assert str(Path(env["ROBOFLEET_COMMS__TLS_KEY_FILE"]).parent) == mounts["tls"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "robofleet-runs"
    assert volumes["tls"]["secret"]["secretName"] == "robofleet-grpc-tls"
    assert _env(bc)["RAY_AUTH_TOKEN"] == {
        "secretKeyRef": {"name": "robofleet-ray-token", "key": "token"}
    }
    # Settings the overlay gives the cloud are valid values of their settings.
    first = int(env["ROBOFLEET_COMMS__SHARD_INGEST_PORT"])
    count = int(env["ROBOFLEET_COMMS__SHARD_INGEST_PORTS"])
    CommsSettings(shard_ingest_port=first, shard_ingest_ports=count)
    assert COMMS.grpc_port not in range(first, first + count)


def test_the_runs_volume_is_shared_and_holds_the_retention() -> None:
    objs = _rendered()
    pvc = objs[("PersistentVolumeClaim", "robofleet-runs")]["spec"]
    assert pvc["accessModes"] == ["ReadWriteMany"]
    assert pvc["storageClassName"] in _section()
    (cc,) = _groups(objs)["learner-gpu"]["template"]["spec"]["containers"]
    retention = int(_env(cc)["ROBOFLEET_BUFFER__RETENTION_MAX_BYTES"])
    assert retention < _quantity(pvc["resources"]["requests"]["storage"])


# -- the guide's sizing against the manifests ---------------------------------------------------


def test_the_sizing_in_the_guide_matches_the_manifests_and_the_run_spec() -> None:
    objs = _rendered()
    groups = _groups(objs)
    spec = _spec()
    section = _section()
    shards, robots = spec.buffer.shards, spec.robots.count
    buffer = groups["buffer"]
    nodes = buffer["replicas"]
    slots = int(_ray_resources(buffer)[GROUP_KEY])
    busiest = _busiest_shard(robots, shards)

    # Enough shards that the busiest holds no more robots than one process was measured with.
    assert robots == 1000
    assert busiest <= ROBOTS_PER_SHARD < _busiest_shard(robots, 16)
    assert f"`buffer.shards: {shards}`" in section
    assert f"busiest shard holds {busiest}" in section
    for n in (16, 20, 24):
        assert f"| {n} | {_busiest_shard(robots, n)} |" in section, n
    # The shards fit the buffer nodes with one node lost.
    assert (nodes - 1) * slots >= shards
    assert f"{nodes} buffer nodes" in section and f"{GROUP_KEY}: {slots}" in section
    # Each node's pod covers its shards' memory: the run's budget split per shard, plus room.
    (bc,) = buffer["template"]["spec"]["containers"]
    per_shard = spec.buffer.memory_budget_bytes / shards  # type: ignore[operator]
    assert per_shard == 8 * GIB
    assert slots * per_shard * 2 <= _quantity(bc["resources"]["requests"]["memory"])
    assert slots <= _quantity(bc["resources"]["requests"]["cpu"]) / 2
    # The port range holds both ports (gRPC, data plane) of every shard a node can hold.
    (cc,) = groups["learner-gpu"]["template"]["spec"]["containers"]
    env = _env(cc)
    first = int(env["ROBOFLEET_COMMS__SHARD_INGEST_PORT"])
    last = first + int(env["ROBOFLEET_COMMS__SHARD_INGEST_PORTS"]) - 1
    ranged = CommsSettings(shard_ingest_port=first, shard_ingest_ports=last - first + 1)
    assert ranged.data_plane and ports_per_shard(ranged) == 2
    check_range(ranged, slots)
    with pytest.raises(PortRangeTooSmall):
        check_range(ranged, (last - first + 1) // 2 + 1)
    assert f"{first}-{last}" in section
    assert f"six shard slots take {slots} x 2 = {slots * 2} ports" in section
    assert (last - first + 1) // (slots * 2) == 5
    assert "the range holds five\nruns of this size at once on a node" in section
    # The learner's GPU is the learner node's.
    (lc,) = groups["learner-gpu"]["template"]["spec"]["containers"]
    gpus = int(groups["learner-gpu"]["rayStartParams"]["num-gpus"])
    assert 0 < spec.learner.num_gpus <= gpus == int(lc["resources"]["limits"]["nvidia.com/gpu"])
    assert f"`learner.num_gpus: {spec.learner.num_gpus:g}`" in section
    # The commands the guide gives.
    assert "kubectl apply -k deploy/k8s-fleet-1000\n" in section
    assert "kubectl apply -k deploy/k8s-fleet-1000/site-relay\n" in section
    assert "deploy/k8s-fleet-1000/run-fleet-1000.yaml" in section
    assert "(#a-1000-robot-fleet-on-kuberay)" in GUIDE.read_text()


def test_the_guides_arithmetic_adds_up() -> None:
    """Every ``a x b = c`` the section shows, recomputed (to its last shown digit)."""
    section = _section().replace(",", "")
    num = r"(\d+(?:\.\d+)?)"
    found = re.findall(rf"{num} x {num} = {num}", section)
    assert len(found) >= 5
    for a, b, c in found:
        decimals = len(c.split(".")[1]) if "." in c else 0
        assert round(float(a) * float(b), decimals) == pytest.approx(float(c)), (a, b, c)
    assert math.ceil(1000 / ROBOTS_PER_SHARD) == 16


# -- the site relay -----------------------------------------------------------------------------


def _site_objects() -> list[dict[str, Any]]:
    return [
        d for p in sorted(SITE.glob("*.yaml")) if p.name != "kustomization.yaml" for d in _docs(p)
    ]


def test_the_site_relay_serves_the_settings_ports_with_tls() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in _site_objects()}
    deploy = objs[("Deployment", "robofleet-relay")]
    assert deploy["spec"]["replicas"] == 1
    (c,) = _containers(deploy)
    cmd = c["command"]
    assert cmd[:3] == ["robofleet-entrypoint", "robofleet", "relay"]
    assert cmd[cmd.index("--port") + 1] == str(COMMS.relay_port)
    assert cmd[cmd.index("--zmq-port") + 1] == str(COMMS.relay_zmq_port)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": COMMS.relay_port, "fanout": COMMS.relay_zmq_port}
    svc = objs[("Service", "robofleet-relay")]
    assert {p["port"] for p in svc["spec"]["ports"]} == set(ports.values())
    assert svc["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    env = _env(c)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert str(Path(env["ROBOFLEET_COMMS__TLS_CERT_FILE"]).parent) == mounts["tls"]
    ca = Path(cmd[cmd.index("--cloud-ca") + 1])
    assert str(ca.parent) == mounts["cloud-ca"]
    # The guide creates the Secrets the relay mounts, with the key it reads.
    section = _section()
    assert f"secret generic robofleet-cloud-ca --from-file={ca.name}=" in section
    assert "secret tls robofleet-relay-tls" in section
    ref = env["ROBOFLEET_COMMS__CLOUD_ADDRESS"]["configMapKeyRef"]
    kust = _kustomization(SITE)
    (generated,) = kust["configMapGenerator"]
    literals = dict(x.split("=", 1) for x in generated["literals"])
    assert ref["name"] == generated["name"] and ref["key"] in literals
    assert literals["cloud_address"].endswith(f":{COMMS.grpc_port}")
    assert kust["images"] == [{"name": "robofleet/robofleet-edge", "newTag": IMAGE_TAG}]
