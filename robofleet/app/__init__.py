"""The roof: the ``robofleet`` command, settings composition, run orchestration, the simulated
fleet and the benchmarks that wire several components. Nothing imports this package."""
