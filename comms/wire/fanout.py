"""A site relay's ZeroMQ PUB fan-out of weight versions (:mod:`comms.relay.site_relay`).

Messages are ``[run_id, TOPIC_MANIFEST, manifest, tag]`` and ``[run_id, TOPIC_CHUNK,
CHUNK_HEADER (comms.wire.dataplane_frames), data]``. ``tag`` is :func:`manifest_tag` under the
relay's per-run key, which a robot gets only in the initial metadata (``FANOUT_KEY_HEADER``,
hex) of a Weights.Fetch the cloud authorized.
"""

from __future__ import annotations

import hashlib
import hmac

TOPIC_MANIFEST = b"M"
FANOUT_KEY_HEADER = "x-robofleet-fanout-key"  # hex HMAC key in Weights.Fetch initial metadata
TOPIC_CHUNK = b"C"


def manifest_tag(key: bytes, manifest_bytes: bytes) -> bytes:
    """HMAC-SHA256 of a serialized manifest (the fan-out's fourth frame)."""
    return hmac.new(key, manifest_bytes, hashlib.sha256).digest()
