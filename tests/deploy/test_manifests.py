"""Every deploy manifest parses, names real settings, and agrees with the settings' defaults."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

import robofleet
from comms.config import CommsSettings
from dashboard.config import DashboardSettings
from robofleet.settings import Settings

from ._paths import COMPOSE, DEPLOY, GUIDE, K8S, REPO

COMMS = CommsSettings()
DASH = DashboardSettings()
IMAGE_TAG = robofleet.__version__
SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "DATABASE_URL", "CREDENTIAL")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _compose() -> dict[str, Any]:
    return _docs(COMPOSE)[0]


def _k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (p, d)
        for p in sorted(K8S.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in _docs(p)
    ]


def _setting_exists(env_name: str) -> bool:
    """Whether ROBOFLEET_A__B names the field a.b of Settings."""
    parts = env_name.removeprefix("ROBOFLEET_").lower().split("__")
    model: Any = Settings
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


def _check_env(env: dict[str, str], mounted: set[str], where: str) -> None:
    """Secrets only as *_FROM_FILE (POSTGRES_*_FILE) paths into mounted secrets; every
    ROBOFLEET_* key names a setting."""
    for key, value in env.items():
        if key.endswith("_FROM_FILE") or key.startswith("POSTGRES_") and key.endswith("_FILE"):
            assert any(str(value).startswith(m) for m in mounted), (
                f"{where}: {key}={value} is not inside a mounted secret {sorted(mounted)}"
            )
            base = key.removesuffix("_FROM_FILE")
        else:
            assert not any(w in key for w in SECRET_WORDS), (
                f"{where}: {key} looks like a secret given inline; mount it, use {key}_FROM_FILE"
            )
            base = key
        if base.startswith("ROBOFLEET_") and base != "ROBOFLEET_ENROLL_TOKEN":
            assert _setting_exists(base), f"{where}: {base} is not a robofleet setting"


# -- every file parses -------------------------------------------------------------------------


def _json_patches() -> set[Path]:
    """Files a kustomization names as patches (JSON 6902: a list of operations)."""
    out: set[Path] = set()
    for kust in DEPLOY.rglob("kustomization.yaml"):
        for patch in _docs(kust)[0].get("patches", []):
            if "path" in patch:
                out.add((kust.parent / patch["path"]).resolve())
    return out


def test_every_yaml_manifest_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 8
    patches = _json_patches()
    for f in files:
        docs = _docs(f)
        assert docs, f"{f} is empty"
        if f.resolve() in patches:
            assert len(docs) == 1 and isinstance(docs[0], list), f"{f}: not a list of operations"
            assert all(isinstance(op, dict) and {"op", "path"} <= set(op) for op in docs[0]), f
            continue
        assert all(isinstance(d, dict) for d in docs), f"{f}: a document is not a mapping"


# -- compose -----------------------------------------------------------------------------------


def test_compose_has_the_services_and_their_ports_match_the_settings() -> None:
    services = _compose()["services"]
    assert {"postgres", "migrate", "cloud", "dashboard", "relay"} <= set(services)
    robots = [n for n in services if n.startswith("sim-robot-")]
    assert len(robots) >= 2
    data_port = int(services["cloud"]["environment"]["ROBOFLEET_COMMS__DATA_PORT"])
    assert services["cloud"]["ports"] == [
        f"{COMMS.grpc_port}:{COMMS.grpc_port}",
        f"{data_port}:{data_port}",
    ]
    assert services["cloud"]["environment"]["ROBOFLEET_COMMS__GRPC_PORT"] == str(COMMS.grpc_port)
    assert services["dashboard"]["ports"] == [f"{DASH.port}:{DASH.port}"]
    dash_cmd = services["dashboard"]["command"]
    assert dash_cmd[dash_cmd.index("--port") + 1] == str(DASH.port)
    relay = services["relay"]
    assert relay["ports"] == [
        f"{COMMS.relay_port}:{COMMS.relay_port}",
        f"{COMMS.relay_zmq_port}:{COMMS.relay_zmq_port}",
    ]
    cmd = relay["command"]
    assert cmd[cmd.index("--port") + 1] == str(COMMS.relay_port)
    assert cmd[cmd.index("--zmq-port") + 1] == str(COMMS.relay_zmq_port)
    assert cmd[cmd.index("--cloud") + 1] == f"cloud:{COMMS.grpc_port}"
    for name in robots:
        assert f"--server cloud:{COMMS.grpc_port}" in services[name]["command"][-1]
        assert services[name]["profiles"] == ["robots"]
    # The cloud services wait for the schema migration, which waits for a healthy database.
    assert services["migrate"]["command"] == ["robofleet", "db", "upgrade"]
    for name in ("cloud", "dashboard"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_compose_images_are_the_two_dockerfiles_at_the_package_version() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        if name == "postgres":
            assert svc["image"].startswith("postgres:")
            continue
        kind = "edge" if name == "relay" or name.startswith("sim-robot-") else "cloud"
        assert svc["image"] == (
            f"${{ROBOFLEET_REGISTRY:-robofleet}}/robofleet-{kind}:${{ROBOFLEET_TAG:-{IMAGE_TAG}}}"
        ), name
        assert svc["build"]["dockerfile"] == f"deploy/docker/Dockerfile.{kind}"
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()


def test_compose_secrets_are_mounted_files_never_inline() -> None:
    data = _compose()
    declared = data["secrets"]
    for name, spec in declared.items():
        assert set(spec) == {"file"}, f"secret {name} must come from a file"
        assert spec["file"].startswith("./secrets/")
    assert (COMPOSE.parent / ".gitignore").read_text().split() == ["secrets/"]
    for name, svc in data["services"].items():
        mounted = {f"/run/secrets/{s}" for s in svc.get("secrets", [])}
        assert set(svc.get("secrets", [])) <= set(declared), name
        _check_env(svc.get("environment", {}), mounted, f"compose service {name}")
        # Every *_FROM_FILE points at exactly a mounted secret.
        for key, value in svc.get("environment", {}).items():
            if key.endswith("_FROM_FILE"):
                assert value in mounted, f"{name}: {key}={value} is not mounted"


def test_compose_check_helper_rejects_an_inline_secret() -> None:
    with pytest.raises(AssertionError, match="inline"):
        _check_env({"ROBOFLEET_SECRET_KEY": "hunter2"}, set(), "probe")
    with pytest.raises(AssertionError, match="not a robofleet setting"):
        _check_env({"ROBOFLEET_COMMS__GRPC_PROT": "1"}, set(), "probe")


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed here (structure checked above)",
)
def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    out = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "--profile", "robots", "config", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_make_secrets_creates_every_declared_file(tmp_path: Path) -> None:
    script = tmp_path / "compose" / "make-secrets.sh"
    script.parent.mkdir()
    shutil.copy(COMPOSE.parent / "make-secrets.sh", script)
    subprocess.run(["sh", str(script)], check=True, capture_output=True)
    for spec in _compose()["secrets"].values():
        assert (script.parent / spec["file"]).exists(), spec["file"]
    url = (script.parent / "secrets" / "database_url").read_text().strip()
    password = (script.parent / "secrets" / "postgres_password").read_text().strip()
    assert url == f"postgresql+psycopg://robofleet:{password}@postgres:5432/robofleet"
    assert (script.parent / "secrets").stat().st_mode & 0o777 == 0o700


# -- Kubernetes --------------------------------------------------------------------------------


def test_k8s_objects_have_kind_name_and_the_kustomization_lists_them() -> None:
    kust = _docs(K8S / "kustomization.yaml")[0]
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    for path, obj in _k8s_objects():
        assert obj.get("apiVersion") and obj.get("kind"), path
        assert obj["metadata"]["name"], path
        assert obj["kind"] != "Secret", f"{path}: Secrets are generated from files, not committed"


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "RayCluster":
        groups = [obj["spec"]["headGroupSpec"], *obj["spec"]["workerGroupSpecs"]]
        return [c for g in groups for c in g["template"]["spec"]["containers"]]
    spec = obj.get("spec", {})
    if "template" in spec:
        return list(spec["template"]["spec"]["containers"])
    return []


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_k8s_raycluster_has_head_gpu_learner_and_cpu_workers() -> None:
    (rc,) = [o for _, o in _k8s_objects() if o["kind"] == "RayCluster"]
    assert rc["apiVersion"] == "ray.io/v1"
    assert rc["spec"]["rayVersion"] == ray.__version__
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    learner, cpu = groups["learner-gpu"], groups["cpu"]
    (lc,) = learner["template"]["spec"]["containers"]
    assert lc["resources"]["limits"]["nvidia.com/gpu"] == learner["rayStartParams"]["num-gpus"]
    assert (
        "robofleet cloud" in lc["args"][0]
        and "--ray-address robofleet-head-svc:6379" in (lc["args"][0])
    )
    (cc,) = cpu["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cc["resources"]["limits"]
    # Ray token auth on every node, the token from the generated Secret.
    for c in _containers(rc):
        env = _env(c)
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"] == {
            "secretKeyRef": {"name": "robofleet-ray-token", "key": "token"}
        }
    # The cloud's data dir is the runs volume (buffer + checkpoints).
    mounts = {m["name"]: m["mountPath"] for m in lc["volumeMounts"]}
    assert mounts["runs"] == _env(lc)["ROBOFLEET_DATA_DIR"]
    vols = {v["name"]: v for v in learner["template"]["spec"]["volumes"]}
    assert vols["runs"]["persistentVolumeClaim"]["claimName"] == "robofleet-runs"
    assert int(_env(lc)["ROBOFLEET_COMMS__GRPC_PORT"]) == COMMS.grpc_port
    data_port = int(_env(lc)["ROBOFLEET_COMMS__DATA_PORT"])
    assert {p["containerPort"] for p in lc["ports"]} == {COMMS.grpc_port, data_port}


def _k8s_cloud_container() -> dict[str, Any]:
    (rc,) = [o for _, o in _k8s_objects() if o["kind"] == "RayCluster"]
    learner = next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == "learner-gpu")
    (lc,) = learner["template"]["spec"]["containers"]
    return dict(lc)


def test_the_clouds_data_plane_has_one_fixed_port_everywhere_it_is_published() -> None:
    """A random data port (the default, 0) cannot be opened in a Service or a firewall: every
    deployment binding beyond loopback fixes one, and its manifests, Service, compose file,
    image and guide name the same port, beside gRPC's."""
    lc = _k8s_cloud_container()
    env = _env(lc)
    port = int(env["ROBOFLEET_COMMS__DATA_PORT"])
    assert port not in (0, COMMS.grpc_port) and env["ROBOFLEET_COMMS__BIND_HOST"] == "0.0.0.0"
    assert {"name": "data-plane", "containerPort": port} in lc["ports"]
    objs = {(o["kind"], o["metadata"]["name"]): o for _, o in _k8s_objects()}
    service_ports = objs[("Service", "robofleet-grpc")]["spec"]["ports"]
    assert {"name": "data-plane", "port": port, "targetPort": port} in service_ports
    cloud = _compose()["services"]["cloud"]
    assert cloud["environment"]["ROBOFLEET_COMMS__DATA_PORT"] == str(port)
    assert f"{port}:{port}" in cloud["ports"]
    exposed = re.findall(r"^EXPOSE (.+)$", _dockerfile("cloud"), flags=re.M)[0].split()
    assert str(port) in exposed
    # Offers name the bind host (0.0.0.0): robots dial the host they dial for gRPC, so no
    # manifest sets an advertise host a robot elsewhere could not reach.
    assert "ROBOFLEET_COMMS__DATA_ADVERTISE_HOST" not in env
    assert "ROBOFLEET_COMMS__DATA_ADVERTISE_HOST" not in cloud["environment"]
    guide = GUIDE.read_text()
    assert re.search(rf"^\| {port} +\| cloud data plane .*`comms\.data_port`", guide, flags=re.M)


