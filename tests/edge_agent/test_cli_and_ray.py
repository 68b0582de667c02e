"""`robofleet edge` as a real process against a real cloud, and the same agent as a Ray actor."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import timedelta

import pytest

from comms.cloud.step_sink import MemorySink
from tests.fakes.cloud import ROBOFLEET, RUN, Cloud, free_port
from tests.fakes.procs import REPO, Child, wait_until


def robofleet(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ROBOFLEET, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_robofleet_edge_enrolls_runs_and_uploads(tmp_path, db):
    _url, store = db
    sink = MemorySink()
    cloud = Cloud(store, sink)
    try:
        token = store.create_enrollment_token(timedelta(minutes=5))
        config = tmp_path / "edge.yaml"
        config.write_text(
            "edge:\n  control_hz: 50\n  batch_max_steps: 5\n  wait_for_first_weights: false\n"
            "comms:\n  reconnect_initial_s: 0.05\n  reconnect_max_s: 0.3\n"
        )
        spool = tmp_path / "spool"
        proc = robofleet(
            "--config", str(config), "edge",
            "--server", cloud.address, f"--token={token}", "--robot", "cli-robot",
            "--run", RUN, "--episodes", "1", "--max-steps", "20",
            "--spool-dir", str(spool), "--report",
        )  # fmt: skip
        cred = spool / "credential.json"
        end = time.monotonic() + 60
        while not cred.exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.05)
        store.lease_robots(RUN, [json.loads(cred.read_text())["robot_id"]])
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["steps"] == 20 and report["episodes"] == 1
        assert report["acked_seq"] == 19
        seqs = [s for _rid, b in sink.batches for s in b.column("seq").to_pylist()]
        assert seqs == list(range(20))
        # a second start reuses the stored credential (the token is spent)
        proc = robofleet(
            "--config", str(config), "edge", "--server", cloud.address, "--robot", "cli-robot",
            "--run", RUN, "--episodes", "1", "--max-steps", "5", "--spool-dir", str(spool),
        )  # fmt: skip
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        seqs = [s for _rid, b in sink.batches for s in b.column("seq").to_pylist()]
        assert seqs == list(range(25))
    finally:
        cloud.close()


def test_robofleet_edge_without_credential_or_token_says_so(tmp_path):
    proc = robofleet(
        "edge", "--server", "127.0.0.1:9", "--robot", "nobody", "--spool-dir", str(tmp_path),
    )  # fmt: skip
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "no credential" in err and "--token" in err


# A light robot for the first-contact tests: no Meta-World import, no scripted expert.
PENDULUM = ("--driver", "gymnasium", "--driver-option", "env_id=Pendulum-v1", "--operator", "none")
FAST_RECONNECT = "comms:\n  reconnect_initial_s: 0.1\n  reconnect_max_s: 0.4\n"


@pytest.mark.parametrize("fixed_run", [False, True], ids=["robot-computer", "fixed-run"])
def test_robofleet_edge_with_a_refused_token_says_so_in_one_line(tmp_path, db, fixed_run):
    _url, store = db
    with Cloud(store) as cloud:
        run = ["--run", RUN, "--episodes", "1"] if fixed_run else []
        proc = robofleet(
            "edge", "--server", cloud.address, "--token", "not-a-token", "--robot", "refused",
            "--spool-dir", str(tmp_path / "spool"), *PENDULUM, *run,
        )  # fmt: skip
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "_InactiveRpcError" not in err, err
    said = [line for line in err.splitlines() if line.startswith("robofleet edge:")]
    assert len(said) == 1, err
    assert "refused the enrollment token" in said[0] and "--token" in said[0], said
    assert "robofleet robots enroll refused" in said[0]
    assert not (tmp_path / "spool" / "credential.json").exists()


def test_robofleet_edge_waits_for_an_unreachable_cloud_then_enrolls(tmp_path, db):
    _url, store = db
    port = free_port()
    config = tmp_path / "edge.yaml"
    config.write_text(FAST_RECONNECT)
    spool = tmp_path / "spool"
    log = tmp_path / "edge.log"
    edge = Child(
        [*ROBOFLEET, "--config", str(config), "edge", "--server", f"127.0.0.1:{port}",
         "--token", store.create_enrollment_token(timedelta(minutes=5)), "--robot", "late",
         "--spool-dir", str(spool), *PENDULUM],
        log=log,
    )  # fmt: skip
    waiting = f"waiting for the cloud at 127.0.0.1:{port}"
    try:
        wait_until(lambda: log.read_text().count(waiting) >= 2, 90, edge.output)
        assert edge.proc.poll() is None, edge.output()
        with Cloud(store, port=port):
            wait_until((spool / "credential.json").exists, 60, edge.output)
            edge.proc.send_signal(signal.SIGTERM)
            assert edge.proc.wait(60) == 0, edge.output()
    finally:
        edge.stop(30)
    text = log.read_text()
    assert "UNAVAILABLE" in text and "next try in" in text
    assert "Traceback" not in text, text
    stored = json.loads((spool / "credential.json").read_text())
    robot = store.robot_for_credential(stored["credential"])
    assert robot is not None and robot.id == stored["robot_id"] and robot.name == "late"


def test_robofleet_edge_stops_cleanly_while_waiting_for_its_cloud(tmp_path):
    config = tmp_path / "edge.yaml"
    config.write_text(FAST_RECONNECT)
    log = tmp_path / "edge.log"
    edge = Child(
        [*ROBOFLEET, "--config", str(config), "edge", "--server", f"127.0.0.1:{free_port()}",
         "--token", "t", "--robot", "early", "--spool-dir", str(tmp_path / "spool"), *PENDULUM],
        log=log,
    )  # fmt: skip
    try:
        wait_until(lambda: "waiting for the cloud" in log.read_text(), 90, edge.output)
        edge.proc.send_signal(signal.SIGTERM)
        assert edge.proc.wait(30) == 0, edge.output()
    finally:
        edge.stop(30)
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
def test_the_same_agent_runs_as_a_ray_actor(tmp_path):
    import ray

    from edge_agent.build import AgentOptions
    from edge_agent.ray_actor import remote_class

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor_cls = remote_class()
        opts = AgentOptions(
            robot_name="ray-robot",
            tasks=["reach-v3"],
            driver="metaworld",
            operator="scripted",
            max_episode_steps=10,
            spool_dir=tmp_path / "spool",
        )
        actor = actor_cls.remote({"control_hz": 100.0}, None, opts)
        report = ray.get(actor.run.remote(episodes=2), timeout=180)
        assert report["steps"] == 20 and report["episodes"] == 2
        final = ray.get(actor.close.remote(), timeout=60)
        assert final["next_seq"] == 20
    finally:
        ray.shutdown()


def test_robofleet_edge_drives_a_gymnasium_robot_without_metaworld(tmp_path):
    """A non-Meta-World robot (hal's Gymnasium driver, Pendulum-v1: 3-D state, 1-D action)
    runs offline: every step lands in the spool with the driver's own shapes."""
    from buffer.table.schema import StepSchema
    from edge_agent.spool import Spool
    from hal.drivers import make_driver

    spool_dir = tmp_path / "spool"
    config = tmp_path / "edge.yaml"
    config.write_text("edge:\n  control_hz: 100\n  wait_for_first_weights: false\n")
    proc = robofleet(
        "--config", str(config), "edge", "--driver", "gymnasium",
        "--driver-option", "env_id=Pendulum-v1", "--driver-option", "control_hz=100",
        "--operator", "none", "--episodes", "2", "--max-steps", "15",
        "--spool-dir", str(spool_dir), "--report",
    )  # fmt: skip
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["steps"] == 30 and report["episodes"] == 2
    driver = make_driver("gymnasium", "probe", env_id="Pendulum-v1")
    schema = StepSchema.from_features(driver.observation_features, driver.action_features)
    spool = Spool(spool_dir, 1 << 30)
    rows = [spool.read(e) for e in spool.pending()]
    batches = [b for b in rows if b is not None]
    assert sum(b.num_rows for b in batches) == 30
    first = batches[0].to_pylist()[0]
    assert len(first["observation.state"]) == 3 and len(first["action"]) == 1
    assert {r["task"] for b in batches for r in b.to_pylist()} == {"pendulum-v1"}
    assert set(schema.arrow_schema.names) == set(batches[0].schema.names)  # the driver's schema


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--driver", "gymnasium", "--driver-option", "env_id=Pendulum-v1"], "scripted operator"),
        (["--driver", "gymnasium", "--driver-option", "no-equals-sign"], "KEY=VALUE"),
        (["--driver", "gymnasium", "--driver-option", "env_id=NoSuchEnv-v9",
          "--operator", "none"], "NoSuchEnv-v9"),
    ],
)  # fmt: skip
def test_robofleet_edge_names_a_bad_driver_set_up(tmp_path, capsys, args, message):
    from robofleet.commands.edge import main

    assert main([*args, "--spool-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
