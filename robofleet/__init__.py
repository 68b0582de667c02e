"""robofleet: fleet-scale online post-training for robot policies."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("robofleet")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
