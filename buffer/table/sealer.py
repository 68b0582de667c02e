"""The sealer: a background thread that turns full tails into sealed segments and keeps a
pre-faulted spare tail ready for the writer.

A full tail's WAL files are closed and fdatasynced by the rotation that queued it; sealing
renames them into a segment (nothing is copied, see ``buffer.files.sealed``), maps it, lets the
chunk go cold within the byte budget and applies retention.

A seal or spare that fails (a full disk, no memory) is noted in ``failed`` and tried again
every :data:`RETRY_S`; meanwhile an append that would have to wait for it is refused naming
the failure (``Writer``), instead of waiting for a thread that cannot make progress. The
first success clears it. Acknowledged rows are in the fdatasynced WAL files either way.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from buffer.files.sealed import WalSegment, seal_files
from buffer.table.chunks import Chunk
from buffer.table.retention import Retention
from buffer.table.state import TableState

log = logging.getLogger(__name__)
RETRY_S = 1.0  # a failed seal or spare is tried again this often


class Sealer:
    """Seals queued tails in order and prepares the next tail's arrays.

    ``queue`` holds ``(tail chunk, its closed WAL files)`` oldest first; ``spare`` is the
    pre-faulted arrays of the next tail (None while being made or once taken). Both are read
    and changed under the state's lock.
    """

    def __init__(self, state: TableState, retention: Retention) -> None:
        self.state = state
        self.retention = retention
        self.queue: list[tuple[Chunk, list[Path]]] = []
        self.spare: dict[str, np.ndarray] | None = None
        # The thread's own condition (on the state's lock): appends notify the shared one
        # often, and waking this thread each time cost a context switch per append.
        self.wake = threading.Condition(state.lock)
        self.failed: BaseException | None = None  # the last seal / spare failure, until one works

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="buffer-sealer", daemon=True)
        t.start()
        return t

    def enqueue(self, chunk: Chunk, wal_paths: list[Path]) -> None:
        """Queue a full tail for sealing (locked)."""
        chunk.sealed = False
        self.queue.append((chunk, wal_paths))
        self.wake.notify_all()

    def take_spare(self) -> dict[str, np.ndarray] | None:
        """The spare tail's arrays, or None; they count as the tail from now on (locked)."""
        spare, self.spare = self.spare, None
        if spare is not None:
            storage = self.state.storage
            storage.spare_bytes -= len(spare["action"]) * storage.tail_row_bytes
            self.wake.notify_all()  # make the next one
        return spare

    def rows_visible(self) -> None:
        """Rows became visible (locked): the oldest queued tail may be ready to seal."""
        if self.queue:
            self.wake.notify_all()

    def stop(self) -> None:
        """Wake the thread to see ``state.stop`` (locked)."""
        self.wake.notify_all()

    def flush(self) -> None:
        """Wait until every queued seal is written and the spare tail is ready (quiescent).

        Raises:
            OSError: a seal or the spare is failing (``failed``; it is being retried).
        """
        st = self.state
        with st.lock:
            while self.queue or (self.spare is None and not st.stop.is_set()):
                if self.failed is not None:
                    raise OSError(f"{st.directory}: sealing is failing: {self.failed}")
                st.cond.wait(0.05)

    def _run(self) -> None:
        st = self.state
        while True:
            try:
                if not self._step():
                    return
            except Exception as exc:  # noted, refused to appends that need it, retried
                with st.lock:
                    if self.failed is None:
                        log.error(
                            "%s: sealing failed (retrying every %.0f s): %s",
                            st.directory,
                            RETRY_S,
                            exc,
                        )
                    self.failed = exc
                    st.cond.notify_all()
                if st.stop.wait(RETRY_S):
                    return
                continue
            if self.failed is not None:
                with st.lock:
                    log.info("%s: sealing works again", st.directory)
                    self.failed = None
                    st.cond.notify_all()

    def _step(self) -> bool:
        """Make the spare if missing, then seal the oldest queued tail once its rows are
        visible; False once the buffer stops with nothing queued."""
        st = self.state
        while True:
            if self.spare is None and not st.stop.is_set():
                self._make_spare()
            with st.lock:
                while not self.queue and not st.stop.is_set() and self.spare is not None:
                    self.wake.wait(0.5)
                if not self.queue:
                    if st.stop.is_set():
                        return False
                    if self.failed is not None:
                        return True  # the spare worked: say so
                    continue
                chunk, wal_paths = self.queue[0]
                # Rows of this chunk are durable in the WAL; wait until they are visible.
                while st.visible < chunk.end and not st.stop.is_set():
                    self.wake.wait(0.05)
            self.seal(chunk, wal_paths)
            return True

    def _make_spare(self) -> None:
        """Pre-fault the next tail here, so appends never pay its page faults. Room for it is
        made in the budget first, so the peak stays inside the budget; ``spare_bytes`` counts
        it from now until an append takes it as its tail."""
        st = self.state
        nbytes = st.rows_per_segment * st.storage.tail_row_bytes
        with st.lock:
            st.storage.spare_bytes += nbytes
            st.storage.enforce_budget()
        try:
            spare = st.storage.allocate(st.rows_per_segment, small=bool(st.storage.large))
        except BaseException:
            with st.lock:
                st.storage.spare_bytes -= nbytes  # counted again by the retry
            raise
        with st.lock:
            self.spare = spare

    def seal(self, chunk: Chunk, wal_paths: list[Path]) -> None:
        """Seal the oldest queued tail (``chunk``): its WAL files (closed and fdatasynced by
        the rotation) are renamed into a segment; nothing is copied (see ``buffer.files.sealed``)."""
        st = self.state
        paths = seal_files(st.directory, chunk.first_row, chunk.n, wal_paths)
        seg = WalSegment(paths, chunk.first_row, chunk.n, st.schema.arrow_schema)
        seg.release_pages()
        with st.lock:
            st.storage.seal(chunk, seg)
            self.retention.add(chunk.first_row, chunk.n, seg)
            self.queue.pop(0)
            if chunk.hot:  # newest data in RAM: the last to evict
                chunk.heat = max([c.heat for c in st.storage.chunks] + [1.0])
            st.storage.enforce_budget()
            self.retention.apply(st)
            st.cond.notify_all()
