"""Edge-to-cloud transport, one sub-package per job: ``wire`` (what both ends agree on: step
batches, tensors, weight versions, credentials, TLS, data-plane frames), ``cloud`` (the gRPC
server, its servicers, auth, the data plane server, sinks, weight distribution), ``robot``
(the edge client, uploader, weight subscriptions), ``relay`` (a site relay) and ``bench``.
The wire schema is ``comms/proto/robofleet.proto``.

Every seam, with usage, and the guarantees: docs/comms.md.
"""
