"""Always-on capture's dump path (neuron_prof.capture.always_on says when dumps happen): the detail
of the last sampled steps held in a ``DetailRing`` between flushes, and what a dump adds to the
flush that writes it (the ring's rows, ``dumped_steps``, one ``dumps`` row per thread). Which
steps are sampled is ``windows``'; the flush itself is the session's.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from neuron_prof.capture.always_on import AlwaysOn, DetailRing
from neuron_prof.capture.buffer import DETAIL_TABLES, CaptureBuffer
from neuron_prof.recording.api import Recorder
from neuron_prof.store.schema import Frame


class SampledDetail:
    """The sampled steps' detail: into the ring at each flush, out of it into a dump's flush."""

    def __init__(self, settings: AlwaysOn) -> None:
        self.ring = DetailRing(settings.max_ring_rows)
        self.sampled: deque[tuple[int, int]] = deque(maxlen=settings.ring_steps)
        """(step, start) of the completed sampled steps whose detail the ring holds, oldest first."""
        self.dumping = False  # the flush in progress writes a dump

    def keep(self, step: int, start: int) -> None:
        """``step`` (begun at ``start``) is a completed sampled step: the ring keeps the detail of
        the last ``ring_steps`` such steps."""
        self.sampled.append((step, start))
        self.ring.trim(self.sampled[0][1])

    def into_ring(self, buffer: CaptureBuffer, on_demand: bool, step_start: int) -> None:
        """This flush's detail rows go to the ring (those of a step captured ``on_demand`` stay
        for the writer), or (a dump) the ring's to the writer, with the step in flight's (begun
        at ``step_start``)."""
        pending = buffer.pending
        if not self.dumping:
            if not on_demand:
                self.ring.add({t: pending.pop(t) for t in DETAIL_TABLES if t in pending})
            return
        detail = {t: pending.pop(t) for t in DETAIL_TABLES if t in pending}
        since = self.sampled[0][1] if self.sampled else step_start
        for table, batches in self.ring.take(since).items():
            pending[table].extend(batches)
        self.sampled.clear()
        for table, batches in detail.items():
            pending[table].extend(batches)
        if self.ring.dropped_rows:
            buffer.dropped["ring"] += self.ring.dropped_rows
            self.ring.dropped_rows = 0

    def add_dump_rows(self, rec: Recorder, buffer: CaptureBuffer, reason: str,
                      stacks: list[tuple[int, list[Frame]]], step: int) -> tuple[int, int]:
        """A dump's own rows, made at ``step`` (the step in flight): ``dumped_steps`` names the
        sampled steps it writes whole, and one ``dumps`` row per thread in ``stacks``. Returns
        (when, the first step it covers)."""
        first = self.sampled[0][0] if self.sampled else step
        now = time.monotonic_ns()
        if self.sampled:
            buffer.pending["dumped_steps"].append({
                "ts": np.full(len(self.sampled), now, np.int64),
                "step": np.array([s for s, _ in self.sampled], np.int32)})
        buffer.pending["dumps"].append({
            "ts": np.full(len(stacks), now, np.int64), "reason": np.full(len(stacks), rec.intern(reason), np.int32),
            "first_step": np.full(len(stacks), first, np.int32),
            "last_step": np.full(len(stacks), step, np.int32),
            "tid": np.array([tid for tid, _ in stacks], np.int64),
            "stack": np.array([rec.intern_stack(frames) for _, frames in stacks], np.int32)})
        return now, first
