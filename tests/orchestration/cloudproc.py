"""Only for tests/orchestration/test_demo.py, whose change is another developer's: the names it
imports, which live in tests.fakes now. Delete this file once test_demo.py imports them there."""

from tests.fakes.cloud import ROBOFLEET
from tests.fakes.settings import cloud_env as env_for

__all__ = ["ROBOFLEET", "env_for"]
