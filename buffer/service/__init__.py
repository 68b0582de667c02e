"""The buffer across processes: the batch server and its clients, shards and the Ray actor
that runs one shard (docs/buffer.md)."""
