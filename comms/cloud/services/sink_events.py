"""A run's events say when its sink's disk filled up and when it stored again.

``buffer.disk_full`` (data: ``reason``, the refusal robots were sent) is recorded at the first
refusal of a spell, ``buffer.disk_recovered`` (data: ``refused_for_s``) at the first batch
stored after it. The metadata store may sit on the full disk too: an event that cannot be
recorded is logged and tried again (a ``disk_full`` not recorded yet goes in before its
``disk_recovered``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class EventRecorder(Protocol):
    """Where a run's events go: the metadata store, or a shard endpoint's own list that the
    cloud records from (``comms.cloud.shard_ingest.EndpointEvents``)."""

    def record_event(self, kind: str, *, run_id: str | None = None, **data: Any) -> Any: ...


@dataclass
class _Spell:
    reason: str
    since: float  # time.monotonic()
    recorded: bool = False


class SinkFullEvents:
    """Per run: whether its sink is refusing for a full disk, as events of the run.

    Used from the server's event loop only (the store is called in worker threads, one
    record at a time, so a run's events keep their order).
    """

    def __init__(self, store: EventRecorder) -> None:
        self.store = store
        self._spells: dict[str, _Spell] = {}
        self._lock = asyncio.Lock()

    async def refused(self, run_id: str, reason: str) -> None:
        """The run's sink refused a batch: its disk is full (``reason``, as robots got it)."""
        spell = self._spells.get(run_id)
        if spell is not None and spell.recorded:
            return
        async with self._lock:
            spell = self._spells.get(run_id)
            if spell is None:
                log.warning("run %s: %s; robots keep their steps and retry", run_id, reason)
                spell = self._spells[run_id] = _Spell(reason, time.monotonic())
            if not spell.recorded:
                spell.recorded = await self._record("buffer.disk_full", run_id, reason=reason)

    async def stored(self, run_id: str) -> None:
        """The run's sink stored a batch: a spell of refusals (if any) is over."""
        if run_id not in self._spells:
            return
        async with self._lock:
            spell = self._spells.pop(run_id, None)
            if spell is None:
                return
            took = round(time.monotonic() - spell.since, 3)
            log.warning("run %s: the buffer stores again after %.1f s refused", run_id, took)
            if not spell.recorded:
                await self._record("buffer.disk_full", run_id, reason=spell.reason)
            await self._record("buffer.disk_recovered", run_id, refused_for_s=took)

    async def _record(self, kind: str, run_id: str, **data: Any) -> bool:
        try:
            await asyncio.to_thread(self.store.record_event, kind, run_id=run_id, **data)
        except Exception as exc:  # noqa: BLE001 - the store's disk may be the full one
            log.warning("run %s: could not record %s: %s", run_id, kind, exc)
            return False
        return True
