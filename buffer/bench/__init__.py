"""``robofleet bench buffer`` and ``robofleet bench crash``: the buffer's benchmarks, their
data, workers and the resident-memory probe."""
