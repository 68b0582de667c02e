"""Benchmarks that wire several components (``robofleet bench efficiency``)."""
