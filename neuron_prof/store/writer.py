"""Writing the run store: append-only Arrow IPC streams, journals, and a commit manifest per rank.

Crash safety comes from the order of writes: data bytes first (Arrow batches, or packed rows in a
table's journal), then one manifest line naming the committed length of every stream and journal.
A ``kill -9`` between the two leaves bytes past the last commit, which readers ignore, so a run
loses at most what came after its last flush (the step in flight). A file shorter than its
committed length is real damage, and readers say so.

Integrity: each manifest line carries the CRC-32 of every stream's and journal's committed bytes
(kept as a running value: the commit costs no re-read) and a ``check``, the CRC-32 of the line
itself, so a flipped byte anywhere in what a reader uses is reported as damage, never read as
different numbers. ``run.json`` carries a ``check`` of its own (:func:`write_run_meta`).

Ownership: a writer claims its rank folder with an OS lock (``flock`` on ``.writer.lock``) held for
its lifetime and released by the OS if the process dies, and stamps ``rank.json`` with its run id.
A folder is replaced only when no live process holds it and it belongs to another (older) run (or
to a process of this run that completed no step); a second process of the same run never touches
it otherwise (``RankClaimed``).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import atomic_output, read_whole
from neuron_prof.store.schema import (JOURNAL_SUFFIX, JOURNALED, MANIFEST, RANK_LOCK, RANK_META, RUN_META, TABLE_SUFFIX,
                                TABLES, conflict_note_name, row_dtype)


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Readers never see half a JSON file, and a link left at ``path`` is replaced, never written
    through: a new file renamed over it."""
    with atomic_output(path) as f:
        f.write(json.dumps(data, indent=2, default=str).encode())


_WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
COMPACT_BATCH_BYTES = 16 << 20


def _converter(type_: pa.DataType) -> Callable[[Any], pa.Array]:
    """numpy column -> Arrow array from its buffer: pyarrow's generic conversion from numpy costs
    ~15x more per call, which adds up over thousands of small batches."""
    if pa.types.is_boolean(type_):
        def convert(values: Any) -> pa.Array:
            bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
            return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(bits)])
    elif pa.types.is_integer(type_) or pa.types.is_floating(type_):
        dtype = np.dtype(type_.to_pandas_dtype())

        def convert(values: Any) -> pa.Array:
            data = np.ascontiguousarray(values, dtype=dtype)
            return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])
    elif pa.types.is_string(type_):
        # strings and lists from buffers too: pyarrow's conversion of Python objects first imports
        # pandas (to ask whether they are pandas objects), 0.3 s on the training thread at the first
        # flush, which in a distributed job the other ranks spend waiting in the next collective
        def convert(values: Any) -> pa.Array:
            data = [str(v).encode("utf-8", "replace") for v in values]
            offsets = np.zeros(len(data) + 1, np.int32)
            np.cumsum([len(b) for b in data], out=offsets[1:])
            return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])
    elif pa.types.is_list(type_) and pa.types.is_integer(type_.value_type):
        item = _converter(type_.value_type)
        dtype = np.dtype(type_.value_type.to_pandas_dtype())

        def convert(values: Any) -> pa.Array:
            parts = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
            offsets = np.zeros(len(parts) + 1, np.int32)
            np.cumsum([len(p) for p in parts], out=offsets[1:])
            flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
            return pa.Array.from_buffers(type_, len(parts), [None, pa.py_buffer(offsets)], children=[item(flat)])
    else:
        raise TypeError(f"no column converter for {type_}")
    return convert


