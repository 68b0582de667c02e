"""The driver contract (``hal.contract``) as pytest tests, one per check.

Two ways for a lab to run it:

* from the command line, with no test file: ``pytest -p hal.pytest_plugin
  --driver-contract my_pkg.arms:MyArm [--driver-contract-option port=/dev/ttyACM0 ...]``
  (the driver is built with ``hal.drivers.make_driver``; repeat ``--driver-contract`` for
  several drivers);
* in a test module, with any factory (a stand-in of the arm, a fixture-free builder)::

      from hal.pytest_plugin import driver_contract
      test_my_arm = driver_contract(lambda: MyArm("arm-0", port="/dev/ttyACM0"))

A failing check fails its test with the check's reason; a check that does not apply to the
driver is skipped with why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hal.contract import CHECKS, CheckResult, Factory, run_check
from hal.drivers import make_driver, parse_options


def _outcome(result: CheckResult) -> None:
    if result.status == "skip":
        pytest.skip(result.reason)
    if result.failed:
        pytest.fail(f"{result.name}: {result.reason}", pytrace=False)


def driver_contract(factory: Factory) -> Callable[[str], None]:
    """A pytest test function parametrized over every contract check, each on a fresh driver
    from ``factory``; assign it to a ``test_*`` name in a test module."""

    @pytest.mark.parametrize("check", list(CHECKS))
    def test_driver_contract(check: str) -> None:
        _outcome(run_check(check, factory))

    return test_driver_contract


class ContractItem(pytest.Item):
    """One contract check of a ``--driver-contract`` driver."""

    def __init__(self, *, ref: str, options: dict[str, Any], check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ref, self.options, self.check = ref, options, check

    def runtest(self) -> None:
        _outcome(run_check(self.check, lambda: make_driver(self.ref, "contract-0", **self.options)))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"driver contract {self.ref}: {self.check}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("robofleet driver contract")
    group.addoption(
        "--driver-contract",
        action="append",
        default=[],
        metavar="DRIVER",
        help="run the hal driver contract against this driver (module.path:ClassName, a "
        "robofleet.drivers entry point name or a built-in kind)",
    )
    group.addoption(
        "--driver-contract-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword option of the --driver-contract driver, VALUE as JSON if it parses",
    )


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    refs: list[str] = config.getoption("driver_contract")
    if not refs:
        return
    try:
        options = parse_options(
            config.getoption("driver_contract_option"), "--driver-contract-option"
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    for ref in refs:
        for check in CHECKS:
            items.append(
                ContractItem.from_parent(
                    session,
                    name=f"driver_contract[{ref}][{check}]",
                    ref=ref,
                    options=options,
                    check=check,
                )  # fmt: skip
            )
