"""The comms benchmarks (``robofleet bench transport``, ``robofleet bench weights``)."""
