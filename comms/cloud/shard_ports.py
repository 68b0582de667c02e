"""The ports of a buffer shard's ingest endpoint: its gRPC port and, with ``comms.data_plane``
on, its ZeroMQ data-plane port.

Without a range both are ports the OS picks. With ``comms.shard_ingest_port`` set, both come
from the one range it starts (``shard_ingest_ports`` long), the range a firewall opens to the
robots: each endpoint takes :func:`ports_per_shard` ports of it (2 with the data plane: gRPC
and ZeroMQ; 1 without), each the one it held when its shard last ran if that is free, else
the first free one. So a node needs ``ports_per_shard`` x the shards it may host, of every
run at once, and an endpoint that finds no free port does not start (:class:`PortRangeFull`).
"""

from __future__ import annotations

import logging

from comms.cloud.dataplane import DataPlaneServer
from comms.cloud.server import dataplane_offered, new_dataplane
from comms.config import CommsSettings

log = logging.getLogger(__name__)

SETTINGS = "comms.shard_ingest_port, shard_ingest_ports"


class PortRangeFull(RuntimeError):
    """Every port of the shard ingest range is taken on the endpoint's host."""


def range_full(what: str, host: str, settings: CommsSettings) -> PortRangeFull:
    """The refusal of ``what`` (a socket of the endpoint) on ``host``, naming the range and
    the settings to change. (A plain message: the error crosses Ray pickled.)"""
    return PortRangeFull(
        f"no free port for the shard {what} on {host}: {range_text(settings)} is full; "
        f"widen shard_ingest_ports ({ports_per_shard(settings)} ports a shard) or move the "
        "range to free ports"
    )


class PortRangeTooSmall(ValueError):
    """The shard ingest range holds fewer ports than the shards a node may host need."""


def ingest_range(settings: CommsSettings) -> range:
    """The shard ingest ports (``comms.shard_ingest_port``, ``shard_ingest_ports`` long, up to
    65535); empty when no range is set."""
    first = settings.shard_ingest_port
    return range(first, min(first + settings.shard_ingest_ports, 65536)) if first else range(0)


def range_text(settings: CommsSettings) -> str:
    """``first-last (settings)``, e.g. ``50100-50163 (comms.shard_ingest_port, ...)``."""
    span = ingest_range(settings)
    return f"{span.start}-{span.stop - 1} ({SETTINGS})"


def ports_per_shard(settings: CommsSettings) -> int:
    """Ports of the range one shard endpoint takes: 2 with ``comms.data_plane`` on, else 1."""
    return 2 if settings.data_plane else 1


def ports_to_try(settings: CommsSettings, kept: int, avoid: int = 0) -> list[int]:
    """The ports one socket of a shard endpoint tries, in order: ``kept`` (the port it had;
    0: none) then any free one (0), or with a range set only the ports of the range, ``kept``
    first when it lies in it and ``avoid`` (the endpoint's other socket's kept port) last, so
    that a restarted endpoint's sockets do not take each other's ports."""
    span = ingest_range(settings)
    if not span:
        return list(dict.fromkeys((kept, 0)))
    rest = [p for p in span if p != avoid] + ([avoid] if avoid in span else [])
    return list(dict.fromkeys(([kept] if kept in span else []) + rest))


def check_range(settings: CommsSettings, shards_on_a_node: int) -> None:
    """Refuse a range too small for ``shards_on_a_node`` endpoints on one node (nothing to
    check without a range).

    Raises:
        PortRangeTooSmall: the range holds fewer than ``ports_per_shard`` x
            ``shards_on_a_node`` ports (the numbers, the range and its settings named).
    """
    span = ingest_range(settings)
    need = ports_per_shard(settings) * shards_on_a_node
    if span and len(span) < need:
        raise PortRangeTooSmall(
            f"the shard ingest range {range_text(settings)} holds {len(span)} ports, but a node "
            f"may host {shards_on_a_node} shards of this run at {ports_per_shard(settings)} "
            f"ports each (gRPC, data plane): {need} ports; widen shard_ingest_ports, or place "
            "fewer shards a node (buffer.shard_resource)"
        )


def bind_dataplane(settings: CommsSettings, kept: int, avoid: int = 0) -> DataPlaneServer | None:
    """A shard endpoint's data plane on ``settings.bind_host``: on ``kept`` when free, else
    on a port of :func:`ports_to_try`; None when none is offered (``dataplane_offered``) or,
    without a range, none could be bound (logged).

    Raises:
        PortRangeFull: a range is set and every port of it is taken (the host, the range and
            its settings named).
    """
    if not dataplane_offered(settings):
        return None
    error: RuntimeError | None = None
    for port in ports_to_try(settings, kept, avoid):
        try:
            return new_dataplane(settings, port)
        except RuntimeError as exc:  # taken: the next one
            error = exc
    if ingest_range(settings):
        raise range_full("ingest data plane", settings.bind_host, settings)
    log.error("no data plane: %s", error)
    return None
