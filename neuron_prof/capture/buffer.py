"""What a capture holds between flushes, and the rank's disk budget.

Collectors' rows wait here (per table) until the session flushes them to the rank's writer; the
buffer then writes them, commits or compacts the journals, and stops detail capture for good once
the rank's files reach ``max_bytes`` or its op and mark rows ``max_events`` (the budget cut).
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from neuron_prof.store.interner import Interner
from neuron_prof.recording.api import batch_since
from neuron_prof.store.source_files import source_rows
from neuron_prof.store.writer import RankWriter

log = logging.getLogger("neuron_prof")

DEFAULT_MAX_BUFFERED_EVENTS = 2_000_000
DEFAULT_MAX_EVENTS = 50_000_000
DEFAULT_MAX_BYTES = 256 << 20  # per rank; docs/run-format.md's "Bounded memory and disk" says why this size
IDLE_FLUSH_INTERVAL_NS = 1_000_000_000  # outside windows only step rows are pending: flush ~1/s
COMPACT_JOURNAL_BYTES = 256 << 20
"""Journaled rows move into the Arrow streams at close, or before once the journals hold this
much. Moving them rewrites every byte (read back, split into columns, written again, checked):
done every 2 s or 16 MB, it paused the training thread 30-130 ms every ~300 steps of the 64-wide
MLP, 100-200 us per step on average, more than all the rest of the step boundary. Journals read
as they are (a run killed with kill -9 is read from them), so only the close needs Arrow; with
the default ``max_bytes`` a capture moves its journals once, at close (about a second for 256 MB),
and this bound keeps an unbudgeted one's pauses as rare."""
EVENT_TABLES = ("ops", "marks")
DEVICE_TABLES = ("device_enqueues", "queue_flushes", "device_kernels", "kernel_enqueues", "fallbacks", "event_enqueues",
                 "event_completions", "stream_waits", "stream_syncs", "device_copies", "device_gaps")
DETAIL_TABLES = (*EVENT_TABLES, "memory_events", "memory_tensors", *DEVICE_TABLES)
"""Tables written only while a window is on: what a budget cut stops (step rows, per-step memory
and compiles go on)."""


class CaptureBuffer:
    """The rows pending for each table, what the rank has written and dropped, and where its
    budget cut detail capture (``cut``: None until then)."""

    def __init__(self, max_events: int, max_bytes: int | None) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.pending: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        self.dropped: dict[str, int] = defaultdict(int)
        self.written: dict[str, int] = defaultdict(int)
        self.cut: dict[str, Any] | None = None  # where detail capture stopped (see _budget_cut)
        self.detail_seen: set[str] = set()  # DETAIL_TABLES written so far
        self.last_commit = 0
        self.metrics_written = 0
        self.keep_from = 0  # after a discard: events that began before this are not kept either

    def events_written(self) -> int:
        """Op and mark rows written so far (what ``max_events`` limits)."""
        return sum(self.written.values())

    def keep_or_discard_events(self, keep: bool) -> None:
        """A flush of a step whose events are kept, or discarded (a step outside the schedule's
        windows)."""
        if keep and self.keep_from:
            self._drop_events_before(self.keep_from)
            self.keep_from = 0
        elif not keep:
            for t in EVENT_TABLES:
                self.pending.pop(t, None)
            self.keep_from = time.monotonic_ns()

    def write(self, writer: RankWriter, interner: Interner, step_num: int, final: bool) -> None:
        """Everything pending (and the strings, frames and stacks interned since the last
        write, with the size and hash of each file first named) to ``writer``, then a commit, a compaction, or (``final``) the rank's close."""
        for table, rows in interner.take_new().items():
            writer.append(table, rows)
        files = interner.take_new_files()
        if files:  # once per file, at a flush: off the ops' path
            writer.append("source_files", source_rows(files))
        pending, self.pending = self.pending, defaultdict(list)
        metrics = pending.pop("metrics", None)
        if metrics and not final and time.monotonic_ns() - self.metrics_written < IDLE_FLUSH_INTERVAL_NS:
            # scalars go to disk about once a second, in one write: a journal write per step cost
            # 25-35 us at the boundary (a kill -9 can lose the last second's scalars)
            self.pending["metrics"] = metrics
        elif metrics:
            writer.append("metrics", np.concatenate(metrics))
            self.metrics_written = time.monotonic_ns()
        # one pass, in the order the rows came: every table is committed together by the
        # manifest line that follows, so the order of their writes does not matter
        for table, batches in pending.items():
            for cols in batches:
                writer.append(table, cols)
            if table in EVENT_TABLES:
                self.written[table] += sum(len(cols["ts"]) for cols in batches)
            if table in DETAIL_TABLES:
                self.detail_seen.add(table)
        now = time.monotonic_ns()
        if self.cut is None and not final:
            self.cut = self._budget_cut(writer, step_num, now)
        counters = {"dropped": dict(self.dropped), "written": dict(self.written),
                    "cap_reached_at_step": None if self.cut is None else self.cut["step"]}
        if self.cut is not None:
            counters["detail_cut"] = self.cut
        if final:
            writer.close(step_num, counters)
        elif writer.journal_bytes() >= COMPACT_JOURNAL_BYTES:
            writer.compact(step_num, counters)
        else:
            writer.commit(step_num, counters)
        self.last_commit = now

    def _budget_cut(self, writer: RankWriter, step_num: int, now: int) -> dict[str, Any] | None:
        """Whether this flush used up the rank's budget: ``max_bytes`` of files (every table, the
        manifest) or ``max_events`` op and mark rows. If so, the step just flushed was the last one
        captured in detail, and the cut (step, time, bytes, which limit, the detail tables it
        stops) goes into every later manifest line for the report."""
        size = writer.bytes_written()
        if self.max_bytes is not None and size >= self.max_bytes:
            by, limit = "max_bytes", self.max_bytes
        elif self.events_written() >= self.max_events:
            by, limit = "max_events", self.max_events
        else:
            return None
        tables = [t for t in DETAIL_TABLES if t in self.detail_seen]
        log.warning("neuron_prof: %s=%d reached after step %d (%d bytes on disk); later steps keep step times "
                    "and per-step memory only, not %s (raise %s)", by, limit, step_num, size,
                    ", ".join(tables) or "detail", by)
        return {"step": step_num, "ts": now, "bytes": size, "by": by, "limit": limit, "tables": tables}

    def _drop_events_before(self, t0: int) -> None:
        """An event still open at a discard (a range around the step boundary) ends up alone in
        the next batch; without its discarded children it would mislead, so it goes too."""
        for table in EVENT_TABLES:
            batches = self.pending.get(table)
            for i, cols in enumerate(batches or ()):
                batches[i] = batch_since(cols, t0)
