"""Writing the run store: append-only Arrow IPC streams, journals, and a commit manifest per rank.

Crash safety comes from the order of writes: data bytes first (Arrow batches, or packed rows in a
table's journal), then one manifest line naming the committed length of every stream and journal.
A ``kill -9`` between the two leaves bytes past the last commit, which readers ignore, so a run
loses at most what came after its last flush (the step in flight). A file shorter than its
committed length is real damage, and readers say so.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from neuron_prof.schema import (JOURNAL_SUFFIX, JOURNALED, MANIFEST, RANK_META, RUN_META, TABLE_SUFFIX, TABLES,
                                row_dtype)


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Readers never see half a JSON file: write aside, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def _converter(type_: pa.DataType) -> Callable[[Any], pa.Array]:
    """numpy column -> Arrow array from its buffer: pyarrow's generic conversion from numpy costs
    ~15x more per call, which adds up over thousands of small batches."""
    if pa.types.is_boolean(type_):
        def convert(values: Any) -> pa.Array:
            bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
            return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(bits)])
    elif pa.types.is_integer(type_):
        dtype = np.dtype(type_.to_pandas_dtype())

        def convert(values: Any) -> pa.Array:
            data = np.ascontiguousarray(values, dtype=dtype)
            return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])
    else:  # strings, lists: small tables
        def convert(values: Any) -> pa.Array:
            return pa.array(values, type=type_)
    return convert


class _TableStream:
    """One ``<table>.arrows`` stream. Each batch goes to the file in a single write, so a kill
    leaves at most one partial message at the end, past the committed size."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self._columns = [(f.name, _converter(f.type)) for f in schema]
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0
        self._write(schema.serialize())

    def _write(self, buf: pa.Buffer) -> None:
        _write_all(self._fd, buf)
        self._size += buf.size

    def write(self, columns: Mapping[str, Any]) -> None:
        arrays = [convert(columns[name]) for name, convert in self._columns]
        self._write(pa.RecordBatch.from_arrays(arrays, schema=self.schema).serialize())

    def size(self) -> int:
        return self._size

    def close(self) -> int:
        """Write the end-of-stream marker; returns the final size."""
        self._write(pa.py_buffer(b"\xff\xff\xff\xff\x00\x00\x00\x00"))
        os.close(self._fd)
        return self._size


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


class _Journal:
    """Rows of a fixed-width table since the last compaction: one packed write per step."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.dtype = row_dtype(schema)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._pending: list[np.ndarray] = []
        self.size = 0

    def write(self, columns: Mapping[str, Any]) -> None:
        n = len(columns["ts"])
        rows = np.empty(n, dtype=self.dtype)
        for name in self.dtype.names:
            rows[name] = columns[name]
        _write_all(self._fd, rows.view(np.uint8))
        self._pending.append(rows)
        self.size += rows.nbytes

    def take(self) -> np.ndarray | None:
        """Everything journaled since the last ``take``, for the Arrow stream."""
        if not self._pending:
            return None
        rows = np.concatenate(self._pending)
        self._pending = []
        self.size = 0  # committed from now on as Arrow rows; the file is emptied after the commit
        return rows

    def truncate(self) -> None:
        os.ftruncate(self._fd, 0)

    def close(self) -> None:
        os.close(self._fd)


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
        self._journals: dict[str, _Journal] = {}
        self._manifest = open(rank_dir / MANIFEST, "a", buffering=1)
        self._commits = 0

    def append(self, table: str, columns: Mapping[str, Any]) -> None:
        if table in JOURNALED:
            journal = self._journals.get(table)
            if journal is None:
                journal = self._journals[table] = _Journal(self.dir / f"{table}{JOURNAL_SUFFIX}", TABLES[table])
            journal.write(columns)
        else:
            self._stream(table).write(columns)

    def journal_bytes(self) -> int:
        return sum(j.size for j in self._journals.values())

    def commit(self, step: int, counters: Mapping[str, Any]) -> None:
        """Declare everything written so far readable (one manifest line)."""
        self._write_manifest(step, counters, {name: s.size() for name, s in self._streams.items()})

    def compact(self, step: int, counters: Mapping[str, Any]) -> None:
        """Move journaled rows into the Arrow streams. Crash-safe by order: Arrow bytes, then a
        manifest line that counts them and no journal, then the journals are emptied."""
        for table, journal in self._journals.items():
            rows = journal.take()
            if rows is not None:
                self._stream(table).write({name: rows[name] for name in rows.dtype.names})
        self.commit(step, counters)
        for journal in self._journals.values():
            journal.truncate()

    def close(self, step: int, counters: Mapping[str, Any]) -> None:
        self.compact(step, counters)
        sizes = {name: s.close() for name, s in self._streams.items()}
        for journal in self._journals.values():
            journal.close()
        self._write_manifest(step, counters, sizes, closed=True)
        self._manifest.close()

    def _stream(self, table: str) -> _TableStream:
        stream = self._streams.get(table)
        if stream is None:
            stream = self._streams[table] = _TableStream(self.dir / f"{table}{TABLE_SUFFIX}", TABLES[table])
        return stream

    def _write_manifest(self, step: int, counters: Mapping[str, Any], sizes: Mapping[str, int],
                        closed: bool = False) -> None:
        self._commits += 1
        line = {"commit": self._commits, "t": time.monotonic_ns(), "step": step, "sizes": dict(sizes),
                "journal": {name: j.size for name, j in self._journals.items()}, **counters}
        if closed:
            line["closed"] = True
        self._manifest.write(json.dumps(line) + "\n")


def write_run_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    write_json_atomic(run_dir / RUN_META, meta)
