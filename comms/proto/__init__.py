"""Generated protobuf/gRPC modules (regenerate with ``python -m comms.proto.generate``)."""
