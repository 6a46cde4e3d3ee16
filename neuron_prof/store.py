"""Writing the run store: append-only Arrow IPC streams plus a commit manifest per rank.

Crash safety comes from the order of writes: table bytes first, then one manifest line naming
the committed length of every table. A ``kill -9`` between the two leaves bytes past the last
commit, which readers ignore, so a run loses at most what came after its last flush (the last
completed step). A table shorter than its committed length is real damage, and readers say so.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import pyarrow as pa

from neuron_prof.schema import MANIFEST, RANK_META, RUN_META, TABLE_SUFFIX, TABLES


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Readers never see half a JSON file: write aside, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


class _TableStream:
    """One open ``<table>.arrows`` stream; batches are written straight to the file descriptor."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self._file: BinaryIO = open(path, "wb", buffering=0)
        self._writer = pa.ipc.new_stream(self._file, schema)

    def write(self, columns: Mapping[str, Any]) -> None:
        arrays = [pa.array(columns[f.name], type=f.type) for f in self.schema]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def size(self) -> int:
        return self._file.tell()

    def close(self) -> int:
        """Write the end-of-stream marker; returns the final size."""
        self._writer.close()
        size = self._file.tell()
        self._file.close()
        return size


class RankWriter:
    """The tables of one rank. Not thread-safe: the session calls it from one thread at a time."""

    def __init__(self, rank_dir: Path, rank_meta: Mapping[str, Any]) -> None:
        self.dir = rank_dir
        rank_dir.mkdir(parents=True, exist_ok=True)
        for stale in rank_dir.iterdir():  # a previous capture into the same folder is replaced
            if stale.is_file():
                stale.unlink()
        write_json_atomic(rank_dir / RANK_META, rank_meta)
        self._streams: dict[str, _TableStream] = {}
        self._manifest = open(rank_dir / MANIFEST, "a", buffering=1)
        self._commits = 0

    def append(self, table: str, columns: Mapping[str, Any]) -> None:
        stream = self._streams.get(table)
        if stream is None:
            stream = self._streams[table] = _TableStream(self.dir / f"{table}{TABLE_SUFFIX}", TABLES[table])
        stream.write(columns)

    def commit(self, step: int, counters: Mapping[str, Any]) -> None:
        """Declare everything written so far readable (one manifest line)."""
        self._write_manifest(step, counters, {name: s.size() for name, s in self._streams.items()})

    def close(self, step: int, counters: Mapping[str, Any]) -> None:
        sizes = {name: s.close() for name, s in self._streams.items()}
        self._write_manifest(step, counters, sizes, closed=True)
        self._manifest.close()

    def _write_manifest(self, step: int, counters: Mapping[str, Any], sizes: Mapping[str, int],
                        closed: bool = False) -> None:
        self._commits += 1
        line = {"commit": self._commits, "t": time.monotonic_ns(), "step": step, "sizes": dict(sizes),
                **counters}
        if closed:
            line["closed"] = True
        self._manifest.write(json.dumps(line) + "\n")


def write_run_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    write_json_atomic(run_dir / RUN_META, meta)
