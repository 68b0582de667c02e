"""Simulation helpers: the simulated Meta-World fleet and the single-process HG-DAgger loop."""
