"""The roof: the ``robofleet`` command, settings composition, process wiring (the cloud, the
simulated fleet) and the benchmarks that wire several components. Nothing imports it."""

from foundation import __version__

__all__ = ["__version__"]