def test_k8s_images_ports_and_services_agree_with_the_settings() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for _, o in _k8s_objects()}
    for (kind, name), obj in objs.items():
        for c in _containers(obj):
            if name == "robofleet-postgres":
                assert c["image"].startswith("postgres:")
            else:
                assert c["image"] == f"robofleet/robofleet-cloud:{IMAGE_TAG}", (kind, name)
    kust = _docs(K8S / "kustomization.yaml")[0]
    assert kust["images"] == [{"name": "robofleet/robofleet-cloud", "newTag": IMAGE_TAG}]
    grpc = objs[("Service", "robofleet-grpc")]
    assert grpc["spec"]["ports"][0]["port"] == COMMS.grpc_port
    assert grpc["spec"]["selector"] == {"robofleet.io/role": "cloud"}
    (rc,) = [o for o in objs.values() if o["kind"] == "RayCluster"]
    learner = next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == "learner-gpu")
    assert learner["template"]["metadata"]["labels"]["robofleet.io/role"] == "cloud"
    dash = objs[("Deployment", "robofleet-dashboard")]
    (dc,) = _containers(dash)
    assert dc["command"][dc["command"].index("--port") + 1] == str(DASH.port)
    assert dc["ports"][0]["containerPort"] == DASH.port
    svc = objs[("Service", "robofleet-dashboard")]
    assert svc["spec"]["ports"][0]["port"] == DASH.port
    assert svc["spec"]["selector"] == dash["spec"]["template"]["metadata"]["labels"]
    pvcs = {n for (k, n) in objs if k == "PersistentVolumeClaim"}
    assert {"robofleet-runs", "robofleet-backups"} <= pvcs
    assert objs[("StatefulSet", "robofleet-postgres")]["spec"]["volumeClaimTemplates"]


