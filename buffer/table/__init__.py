"""The replay table: step schema, row index, tiered storage, the durable writer, sealing,
recovery, reads, marks and :class:`buffer.table.replay_buffer.ReplayBuffer` that owns them
(docs/buffer.md)."""
