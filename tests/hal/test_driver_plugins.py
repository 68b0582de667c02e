"""A lab's own driver, from a package outside the repository: resolved by ``module:Class`` or a
``robofleet.drivers`` entry point, refused by name when it cannot be used, and checked by the
shipped contract (``python -m hal.contract``, ``pytest -p hal.pytest_plugin``) in real
processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.drivers import DRIVER_KINDS, driver_class, make_driver
from hal.drivers.gym import GymnasiumDriver
from tests.fakes.cloud import ROBOFLEET
from tests.fakes.lab_driver import DRIVER, write_entry_point, write_lab_package
from tests.fakes.procs import REPO

CHECKS_PASSED = 8  # hal.contract.CHECKS, every one applies to the lab's arm


@pytest.fixture
def lab_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lab's package (and an entry point to it) under tmp_path, importable here."""
    root = tmp_path / "site"
    write_lab_package(root)
    write_entry_point(root, "lab-arm", DRIVER)
    write_entry_point(root, "broken-arm", "labarm.broken_import:Arm", dist="brokenarm")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m == "labarm" or m.startswith("labarm.")]:
        del sys.modules[name]


def _run(root: Path, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{REPO}"}
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_plugin_resolves_by_reference_and_by_entry_point(lab_root: Path) -> None:
    assert driver_class("gymnasium") is GymnasiumDriver  # built-ins first, as they were
    cls = driver_class(DRIVER)
    assert cls.__name__ == "LabArm" and cls.__module__ == "labarm.arms"
    assert driver_class("lab-arm") is cls
    # The run-wide episode options reach a plugin as they reach a built-in: those it takes.
    arm = make_driver("lab-arm", "arm-1", {"max_episode_steps": 7, "terminate_on_success": True})
    assert type(arm) is cls and arm.spec.max_episode_steps == 7 and arm.spec.tasks == ["slide"]
    assert make_driver(DRIVER, "arm-2", gain=0.2).gain == 0.2  # type: ignore[attr-defined]
    assert "lab-arm" not in DRIVER_KINDS


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("labarm.nothere:Arm", "module 'labarm.nothere' not found"),
        (
            "labarm.broken_import:Arm",
            "importing 'labarm.broken_import' raised RuntimeError('no driver board found')",
        ),
        ("labarm.arms:Nope", "module 'labarm.arms' has no attribute 'Nope'"),
        ("labarm.arms:NotADriver", "is class NotADriver, not a subclass of hal.driver.RobotDriver"),
        ("broken-arm", "(entry point 'labarm.broken_import:Arm'): importing"),
        ("no-such-arm", "unknown driver kind 'no-such-arm'; built-in kinds: gymnasium, lerobot"),
    ],
)
def test_an_unusable_plugin_is_refused_by_name(lab_root: Path, kind: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        driver_class(kind)
    assert f"'{kind}'" in str(refused.value) and why in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "options", "why"),
    [
        (DRIVER, {"colour": "red"}, "its constructor failed with options ['colour']"),
        ("labarm.arms:NoSpecArm", {}, "its spec is NoneType, not a hal.spec.RobotSpec"),
        ("labarm.arms:BadSpecArm", {}, "its spec is invalid: "),
    ],
)
def test_a_plugin_that_cannot_be_built_is_refused_by_name(
    lab_root: Path, kind: str, options: dict[str, str], why: str
) -> None:
    with pytest.raises(ValueError) as refused:
        make_driver(kind, "arm-x", **options)
    assert f"driver plugin '{kind}' for robot 'arm-x'" in str(refused.value)
    assert why in str(refused.value)


def test_the_contract_module_passes_a_lab_driver_and_names_what_a_broken_one_breaks(
    tmp_path: Path,
) -> None:
    root = tmp_path / "site"
    write_lab_package(root)
    write_entry_point(root, "lab-arm", DRIVER)
    contract = (sys.executable, "-m", "hal.contract")
    for kind in (DRIVER, "lab-arm"):
        ok = _run(root, *contract, kind, "--option", "gain=0.1")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.count("PASS ") == CHECKS_PASSED and "FAIL" not in ok.stdout

    broken = {
        "labarm.arms:NoEstopArm": "FAIL estop_latches_until_cleared: estop() did not latch",
        "labarm.arms:WrongShapeArm": "FAIL observe_act_and_disconnect: reset(): "
        "observation.state has shape (3,), the spec says (2,)",
    }
    for kind, failure in broken.items():
        got = _run(root, *contract, kind)
        assert got.returncode == 1, got.stdout + got.stderr
        assert failure in got.stdout, got.stdout
        assert got.stdout.count("FAIL ") == 1, got.stdout  # the other rules hold
        assert f"{kind}: " in got.stdout.splitlines()[-1]  # the summary names the failures

    refused = _run(root, *contract, "labarm.nothere:Arm")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        "hal.contract: driver plugin 'labarm.nothere:Arm': module 'labarm.nothere' not found "
        "(is its package installed or on PYTHONPATH?)"
    )


def test_the_pytest_plugin_runs_the_contract_on_a_labs_driver(tmp_path: Path) -> None:
    root = tmp_path / "site"
    write_lab_package(root)
    tests = tmp_path / "lab_tests"
    tests.mkdir()
    (tests / "test_arm.py").write_text(
        "from hal.pytest_plugin import driver_contract\n"
        "from labarm.arms import LabArm\n\n"
        "test_lab_arm = driver_contract(lambda: LabArm('arm-0', max_episode_steps=5))\n"
    )
    pytest_cmd = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    in_module = _run(root, *pytest_cmd, "--rootdir", str(tests), str(tests), cwd=tests)
    assert in_module.returncode == 0, in_module.stdout + in_module.stderr
    assert f"{CHECKS_PASSED} passed" in in_module.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    by_option = _run(
        root, *pytest_cmd, "--rootdir", str(empty), "-p", "hal.pytest_plugin",
        "--driver-contract", "labarm.arms:NoEstopArm", cwd=empty,
    )  # fmt: skip
    assert by_option.returncode == 1, by_option.stdout + by_option.stderr
    assert f"1 failed, {CHECKS_PASSED - 1} passed" in by_option.stdout
    assert "estop_latches_until_cleared: estop() did not latch" in by_option.stdout


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("labarm.nothere:Arm", "module 'labarm.nothere' not found"),
        ("labarm.broken_import:Arm", "raised RuntimeError('no driver board found')"),
    ],
)
def test_robofleet_edge_refuses_an_unusable_driver_in_one_line(
    tmp_path: Path, kind: str, why: str
) -> None:
    root = tmp_path / "site"
    write_lab_package(root)
    got = _run(root, *ROBOFLEET, "edge", "--driver", kind, "--robot", "arm-1", "--run", "r1")
    assert got.returncode == 2, got.stdout + got.stderr
    assert got.stderr.count("\n") == 1 and got.stderr.startswith(
        f"robofleet edge: driver plugin '{kind}': "
    )
    assert why in got.stderr


def test_a_cloud_with_the_labs_package_evaluates_on_a_simulated_plugin(lab_root: Path) -> None:
    """``evaluation.on: simulator`` builds a robot of the run's driver kind in the cloud: a
    plugin works there too when the cloud has its package, and is refused by name if not."""
    from runs.evaluator import simulated_robot

    robot = simulated_robot(DRIVER, ["slide"], 9)
    assert robot.spec.max_episode_steps == 9 and robot.spec.tasks == ["slide"]
    with pytest.raises(ValueError, match="driver plugin 'labarm.nothere:Arm': module"):
        simulated_robot("labarm.nothere:Arm", ["slide"], 9)