def test_k8s_secrets_come_from_generated_or_documented_secrets() -> None:
    kust = _docs(K8S / "kustomization.yaml")[0]
    generated = {g["name"]: g for g in kust["secretGenerator"]}
    for g in generated.values():
        for entry in g["files"]:
            assert entry.split("=", 1)[1].startswith("secrets/"), entry
    assert (K8S / ".gitignore").read_text().split() == ["secrets/"]
    external = {"robofleet-grpc-tls"}  # a kubernetes.io/tls Secret, e.g. from cert-manager
    guide = (REPO / "docs" / "deploy.md").read_text()
    assert all(name in guide for name in external)
    text = "\n".join(p.read_text() for p in K8S.glob("*.yaml"))
    used = set(re.findall(r"secretName: ([\w-]+)", text)) | set(
        re.findall(r"secretKeyRef: \{name: ([\w-]+)", text)
    )
    assert used and used <= set(generated) | external, used
    for path, obj in _k8s_objects():
        for c in _containers(obj):
            mounted = {
                m["mountPath"] + "/"
                for m in c.get("volumeMounts", [])
                if m["mountPath"].startswith("/run/secrets")
            }
            plain = {k: v for k, v in _env(c).items() if isinstance(v, str)}
            _check_env(plain, mounted, f"{path.name}/{c['name']}")


