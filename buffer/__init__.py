"""Persistent, cache-aware replay buffer: step schema, WAL, Arrow segments, samplers, rate limiter."""
