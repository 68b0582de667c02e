"""The cloud side: the gRPC server and its servicers (``services``), auth against the metadata
store, the ZeroMQ data plane server, the step sink seam and its replay-buffer sink, the weight
distributor and the learner's weight file feed, enrollment tokens, robot liveness."""
