"""The buffer's files: the format version, the write-ahead log, sealed and Arrow segments,
their record encoding and the bounded cache of their read descriptors (docs/buffer.md)."""
