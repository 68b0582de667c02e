"""Fixtures of the buffer tests: ``full_disk`` (tests.fakes.disk), a disk the test fills."""

from tests.fakes.disk import full_disk

__all__ = ["full_disk"]