def test_k8s_make_secrets_covers_the_generator(tmp_path: Path) -> None:
    script = tmp_path / "k8s" / "make-secrets.sh"
    script.parent.mkdir()
    shutil.copy(K8S / "make-secrets.sh", script)
    subprocess.run(["sh", str(script)], check=True, capture_output=True)
    kust = _docs(K8S / "kustomization.yaml")[0]
    for g in kust["secretGenerator"]:
        for entry in g["files"]:
            f = script.parent / entry.split("=", 1)[1]
            assert f.is_file() and f.read_text(), entry
            assert f.stat().st_mode & 0o077 == 0, f"{entry} readable by others"


# -- Dockerfiles, entrypoint, systemd, install script ------------------------------------------


def _dockerfile(kind: str) -> str:
    return (DEPLOY / "docker" / f"Dockerfile.{kind}").read_text()


@pytest.mark.parametrize("kind", ["cloud", "edge"])
def test_dockerfiles_copy_only_files_that_exist(kind: str) -> None:
    text = _dockerfile(kind)
    copies = re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M)
    assert copies
    for line in copies:
        *sources, _dest = line.split()
        for src in sources:
            assert (REPO / src).exists(), f"Dockerfile.{kind}: COPY {src} does not exist"
    packages = set(re.findall(r"^COPY (\w+) \./\1$", text, flags=re.M))
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    assert packages == {p.rstrip("*") for p in include}, "every package of the wheel is copied"
    assert 'ENTRYPOINT ["tini", "--", "robofleet-entrypoint"]' in text
    # uv writes no bytecode by default: without it every process compiles torch at start.
    assert re.search(r"^\s+UV_COMPILE_BYTECODE=1 \\$", text, flags=re.M)
    assert not re.search(r"(?i)^(ENV|ARG) .*(SECRET|TOKEN|PASSWORD)", text, flags=re.M)


