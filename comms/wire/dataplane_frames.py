"""Frames of the ZeroMQ data plane (:mod:`comms.cloud.dataplane`, docs/comms-data-plane.md):
the first frame names the message, the second is its fixed-size header where it has one.

``[HELLO, token]`` binds a DEALER to its gRPC stream and is answered ``[OK]`` or ``[NO]``;
``[WEIGHT, CHUNK_HEADER, data]`` is one weight chunk, ``[BATCH, BATCH_HEADER, arrow_ipc]``
one step batch.
"""

from __future__ import annotations

import struct

HELLO = b"hi"
OK = b"ok"
NO = b"no"
WEIGHT = b"w"
BATCH = b"b"
# Weight chunk header: version, base_version, index (little-endian int64, int64, uint32).
CHUNK_HEADER = struct.Struct("<qqI")
# Step batch header: last_seq (int64), flags (uint32, unused so far).
BATCH_HEADER = struct.Struct("<qI")
# Hosts an offer's endpoint can name that bind every interface and reach none from afar: the
# robot dials such an endpoint at the host it dialed for gRPC.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