class _TableStream:
    """One ``<table>.arrows`` stream. Each batch goes to the file in a single write, so a kill
    leaves at most one partial message at the end, past the committed size."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self._columns = [(f.name, _converter(f.type)) for f in schema]
        self._fd = os.open(path, _WRITE_NEW | os.O_TRUNC, 0o644)
        self._size = 0
        self.crc = 0
        self._write(schema.serialize())

    def _write(self, buf: pa.Buffer) -> None:
        _write_all(self._fd, buf)
        self._size += buf.size
        self.crc = zlib.crc32(buf, self.crc)

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
    """Rows of a fixed-width table since the last compaction: one packed write per step. The rows
    are not kept in memory as well: compaction reads them back from the file (page cache), so a
    capture's resident memory does not climb by every step's rows between compactions (which
    would read as the process growing)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.dtype = row_dtype(schema)
        self._same = self.dtype  # the dtype object of the rows last written (see write)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o644)
        self.size = 0
        self.crc = 0

    def write(self, columns: Mapping[str, Any] | np.ndarray) -> None:
        """``columns``: the table's columns, or its rows already in this journal's layout (what
        the collectors hand over at every step: written from their own buffer, no copy)."""
        if isinstance(columns, np.ndarray) and (columns.dtype is self._same or columns.dtype == self.dtype):
            self._same = columns.dtype  # a collector's rows come in one dtype object: compared once (1 us)
            rows = columns if columns.flags.c_contiguous else np.ascontiguousarray(columns)
        else:
            rows = np.empty(len(columns[self.dtype.names[0]]), dtype=self.dtype)
            for name in self.dtype.names:
                rows[name] = columns[name]
        written = os.write(self._fd, rows)
        if written < rows.nbytes:  # a short write (a signal, a nearly full disk): the rest
            _write_all(self._fd, rows.view(np.uint8)[written:])
        self.size += rows.nbytes
        self.crc = zlib.crc32(rows, self.crc)

    def take(self) -> Iterator[np.ndarray]:
        """Everything journaled since the last ``take``, for the Arrow stream, in batches of at
        most ``COMPACT_BATCH_BYTES``: a journal moved at close can be hundreds of MB, and one
        batch (in three copies: read, columns, Arrow message) is all that is in memory at once."""
        size, self.size, self.crc = self.size, 0, 0  # committed from now on as Arrow rows; the file is emptied after the commit
        batch = max(COMPACT_BATCH_BYTES // self.dtype.itemsize, 1) * self.dtype.itemsize
        for offset in range(0, size, batch):
            want = min(batch, size - offset)
            data = os.pread(self._fd, want, offset)
            if len(data) != want:
                raise OSError(f"journal {self._fd}: read {len(data)} of {want} bytes back at {offset}")
            yield np.frombuffer(data, dtype=self.dtype)

    def truncate(self) -> None:
        os.ftruncate(self._fd, 0)

    def close(self) -> None:
        os.close(self._fd)


def load_json(path: Path) -> dict[str, Any]:
    """A JSON object the writer side only consults (whose is this folder?): anything unreadable
    is as good as absent, since it is about to be replaced or was never ours."""
    try:
        data = json.loads(read_whole(path, 1 << 20))  # no link, FIFO or device
    except (OSError, ValueError, RecursionError, NeuronProfError):
        return {}
    return data if isinstance(data, dict) else {}


class RankClaimed(Exception):
    """Another process owns the rank folder: a live one holds it (``live``), or a finished process
    of the same run wrote it. ``holder`` is that process's rank.json (may be empty if unreadable)."""

    def __init__(self, rank_dir: Path, holder: Mapping[str, Any], live: bool) -> None:
        self.rank_dir, self.holder, self.live = rank_dir, dict(holder), live
        whose = f"pid {holder.get('pid', '?')}" + (f" on {holder['hostname']}" if holder.get("hostname") else "")
        super().__init__(f"{rank_dir.name} is {'held by the live' if self.live else 'already written by'} "
                         f"process {whose}")


def _claim(rank_dir: Path, run_id: str) -> int:
    """Lock ``rank_dir`` for this process; the lock's file descriptor. Raises RankClaimed."""
    fd = os.open(rank_dir / RANK_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RankClaimed(rank_dir, load_json(rank_dir / RANK_META), live=True) from None
    except OSError:  # a file system without locks (some network mounts): the run id still guards it
        pass
    holder = load_json(rank_dir / RANK_META)
    # a finished process of this run wrote it: its data stays, unless that process completed no
    # step (one that ran a few ops before the trainer started, say): a training rank replaces it
    if holder.get("run_id") == run_id and not holder.get("stepless"):
        os.close(fd)
        raise RankClaimed(rank_dir, holder, live=False)
    return fd


class RankWriter:
    """The tables of one rank. Not thread-safe: the session calls it from one thread at a time.

    Creating one claims the folder (``RankClaimed`` if another process owns it); ``rank_meta``
    must carry the writer's ``run_id``.
    """

    def __init__(self, rank_dir: Path, rank_meta: Mapping[str, Any]) -> None:
        self.dir = rank_dir
        if rank_dir.is_symlink():  # never a folder of ours: writing through it would write elsewhere
            rank_dir.unlink()
        rank_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _claim(rank_dir, rank_meta["run_id"])
        for stale in rank_dir.iterdir():  # an older run's capture, no longer written by anyone
            if stale.name != RANK_LOCK and (stale.is_symlink() or not stale.is_dir()):  # others may wait on the lock
                stale.unlink()
        write_json_atomic(rank_dir / RANK_META, rank_meta)
        self._streams: dict[str, _TableStream] = {}
        self._journals: dict[str, _Journal] = {}
        self._manifest_fd = os.open(rank_dir / MANIFEST, _WRITE_NEW | os.O_APPEND, 0o644)
        self._commits = 0
        self._manifest_bytes = 0
        self._streams_seen: tuple[int, ...] = ()  # the stream sizes _streams_json is for
        self._streams_json = ("{}", "{}")  # the line's "sizes" and "crc" of those streams

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

    def side_file(self, name: str) -> int:
        """A new, empty file of the folder outside the manifest, for a collector to map (the
        in-flight collectives ring): an fd the caller closes."""
        return os.open(self.dir / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)

    def bytes_written(self) -> int:
        """What this rank's folder holds now: every stream, journal and the manifest (the session's
        disk budget measures this). Sizes the writer already knows, the manifest's too: a text
        file's ``tell`` costs more than the commit."""
        return sum(s.size() for s in self._streams.values()) + self.journal_bytes() + self._manifest_bytes

    def commit(self, step: int, counters: Mapping[str, Any]) -> None:
        """Declare everything written so far readable (one manifest line)."""
        self._write_manifest(step, counters)

    def compact(self, step: int, counters: Mapping[str, Any]) -> None:
        """Move journaled rows into the Arrow streams. Crash-safe by order: Arrow bytes, then a
        manifest line that counts them and no journal, then the journals are emptied."""
        for table, journal in self._journals.items():
            for rows in journal.take():
                self._stream(table).write({name: rows[name] for name in rows.dtype.names})
        self.commit(step, counters)
        for journal in self._journals.values():
            journal.truncate()

    def close(self, step: int, counters: Mapping[str, Any]) -> None:
        self.compact(step, counters)
        for stream in self._streams.values():
            stream.close()
        for journal in self._journals.values():
            journal.close()
        self._write_manifest(step, counters, closed=True)
        os.close(self._manifest_fd)
        os.close(self._lock_fd)  # the folder is this run's for good; rank.json says whose

    def _stream(self, table: str) -> _TableStream:
        stream = self._streams.get(table)
        if stream is None:
            stream = self._streams[table] = _TableStream(self.dir / f"{table}{TABLE_SUFFIX}", TABLES[table])
        return stream

    def _write_manifest(self, step: int, counters: Mapping[str, Any], closed: bool = False) -> None:
        """One line: the JSON text of ``{"commit", "t", "step", "sizes", "journal", **counters,
        ["closed"], "crc", "journal_crc"}`` (each stream's and journal's committed size and the
        CRC-32 of those bytes), signed (see :func:`sign`). It is written at every step boundary, so
        it is put together from parts rather than dumped whole (half the time: 42 -> 23 us at the
        64-wide MLP's boundary): the streams' part, which changes only when a stream grows, is
        kept, the journals' is formatted directly, and the text is exactly what ``json.dumps``
        gives the same line, which is what a reader checks the ``check`` against
        (tests/test_damaged_runs.py holds it to that). ``counters``' keys are plain names (no JSON
        escaping), none of the line's own."""
        self._commits += 1
        sizes = tuple([s.size() for s in self._streams.values()])
        if sizes != self._streams_seen:  # sizes only grow: the same sizes are the same bytes
            self._streams_seen = sizes
            self._streams_json = (_json_ints(dict(zip(self._streams, sizes))),
                                  _json_ints({name: s.crc for name, s in self._streams.items()}))
        journals = self._journals.items()
        rest = "".join([f', "{key}": {_json_value(value)}' for key, value in counters.items()])
        if closed:
            rest += ', "closed": true'
        sizes_text = ", ".join([f'"{n}": {j.size}' for n, j in journals])
        crcs_text = ", ".join([f'"{n}": {j.crc}' for n, j in journals])
        text = (f'{{"commit": {self._commits}, "t": {time.monotonic_ns()}, "step": {step}, '
                f'"sizes": {self._streams_json[0]}, "journal": {{{sizes_text}}}{rest}, '
                f'"crc": {self._streams_json[1]}, "journal_crc": {{{crcs_text}}}}}').encode()
        line = b'%s, "check": %d}\n' % (text[:-1], zlib.crc32(text))
        _write_all(self._manifest_fd, line)
        self._manifest_bytes += len(line)


def _json_ints(values: Mapping[str, int]) -> str:
    """``json.dumps(values)`` for table names (which need no escaping) to ints, a few times faster."""
    return "{" + ", ".join([f'"{name}": {v}' for name, v in values.items()]) + "}"


def _json_value(value: Any) -> str:
    """``json.dumps(value)``, formatted directly for what a commit's counters hold at every step
    (None, an int, a table name -> count map): ``json.dumps`` cost 13 us of the boundary."""
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    if type(value) is dict and all(type(k) is str and k.isascii() and k.isidentifier() and type(v) is int
                                   for k, v in value.items()):
        return _json_ints(value)
    return json.dumps(value)


def sign(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` with its ``check``, last: the CRC-32 of its JSON text without it (what a reader
    recomputes from the parsed line: ``json`` keeps the key order)."""
    line["check"] = zlib.crc32(_unsigned_text(line).encode())
    return line


def _unsigned_text(line: dict[str, Any]) -> str:
    """The JSON text a ``check`` is the CRC-32 of: ``line`` without its check (taken out)."""
    line.pop("check", None)
    return json.dumps(line)


def write_run_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    """run.json, signed like a manifest line (:func:`sign`: its ``check`` last), so a changed byte
    in its command or torch version reads as damage. Signed as a reader parses it back (values
    JSON does not hold are written as their ``str``)."""
    doc = json.loads(json.dumps({k: v for k, v in meta.items() if k != "check"}, default=str))
    write_json_atomic(run_dir / RUN_META, sign(doc))


def update_run_meta(run_dir: Path, run_id: str, fields: Mapping[str, Any], *, replace: bool) -> None:
    """Merge ``fields`` into run.json if it is this run's; another run's, or none, is replaced by
    ``fields`` alone if ``replace`` (else left as it is)."""
    meta = load_json(run_dir / RUN_META)
    if meta.get("run_id") != run_id:
        if not replace:
            return
        meta = {}
    write_run_meta(run_dir, {**meta, **fields, "run_id": run_id})


def run_ranks(run_dir: Path, run_id: str) -> list[int]:
    """The ranks whose folder this run has claimed (written or being written)."""
    ranks = []
    for d in sorted(run_dir.glob("rank-*")):
        meta = load_json(d / RANK_META) if d.is_dir() and d.name[5:].isdigit() else {}
        if meta.get("run_id") == run_id:
            ranks.append(int(d.name[5:]))
    return ranks


def write_conflict_note(run_dir: Path, rank: int, run_id: str, claim: RankClaimed) -> Path:
    """Leave word that this process wanted ``rank`` and wrote nothing there (readers list it).
    ``run_id``: the run of the folder it conflicted with, so the note goes with that capture."""
    path = run_dir / conflict_note_name(rank, os.getpid())
    write_json_atomic(path, {
        "run_id": run_id, "rank": rank, "pid": os.getpid(), "hostname": socket.gethostname(),
        "argv": list(getattr(sys, "orig_argv", sys.argv)), "time_ns": time.time_ns(),
        "holder_pid": claim.holder.get("pid"), "holder_hostname": claim.holder.get("hostname"),
        "live": claim.live})
    return path