def test_cloud_image_is_cuda_based_with_the_locked_cloud_extra() -> None:
    text = _dockerfile("cloud")
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-\S+$", text, flags=re.M)
    assert "-r requirements.lock" in text and '".[cloud]"' in text
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, flags=re.M)[0].split()}
    assert {COMMS.grpc_port, DASH.port} <= exposed


def test_edge_image_installs_only_the_edge_and_sim_extras() -> None:
    text = _dockerfile("edge")
    assert "--extra edge --extra sim -c requirements.lock" in text
    assert '".[edge,sim]"' in text
    assert "cloud]" not in text and "-r requirements.lock" not in text
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, flags=re.M)[0].split()}
    assert exposed == {COMMS.relay_port, COMMS.relay_zmq_port}


def test_entrypoint_turns_secret_files_into_settings(tmp_path: Path) -> None:
    secret = tmp_path / "secret_key"
    secret.write_text("s3cr3t-value\n")
    entry = str(DEPLOY / "docker" / "entrypoint.sh")
    out = subprocess.run(
        [
            "sh",
            entry,
            "sh",
            "-c",
            'printf "%s|%s|%s" "$ROBOFLEET_SECRET_KEY" "${ROBOFLEET_SECRET_KEY_FROM_FILE-unset}" "${ROBOFLEET_COMMS__TLS_CERT_FILE-}"',
        ],
        env={
            "PATH": "/usr/bin:/bin",
            "ROBOFLEET_SECRET_KEY_FROM_FILE": str(secret),
            # A setting that itself ends in _FILE is a path and is left as it is.
            "ROBOFLEET_COMMS__TLS_CERT_FILE": "/run/secrets/tls/tls.crt",
        },
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "s3cr3t-value|unset|/run/secrets/tls/tls.crt"
    bad = subprocess.run(
        ["sh", entry, "true"],
        env={
            "PATH": "/usr/bin:/bin",
            "ROBOFLEET_DATABASE_URL_FROM_FILE": str(tmp_path / "missing"),
            # A setting that itself ends in _FILE is a path and is left alone.
            "ROBOFLEET_COMMS__TLS_CERT_FILE": "/run/secrets/tls/tls.crt",
        },
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "ROBOFLEET_DATABASE_URL_FROM_FILE" in bad.stderr and "missing" in bad.stderr


def test_systemd_unit_runs_the_installed_wrapper() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "robofleet-edge.service")
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    svc = unit["Service"]
    assert svc["ExecStart"] == "/opt/robofleet/bin/robofleet-edge-run"
    assert svc["Restart"] == "always" and svc["User"] == "robofleet"
    assert svc["RestartPreventExitStatus"] == "2"  # a refused token: restarting cannot help
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    install = (DEPLOY / "edge" / "install.sh").read_text()
    assert 'deploy/edge/robofleet-edge-run.sh" "$PREFIX/bin/robofleet-edge-run"' in install
    assert "deploy/systemd/robofleet-edge.service" in install
    assert "--extra edge --extra sim -c" in install
    assert install.count("--compile-bytecode") == 2  # both installs write bytecode
    for script in ("install.sh", "robofleet-edge-run.sh"):
        subprocess.run(["sh", "-n", str(DEPLOY / "edge" / script)], check=True)


def test_edge_wrapper_passes_the_token_only_from_its_file(tmp_path: Path) -> None:
    """The ExecStart wrapper builds the `robofleet edge` command line (checked with a stub):
    no run id (the cloud assigns the robot to runs), the robot's options from edge.args one
    per line (a JSON value with spaces stays one argument), the token only from its file."""
    wrapper = (DEPLOY / "edge" / "robofleet-edge-run.sh").read_text()
    stub = tmp_path / "robofleet"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text(wrapper.replace("/opt/robofleet/venv/bin/robofleet", str(stub)))
    token = tmp_path / "enroll_token"
    args = tmp_path / "edge.args"
    env = {
        "PATH": "/usr/bin:/bin",
        "ROBOFLEET_SERVER": "cloud:50051",
        "ROBOFLEET_ROBOT": "arm-7",
        "ROBOFLEET_ENROLL_TOKEN_FILE": str(token),
        "ROBOFLEET_EDGE_ARGS_FILE": str(args),
        "ROBOFLEET_EDGE_ARGS": "--max-steps 200",
    }

    def argv(extra: dict[str, str] | None = None) -> list[str]:
        run = subprocess.run(
            ["sh", str(script)], env={**env, **(extra or {})}, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.splitlines()

    assert argv() == [
        "edge", "--server", "cloud:50051", "--robot", "arm-7", "--max-steps", "200",
    ]  # fmt: skip
    args.write_text(
        "# written by install.sh\n--driver\nlerobot\n--driver-option\n"
        'config={"port": "/dev/ttyACM0", "id": "arm 7"}\n\n--operator\ngamepad'
    )
    token.write_text("one-time-T\n")
    assert argv() == [
        "edge", "--server", "cloud:50051", "--robot", "arm-7", "--token", "one-time-T",
        "--driver", "lerobot", "--driver-option", 'config={"port": "/dev/ttyACM0", "id": "arm 7"}',
        "--operator", "gamepad", "--max-steps", "200",
    ]  # fmt: skip
    assert "--run" not in argv({"ROBOFLEET_RUN": "default"})  # an old edge.env's is ignored
    missing = subprocess.run(
        ["sh", str(script)], env={**env, "ROBOFLEET_ROBOT": ""}, capture_output=True, text=True
    )
    assert missing.returncode != 0 and "ROBOFLEET_ROBOT" in missing.stderr


def test_edge_install_takes_no_run_id(tmp_path: Path) -> None:
    """install.sh refuses a run id (before it needs root), as an option or after "--", and
    writes the robot's own options to edge.args; neither the unit nor the wrapper names a run."""
    install = DEPLOY / "edge" / "install.sh"
    for extra in (["--run", "r1"], ["--", "--driver", "gymnasium", "--run", "r1"]):
        out = subprocess.run(
            ["sh", str(install), "--server", "cloud:50051", "--robot", "arm-7", *extra],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 2 and "run" in out.stderr and "assign" in out.stderr, out.stderr
    text = install.read_text()
    assert "edge.args" in text and "ROBOFLEET_RUN" not in text
    assert "--run" not in (DEPLOY / "systemd" / "robofleet-edge.service").read_text()
    wrapper = (DEPLOY / "edge" / "robofleet-edge-run.sh").read_text()
    assert 'set -- --server "$ROBOFLEET_SERVER" --robot "$ROBOFLEET_ROBOT"\n' in wrapper
