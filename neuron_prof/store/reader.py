"""Reading the run store: commit-aware, so a killed capture reads up to its last completed step.

Everything that can be wrong with a run on disk becomes a NeuronProfError that names the file and
says what to do; nothing here unpickles or evaluates anything from the run. This module is the one
boundary where run files become tables, so the checks are made here, by construction: files are
opened as regular files only (``safefile``), never read past what the manifest commits, JSON
documents are checked field by field (``documents``), committed bytes against their checksums,
Arrow tables fully validated, interned ids range-checked. What passes is safe for every reader.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import signal
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from neuron_prof.store import documents
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import cannot_read, open_regular, read_at, read_whole
from neuron_prof.store.schema import (CONFLICT_GLOB, INFLIGHT, INFLIGHT_MAGIC, INFLIGHT_SLOT, INFLIGHT_STATES, JOURNAL_SUFFIX,
                                LOWEST_REFERENCE, MANIFEST, RANK_META, REFERENCES,
                                RUN_META, SCHEMA_VERSION, STEP_RING, STEP_RING_MAGIC, STEP_RING_SLOT, TABLE_SUFFIX,
                                TABLES, row_dtype, schema_of)
from neuron_prof.store.step_ring import intact
from neuron_prof.store.writer import sign

RECORD_HINT = "capture one with `neuron-prof record -o RUN -- python train.py`"


@dataclass(frozen=True)
class Damage:
    """A file of a rank whose damage the reader can name but not read past: the rank reads as
    empty, and the report says so first rather than explaining the absence by a collector left
    off (``_lost_manifest``)."""

    file: Path
    what: str                  # "is missing", "is empty", "holds no complete commit"
    tables: tuple[str, ...]    # the tables whose bytes it left unreadable
    bytes: int


@dataclass
class RankData:
    """One rank's committed tables plus what the manifest says about the capture's health."""

    rank: int
    dir: Path
    meta: dict[str, Any]
    tables: dict[str, pa.Table]
    last_commit: dict[str, Any]
    closed: bool
    ignored_bytes: dict[str, int] = field(default_factory=dict)
    damage: list[Damage] = field(default_factory=list)
    inflight: np.ndarray | None = None
    """For a rank whose capture did not close (killed): the slots of ``collectives.inflight``
    (schema.INFLIGHT_SLOT) that hold a collective; None where there is no such file or the
    capture closed (its tables then hold every collective)."""
    ring_steps: np.ndarray | None = None
    """For a rank whose capture did not close: the step rows of ``steps.ring`` (schema.STEP_RING_SLOT)
    past its last commit, which ``tables["steps"]`` includes; None where there is no such file or
    the capture closed."""

    def table(self, name: str) -> pa.Table:
        """The table with today's columns; a column a run written by an earlier version lacks
        reads as zeros (ids: the empty string; False)."""
        t = self.tables.get(name)
        if t is None:
            return TABLES[name].empty_table()
        for f in TABLES[name]:
            if f.name not in t.column_names:
                t = t.append_column(f, pa.nulls(t.num_rows, f.type).fill_null(False if pa.types.is_boolean(f.type)
                                                                               else 0))
        return t.select(TABLES[name].names)

    def take(self, name: str) -> pa.Table:
        """``table(name)``, handed over: the rank keeps no reference (the big tables are read once,
        into a DataFrame, and their Arrow buffers should not outlive that)."""
        t = self.table(name)
        self.tables.pop(name, None)
        return t


_JSON_LIMIT = 16 << 20  # run.json, rank.json, a conflict note: kilobytes when written by neuron_prof
_MANIFEST_TAIL = 1 << 20  # the last commit is the last complete line: read only the end of the file
_DAMAGED = "the rank folder is damaged: re-record the run (or delete this rank folder)"
_UNREADABLE = "check the disk it is on, or copy the run again"  # an OSError other than no permission


def _read_json(path: Path, what: str, spec: Mapping[str, documents.Check],
               fix: str = "re-record the run or restore the file", required: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        data = read_whole(path, _JSON_LIMIT, fix)
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: missing {what}; this folder is damaged: re-record the run") from None
    doc = documents.parse(data, path, what, fix)
    version = doc.get("schema_version", SCHEMA_VERSION)
    if type(version) is int and version > SCHEMA_VERSION:
        raise NeuronProfError(f"{path}: written by a newer neuron_prof (schema {version}, this one reads "
                              f"{SCHEMA_VERSION}); upgrade neuron_prof")
    documents.check(doc, spec, path, what, fix, required)
    return doc


def _last_commit(path: Path, signed: bool) -> dict[str, Any]:
    """The last complete manifest line. A final line without its newline is torn (the writer was
    killed mid-write) and ignored; a complete line that does not parse, or whose ``check`` does not
    match (``signed``: a run of schema 2 on), is damage."""
    try:
        f = open_regular(path, _DAMAGED)
    except FileNotFoundError:
        return {}
    with f:
        size = os.fstat(f.fileno()).st_size
        start = max(size - _MANIFEST_TAIL, 0)
        tail = read_at(f, start, size - start)
    lines = tail.split(b"\n")[:-1]  # the last element is a torn line or empty
    if start:
        lines = lines[1:]  # began mid-line
    if not lines:
        if start:
            raise NeuronProfError(f"{path}: no complete line in its last {_MANIFEST_TAIL} bytes; {_DAMAGED}")
        return {}
    line = documents.parse(lines[-1], path, "last commit", _DAMAGED)
    documents.check(line, documents.COMMIT, path, "last commit", _DAMAGED, required=("sizes",))
    if signed:
        check = line.get("check")
        if check is None or check != sign(dict(line))["check"]:
            raise NeuronProfError(f"{path}: the last commit's checksum does not match its content; {_DAMAGED}")
        for table in line["sizes"]:
            if table not in line.get("crc", {}):
                raise NeuronProfError(f"{path}: the last commit has no checksum for {table}; {_DAMAGED}")
        for table in line.get("journal", {}):
            if table not in line.get("journal_crc", {}):
                raise NeuronProfError(f"{path}: the last commit has no checksum for the {table} journal; {_DAMAGED}")
    return line


def _read_committed(path: Path, committed: int, crc: int | None) -> tuple[bytes, int]:
    """A stream's or journal's committed bytes, and how many bytes follow them (written after the
    last commit: ignored). Shorter than the commit, or not matching its checksum, is damage."""
    try:
        f = open_regular(path, _DAMAGED)
    except FileNotFoundError:
        if not committed:
            return b"", 0
        raise NeuronProfError(f"{path}: missing, but the manifest commits {committed} bytes of it; "
                              f"{_DAMAGED}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < committed:
            raise NeuronProfError(f"{path}: truncated ({size} of {committed} committed bytes); {_DAMAGED}")
        data = read_at(f, 0, committed)
    if len(data) < committed:
        raise NeuronProfError(f"{path}: truncated while read ({len(data)} of {committed} committed bytes); {_DAMAGED}")
    if crc is not None and zlib.crc32(data) != crc:
        raise NeuronProfError(f"{path}: damaged: its bytes do not match the checksum of their commit; {_DAMAGED}")
    return data, size - committed


def _read_table(path: Path, name: str, committed: int, crc: int | None) -> tuple[pa.Table, int]:
    data, extra = _read_committed(path, committed, crc)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        _check_schema(table.schema, TABLES[name])
        table.validate(full=True)  # offsets and lengths within their buffers, strings UTF-8, before any use
        for column, values in zip(table.column_names, table.columns):  # neuron_prof writes no null
            if values.null_count or pa.types.is_list(values.type) and pc.list_flatten(values).null_count:
                raise pa.ArrowInvalid(f"nulls in column {column}")
    except pa.ArrowException as exc:
        raise NeuronProfError(f"{path}: corrupt table ({str(exc).splitlines()[0][:160]}); {_DAMAGED}") from None
    return table, extra


def _check_schema(schema: pa.Schema, expected: pa.Schema) -> None:
    """Every byte of a stream's schema, decoded and compared here: column names (pyarrow decodes
    a name as UTF-8 when asked, which was a UnicodeDecodeError wherever that came first), each a
    column of this table, once, with its type and its nested field's name; no metadata (neuron_prof
    writes none, and pandas would read its own from there). Columns an earlier version did not
    write may be absent (``RankData.table``); one no version wrote is damage, not a column to skip."""
    if schema.metadata:
        raise pa.ArrowInvalid("schema metadata neuron_prof never writes")
    seen: set[str] = set()
    for i in range(len(schema)):
        f = schema.field(i)
        got = _name(f, f"column {i}'s name")
        if got not in expected.names or got in seen:
            raise pa.ArrowInvalid(f"{'a second' if got in seen else 'an unknown'} column {got!r}")
        seen.add(got)
        want = expected.field(got)
        if not f.type.equals(want.type) or f.metadata:
            raise pa.ArrowInvalid(f"column {got} is not {want.type} as written")
        if pa.types.is_list(want.type):  # type equality ignores the item field's name and metadata
            item = f.type.value_field
            if _name(item, f"column {got}'s item name") != want.type.value_field.name or item.metadata:
                raise pa.ArrowInvalid(f"column {got} is not {want.type} as written")


def _name(f: pa.Field, what: str) -> str:
    """``f``'s name, the UTF-8 text of its bytes, or the damage said as an ArrowInvalid."""
    try:
        return f.name
    except UnicodeDecodeError:
        raise pa.ArrowInvalid(f"{what} is not UTF-8") from None


