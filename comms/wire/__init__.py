"""What both ends agree on: step batches, tensors and weight versions as bytes, protobuf
messages built around large payloads, credentials in call metadata, TLS, the data plane's
frames and a relay's fan-out."""
