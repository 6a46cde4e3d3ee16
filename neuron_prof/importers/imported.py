"""What the importers (``kineto``: torch.profiler traces; ``torch_trace``: TORCH_TRACE compile
logs) share: the new run they write into, its metadata, and reading numbers from files that
are someone else's."""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.schema import SCHEMA_VERSION, rank_dir_name
from neuron_prof.store.writer import RankWriter, write_run_meta


def number(value: Any, default: int) -> int:
    """An integer of the imported file (an int64 column), or ``default`` for anything else: a
    string, a float that is not finite, a number past int64."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return n if -(1 << 63) <= n < (1 << 63) else default


def check_new(run_dir: Path) -> None:
    """An import writes a new run: never into a directory that holds anything."""
    if run_dir.exists() and any(run_dir.iterdir()):
        raise NeuronProfError(f"{run_dir}: exists and is not empty; import into a new directory")


@dataclass
class ImportedRun:
    """The run an import writes: ``source`` (the file or folder it came from) and ``kind`` name it
    in the run's command, ``host``/``device``/``torch_version`` when the source says them."""

    run_dir: Path
    source: Path
    kind: str
    world_size: int = 1
    host: str = "unknown"
    device: str = "unknown"
    torch_version: str = "unknown"

    def __post_init__(self) -> None:
        self.run_id = uuid.uuid4().hex

    def write_meta(self, start_time_ns: int | None = None) -> None:
        """run.json; ``start_time_ns``: when the source's capture began (wall clock), if known."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_run_meta(self.run_dir, {
            "schema_version": SCHEMA_VERSION, "run_id": self.run_id, "run_id_scope": "process",
            "command": [self.kind, str(self.source.resolve())], "cwd": os.getcwd(),
            "torch_version": self.torch_version, "device": self.device, "world_size": self.world_size,
            "hostname": self.host, "imported_from": str(self.source.resolve()),
            **({"start_time_ns": start_time_ns} if start_time_ns is not None else {})})

    def rank(self, rank: int, start_ns: int, clock_offset_ns: int = 0) -> RankWriter:
        """The writer of one rank's folder, its rank.json written."""
        return RankWriter(self.run_dir / rank_dir_name(rank), {
            "schema_version": SCHEMA_VERSION, "run_id": self.run_id, "rank": rank, "world_size": self.world_size,
            "pid": 0, "hostname": self.host, "device": self.device, "torch_version": self.torch_version,
            "python": "unknown", "clock_offset_ns": clock_offset_ns, "start_ns": max(start_ns, 0),
            "collectors": [f"{self.kind} import"], "schedule": None, "stepless": False})