def _read_journal(path: Path, committed: int, crc: int | None, schema: pa.Schema) -> tuple[pa.Table, int]:
    """Rows journaled since the last compaction, up to the committed size."""
    dtype = row_dtype(schema)
    if committed % dtype.itemsize:
        raise NeuronProfError(f"{path}: committed size {committed} is not a whole number of "
                              f"{dtype.itemsize}-byte rows; {_DAMAGED}")
    data, extra = _read_committed(path, committed, crc)
    rows = np.frombuffer(data, dtype=dtype, count=committed // dtype.itemsize)
    table = pa.Table.from_arrays([pa.array(np.ascontiguousarray(rows[f.name]), type=f.type) for f in schema],
                                 schema=schema)
    return table, extra


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_META
    try:
        os.lstat(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # os.path.lexists would say "missing" for a run.json it may not look at
        raise cannot_read(path, exc, _UNREADABLE) from None
    meta = _read_json(path, "run metadata", documents.RUN_META)
    check = meta.pop("check", None)  # none: written before run.json was signed, read as it is
    if check is not None and sign(dict(meta))["check"] != check:
        raise NeuronProfError(f"{path}: its checksum does not match its content (a changed byte); restore it from "
                              "a copy of the run, or delete it to read the rank folders without it")
    return meta


def _names(folder: Path, pattern: str) -> list[Path]:
    """The entries of a run's folder whose names match ``pattern`` (as ``glob`` would, which
    instead reads a folder it may not list as an empty one)."""
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise cannot_read(folder, exc, _UNREADABLE) from None
    return [folder / n for n in sorted(fnmatch.filter(names, pattern))]


def rank_dirs(run_dir: Path) -> list[Path]:
    """The rank folders in a run directory (a missing directory is a NeuronProfError)."""
    try:
        mode = os.stat(run_dir).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise NeuronProfError(f"{run_dir}: no such run directory; "
                                  f"{RECORD_HINT.replace('RUN', str(run_dir))}") from None
        raise cannot_read(run_dir, exc, _UNREADABLE) from None
    if not stat.S_ISDIR(mode):
        raise NeuronProfError(f"{run_dir}: not a directory; pass the run directory that holds run.json")
    dirs = [p for p in _names(run_dir, "rank-*") if p.name[5:].isdigit() and len(p.name) <= 12]
    modes = {}
    for p in dirs:
        try:
            modes[p] = os.lstat(p).st_mode
        except OSError as exc:
            raise cannot_read(p, exc, _UNREADABLE) from None
        if stat.S_ISLNK(modes[p]):
            raise NeuronProfError(f"{p}: a rank folder that is a symbolic link; neuron_prof reads only the run's own "
                                  "folders: replace it by the folder itself, or delete it")
    return [p for p in dirs if stat.S_ISDIR(modes[p])]


def describe_exit(exit_status: Any) -> str:
    """How a recorded command ended, from run.json's ``exit`` (written by ``record``)."""
    if isinstance(exit_status, dict) and isinstance(exit_status.get("signal"), int):
        sig = exit_status["signal"]
        try:
            return f"was killed by signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"was killed by signal {sig}"
    if isinstance(exit_status, dict) and isinstance(exit_status.get("code"), int):
        return f"exited with code {exit_status['code']}"
    return "did not finish under record (still running, or record itself was stopped)"


@dataclass
class RunFiles:
    """A run directory sorted out before its tables are read."""

    meta: dict[str, Any]
    ranks: list[RankData]
    stale_rank_dirs: list[Path]  # left by an earlier capture into the same directory
    missing_ranks: list[int]     # ranks of the run's world with no folder: died before their first step
    conflicts: list[dict[str, Any]]  # processes that claimed a rank another process owned


def _owner(rank_dir: Path) -> str | None:
    """The run id in a rank folder's rank.json; None if unreadable (read_rank says why)."""
    try:
        return _read_json(rank_dir / RANK_META, "rank metadata", documents.RANK_META).get("run_id")
    except NeuronProfError:
        return None


def read_run(run_dir: Path) -> RunFiles:
    """This run's rank folders (read), and what the capture's health section reports about the
    rest. A run with no rank folder of its own is a NeuronProfError that says how it ended; so is
    any file or folder of it the OS refuses to read (no permission, an I/O error)."""
    try:
        return _read_run(run_dir)
    except OSError as exc:  # the reads below name their path; this is for any one that does not
        raise cannot_read(exc.filename or run_dir, exc, _UNREADABLE) from None


def _read_run(run_dir: Path) -> RunFiles:
    dirs = rank_dirs(run_dir)
    meta = read_run_meta(run_dir)
    world = meta.get("world_size")
    # under `record` every process shares the run id: a folder with another one is an older run's
    shared_id = meta.get("run_id") if meta.get("run_id_scope") == "command" else None
    stale = [d for d in dirs if isinstance(world, int) and int(d.name[5:]) >= world
             or shared_id is not None and _owner(d) not in (shared_id, None)]
    ranks = [read_rank(d) for d in dirs if d not in stale]
    seen: dict[int, Path] = {}
    for rd in ranks:
        if rd.rank in seen:
            raise NeuronProfError(f"{rd.dir}: claims rank {rd.rank}, like {seen[rd.rank]}; one of them is a copy or "
                                  "belongs to another run: delete it")
        seen[rd.rank] = rd.dir
    if not ranks:
        if not meta.get("run_id"):
            raise NeuronProfError(f"{run_dir}: not a neuron_prof run (no rank-NNNNN/ folders); "
                                  f"{RECORD_HINT.replace('RUN', str(run_dir))}")
        how = f"the command {describe_exit(meta.get('exit'))}" if shared_id else "the capture ended"
        raise NeuronProfError(f"{run_dir}: no rank completed a step: {how} during step 0 (before its first "
                              "optimizer step), so nothing was captured; re-run it (its own output says why it ended)")
    if not isinstance(world, int):
        world = max((rd.meta.get("world_size") for rd in ranks if isinstance(rd.meta.get("world_size"), int)),
                    default=len(ranks))
    present = {rd.rank for rd in ranks}
    run_ids = {rd.meta.get("run_id") for rd in ranks} - {None}
    return RunFiles(meta=meta, ranks=ranks, stale_rank_dirs=stale,
                    missing_ranks=[r for r in range(world) if r not in present],
                    conflicts=[n for n in _conflict_notes(run_dir) if n.get("run_id") in run_ids])


def _conflict_notes(run_dir: Path) -> list[dict[str, Any]]:
    notes = []
    fix = "delete the file (it only reports a process that wrote nothing)"
    for path in _names(run_dir, CONFLICT_GLOB):
        notes.append(_read_json(path, "conflict note", documents.CONFLICT, fix, required=("rank", "pid", "argv")))
    return notes


def read_rank(rank_dir: Path) -> RankData:
    meta = _read_json(rank_dir / RANK_META, "rank metadata", documents.RANK_META)
    rank = int(rank_dir.name[5:])
    if meta.get("rank", rank) != rank:
        raise NeuronProfError(f"{rank_dir / RANK_META}: says rank {meta['rank']}, but its folder is {rank_dir.name}; "
                              f"{_DAMAGED}")
    version = meta.get("schema_version", 1)
    signed = version >= 2
    commit = _last_commit(rank_dir / MANIFEST, signed)
    crc = commit.get("crc", {}) if signed else {}
    journal_crc = commit.get("journal_crc", {}) if signed else {}
    tables: dict[str, pa.Table] = {}
    ignored: dict[str, int] = {}
    for name, size in commit.get("sizes", {}).items():
        if name not in TABLES:
            continue  # a table from a newer collector: readers of this version skip it
        tables[name], extra = _read_table(rank_dir / f"{name}{TABLE_SUFFIX}", name, size, crc.get(name))
        if extra:
            ignored[name] = extra
    for name, size in commit.get("journal", {}).items():
        if name not in TABLES:
            continue
        rows, extra = _read_journal(rank_dir / f"{name}{JOURNAL_SUFFIX}", size, journal_crc.get(name),
                                    schema_of(name, version))
        if name not in tables:
            tables[name] = rows
        elif rows.num_rows:  # (an empty journal adds nothing, whatever layout it was read with)
            tables[name] = pa.concat_tables([tables[name], rows])
        if extra:
            ignored[name] = ignored.get(name, 0) + extra
    for suffix in (TABLE_SUFFIX, JOURNAL_SUFFIX):  # written but never committed: killed in step 0
        for path in _names(rank_dir, f"*{suffix}"):
            name = path.name[: -len(suffix)]
            size = path.lstat().st_size
            if name in TABLES and name not in tables and size:
                ignored[name] = ignored.get(name, 0) + size
    rd = RankData(rank=rank, dir=rank_dir, meta=meta, tables=tables, last_commit=commit,
                  closed=bool(commit.get("closed")), ignored_bytes=ignored,
                  damage=[] if commit else _lost_manifest(rank_dir / MANIFEST, ignored))
    if not rd.closed:  # a clean close drained every collective into the table, in flight or not
        rd.inflight = _read_inflight(rank_dir / INFLIGHT)
        _add_ring_steps(rd)
    _check_references(rd)
    return rd


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # what store._TableStream.close writes last


def _lost_manifest(manifest: Path, ignored: Mapping[str, int]) -> list[Damage]:
    """A rank with no commit (its manifest missing, empty or without a complete line) reads as one
    killed in its first step, its tables' bytes ignored. A kill leaves that only while the tables
    are open and the manifest exists (the writer creates it before any table): a missing manifest,
    or a table ended by the end-of-stream marker its close writes, means the commits were lost,
    and with them every table's bytes: damage, said as such."""
    if not ignored:
        return []
    try:
        size = os.lstat(manifest).st_size
    except FileNotFoundError:
        size = None
    closed = False
    for name in ignored:
        try:
            f = open_regular(manifest.parent / f"{name}{TABLE_SUFFIX}", _DAMAGED)
        except FileNotFoundError:
            continue  # a journal's bytes only
        with f:
            start = os.fstat(f.fileno()).st_size - len(_END_OF_STREAM)
            closed |= start > 0 and read_at(f, start, len(_END_OF_STREAM)) == _END_OF_STREAM
    if size is not None and not closed:
        return []
    what = "is missing" if size is None else "is empty" if size == 0 else "holds no complete commit"
    return [Damage(manifest, what, tuple(sorted(ignored)), sum(ignored.values()))]


_RING_SLOTS_LIMIT = 65536


def _read_ring(path: Path, magic: int, slot: np.dtype, what: str, fix: str) -> np.ndarray | None:
    """The slots of a memory-mapped ring a capture leaves in its rank folder (schema.INFLIGHT,
    schema.STEP_RING: a 64-byte header, then fixed slots); None where there is none. Of fixed
    layout, so a file of any other shape is damage, named as such."""
    try:
        data = read_whole(path, 64 + slot.itemsize * _RING_SLOTS_LIMIT, fix)
    except FileNotFoundError:
        return None
    head = np.frombuffer(data[:32], "<i8") if len(data) >= 64 else np.zeros(4, np.int64)
    found, size, count, header = (int(v) for v in head)
    if (found != magic or size != slot.itemsize or header != 64 or count <= 0
            or len(data) != header + size * count):
        raise NeuronProfError(f"{path}: not {what} of this neuron_prof ({len(data)} bytes); {fix}")
    return np.frombuffer(data, slot, count=count, offset=header)


def _read_inflight(path: Path) -> np.ndarray | None:
    """The slots of the in-flight ring a rank's collectives observer maps that hold a collective."""
    slots = _read_ring(path, INFLIGHT_MAGIC, INFLIGHT_SLOT, "an in-flight collectives file",
                       "delete the file to read the run without in-flight collectives")
    if slots is None:
        return None
    return slots[(slots["id"] > 0) & np.isin(slots["state"], list(INFLIGHT_STATES))].copy()


def _add_ring_steps(rd: RankData) -> None:
    """The step ring's whole rows that follow the rank's committed steps (neuron_prof.store.step_ring)
    join its steps table: the steps a kill -9 ended before their commit, up to the first one the
    ring lacks (a torn slot is absent). Their detail, if they had any, was not committed: none is
    active."""
    slots = _read_ring(rd.dir / STEP_RING, STEP_RING_MAGIC, STEP_RING_SLOT, "a step ring file",
                       "delete the file to read the run without the steps after its last commit")
    if slots is None:
        return
    steps = rd.tables.get("steps")
    first = pc.max(steps.column("step")).as_py() + 1 if steps is not None and steps.num_rows else 0
    slots = slots[intact(slots) & (slots["step"] >= first)]
    slots = slots[np.unique(slots["step"], return_index=True)[1]]  # in step order, each step once
    rd.ring_steps = slots[: int(np.sum(slots["step"] == first + np.arange(len(slots))))]
    if not len(rd.ring_steps):
        return
    rows = pa.table({"step": rd.ring_steps["step"], "ts": rd.ring_steps["ts"], "dur": rd.ring_steps["dur"],
                     "active": np.zeros(len(rd.ring_steps), bool), "complete": rd.ring_steps["complete"] != 0},
                    schema=TABLES["steps"])
    rd.tables["steps"] = rows if steps is None else pa.concat_tables([steps, rows.cast(steps.schema)])


def _check_references(rd: RankData) -> None:
    """Interned tables number their rows densely from 0 or 1, and every id another table holds is
    one of them (or 0, the empty string or stack): an id out of range would index past a lookup
    array, or allocate one as large as the id."""
    last = {}
    for interned in LOWEST_REFERENCE:
        ids = rd.table(interned).column("id").to_numpy()
        if len(ids) and not (ids[0] in (0, 1) and np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids)))):
            raise NeuronProfError(f"{rd.dir / (interned + TABLE_SUFFIX)}: its ids are not numbered in order from 0 "
                                  f"or 1; {_DAMAGED}")
        last[interned] = int(ids[-1]) if len(ids) else 0
    strings = rd.table("strings").column("value")
    if pc.count_distinct(strings).as_py() != len(strings):  # the interner writes each once: ids become categories
        raise NeuronProfError(f"{rd.dir / ('strings' + TABLE_SUFFIX)}: holds a string twice; {_DAMAGED}")
    for name in rd.tables:
        for column, interned in REFERENCES[name].items():
            if column not in rd.tables[name].column_names:
                continue  # a run from before the column: it reads as id 0
            values = rd.tables[name].column(column)
            if pa.types.is_list(values.type):
                values = pc.list_flatten(values)
            if not len(values):
                continue
            lo, hi = (v.as_py() for v in pc.min_max(values).values())
            lowest = LOWEST_REFERENCE[interned]
            if lo < lowest or hi > last[interned]:
                bad = lo if lo < lowest else hi
                raise NeuronProfError(f"{rd.dir / (name + TABLE_SUFFIX)}: {column} holds id {bad}, but {interned} has "
                                      f"ids {lowest}..{last[interned]}; {_DAMAGED}")
