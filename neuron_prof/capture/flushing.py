"""What the session's flushes write besides the collectors' rows: the step rows, kept until a
flush commits them and stored in the rank's step ring as each step ends (so a kill -9 loses at
most the step in flight), and the rank's writer, made at the first flush that has data with the
rank's ``rank.json`` and the run's ``run.json``. When a flush happens, and whether this process may
write the rank at all (``ownership``), is the session's to decide.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from neuron_prof.capture.ownership import device_name, open_rank
from neuron_prof.capture.schedule import Schedule
from neuron_prof.store.schema import RUN_META, SCHEMA_VERSION, TABLES, row_dtype
from neuron_prof.store.step_ring import StepRing
from neuron_prof.store.writer import RankWriter, load_json, update_run_meta

STEP_ROW = row_dtype(TABLES["steps"])
StepRow = tuple[int, int, int, bool, bool]  # step, start, duration, active (its detail on disk), complete


class StepJournal:
    """The step rows ended since the last flush, each stored in the rank's step ring as it ends
    (neuron_prof.store.step_ring), once the rank's folder exists to hold the ring."""

    def __init__(self) -> None:
        self.rows: list[StepRow] = []
        self.ring: StepRing | None = None
        self._ring_tried = False

    def add(self, row: StepRow) -> None:
        self.rows.append(row)
        if row[4] and self.ring is not None:  # a complete step: the ring holds it until committed
            self.ring.put(*row)

    def due(self) -> bool:
        """Step rows are committed now, whatever the mode: at the first boundary (the commit
        makes the rank's folder, and with it the step ring), and before the ring would lap a row
        not committed yet (steps far shorter than the background thread's second)."""
        if self.ring is None:
            return not self._ring_tried
        return len(self.rows) >= self.ring.room

    def take(self) -> np.ndarray | None:
        """The rows since the last flush in the steps table's own layout (written as it is)."""
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        return np.array(rows, dtype=STEP_ROW)

    def open_ring(self, writer: RankWriter, failure: Callable[[str, BaseException], None]) -> None:
        """The rank's step ring, made with its folder. A file system that cannot map it leaves a
        failure row: a kill -9 may then lose the last second of step rows."""
        self._ring_tried = True
        try:
            self.ring = StepRing(writer.dir)
        except OSError as exc:
            failure("step ring", OSError(f"{exc}; a kill -9 may lose the last second of step rows"))

    def close(self) -> None:
        """The rank is closed: its tables hold every step, the ring goes."""
        if self.ring is not None:
            self.ring.remove()
            self.ring = None


@dataclass(frozen=True)
class RankOrigin:
    """What a rank's ``rank.json`` and the run's ``run.json`` say of the capture that writes them."""

    run_dir: Path
    run_id: str
    run_id_scope: str  # "command": every process of one record; "process": a profile() of its own
    command: Sequence[str]
    start_ns: int
    clock_offset_ns: int
    collectors: Sequence[str]
    schedule: Schedule | None
    max_buffered_events: int
    max_events: int
    max_bytes: int | None


def open_writer(origin: RankOrigin, rank: int, world: int, stepless: bool, report: bool) -> RankWriter | None:
    """The rank's writer with its ``rank.json``, or None where another process owns the folder
    (``ownership.open_rank``; ``report``: leave a note saying who tried). Rank 0 writes
    ``run.json``; another rank writes it where no rank has (record's own, with rank 0 dead in
    step 0; or none yet)."""
    import torch
    meta = {
        "schema_version": SCHEMA_VERSION, "run_id": origin.run_id, "rank": rank, "world_size": world,
        "pid": os.getpid(), "hostname": socket.gethostname(), "device": device_name(),
        "torch_version": torch.__version__, "python": sys.version.split()[0],
        "clock_offset_ns": origin.clock_offset_ns, "start_ns": origin.start_ns,
        "collectors": list(origin.collectors),
        "schedule": None if origin.schedule is None else vars(origin.schedule),
        "max_buffered_events": origin.max_buffered_events, "max_events": origin.max_events,
        "max_bytes": origin.max_bytes,
        "stepless": stepless,  # a training process of the same run may replace this folder
    }
    writer = open_rank(origin.run_dir, rank, meta, report=report)
    if writer is None:
        return None
    existing = load_json(origin.run_dir / RUN_META)
    if rank == 0 or "world_size" not in existing:
        from neuron_prof.version import __version__
        update_run_meta(origin.run_dir, origin.run_id, {
            "schema_version": SCHEMA_VERSION, "neuron_prof_version": __version__,
            "run_id_scope": origin.run_id_scope, "command": origin.command, "cwd": os.getcwd(),
            "torch_version": torch.__version__, "device": meta["device"], "world_size": world,
            "start_time_ns": origin.start_ns + origin.clock_offset_ns, "hostname": meta["hostname"]},
            replace=rank == 0 or not existing)
    return writer
