"""Reading the run store: commit-aware, so a killed capture reads up to its last completed step.

Everything that can be wrong with a run on disk becomes a NeuronProfError that names the file and
says what to do; nothing here unpickles or evaluates anything from the run.
"""
from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from neuron_prof.errors import NeuronProfError
from neuron_prof.schema import (CONFLICT_GLOB, JOURNAL_SUFFIX, MANIFEST, RANK_META, RUN_META, SCHEMA_VERSION,
                                TABLE_SUFFIX, TABLES, row_dtype)

RECORD_HINT = "capture one with `neuron-prof record -o RUN -- python train.py`"


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

    def table(self, name: str) -> pa.Table:
        """The table with today's columns; a column a run written by an earlier version lacks
        reads as zeros (ids: the empty string)."""
        t = self.tables.get(name)
        if t is None:
            return TABLES[name].empty_table()
        for f in TABLES[name]:
            if f.name not in t.column_names:
                t = t.append_column(f, pa.nulls(t.num_rows, f.type).fill_null(0))
        return t.select(TABLES[name].names)

    def take(self, name: str) -> pa.Table:
        """``table(name)``, handed over: the rank keeps no reference (the big tables are read once,
        into a DataFrame, and their Arrow buffers should not outlive that)."""
        t = self.table(name)
        self.tables.pop(name, None)
        return t


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: missing {what}; this folder is damaged: re-record the run") from None
    except (OSError, ValueError) as exc:
        raise NeuronProfError(f"{path}: unreadable {what} ({exc}); re-record the run or restore the file") from None
    if not isinstance(data, dict):
        raise NeuronProfError(f"{path}: {what} is not a JSON object; re-record the run or restore the file")
    version = data.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise NeuronProfError(f"{path}: written by a newer neuron_prof (schema {version}, this one reads "
                              f"{SCHEMA_VERSION}); upgrade neuron_prof")
    return data


def _last_commit(path: Path) -> dict[str, Any]:
    """The last complete manifest line; a torn final line (killed mid-write) is ignored."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return {}
    for raw in reversed(lines):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and isinstance(line.get("sizes"), dict):
            return line
    return {}


_DAMAGED = "the rank folder is damaged: re-record the run (or delete this rank folder)"


def _read_committed(path: Path, committed: int) -> bytes:
    """A stream's or journal's bytes; shorter than the manifest's commit means damage."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not committed:
            return b""
        raise NeuronProfError(f"{path}: missing, but the manifest commits {committed} bytes of it; {_DAMAGED}") from None
    if len(data) < committed:
        raise NeuronProfError(f"{path}: truncated ({len(data)} of {committed} committed bytes); {_DAMAGED}")
    return data


def _read_table(path: Path, committed: int) -> tuple[pa.Table, int]:
    data = _read_committed(path, committed)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data[:committed])).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise NeuronProfError(f"{path}: corrupt table ({exc}); re-record the run (or delete this rank folder)") from None
    return table, len(data) - committed


def _read_journal(path: Path, committed: int, schema: pa.Schema) -> tuple[pa.Table, int]:
    """Rows journaled since the last compaction, up to the committed size."""
    data = _read_committed(path, committed)
    dtype = row_dtype(schema)
    if committed % dtype.itemsize:
        raise NeuronProfError(f"{path}: committed size {committed} is not a whole number of "
                              f"{dtype.itemsize}-byte rows; {_DAMAGED}")
    rows = np.frombuffer(data, dtype=dtype, count=committed // dtype.itemsize)
    table = pa.Table.from_arrays([pa.array(np.ascontiguousarray(rows[f.name]), type=f.type) for f in schema],
                                 schema=schema)
    return table, len(data) - committed


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_META
    return _read_json(path, "run metadata") if path.exists() else {}


def rank_dirs(run_dir: Path) -> list[Path]:
    """The rank folders in a run directory (a missing directory is a NeuronProfError)."""
    if not run_dir.exists():
        raise NeuronProfError(f"{run_dir}: no such run directory; {RECORD_HINT.replace('RUN', str(run_dir))}")
    if not run_dir.is_dir():
        raise NeuronProfError(f"{run_dir}: not a directory; pass the run directory that holds run.json")
    return sorted(p for p in run_dir.glob("rank-*") if p.is_dir() and p.name[5:].isdigit())


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
        return _read_json(rank_dir / RANK_META, "rank metadata").get("run_id")
    except NeuronProfError:
        return None


def read_run(run_dir: Path) -> RunFiles:
    """This run's rank folders (read), and what the capture's health section reports about the
    rest. A run with no rank folder of its own is a NeuronProfError that says how it ended."""
    dirs = rank_dirs(run_dir)
    meta = read_run_meta(run_dir)
    world = meta.get("world_size")
    # under `record` every process shares the run id: a folder with another one is an older run's
    shared_id = meta.get("run_id") if meta.get("run_id_scope") == "command" else None
    stale = [d for d in dirs if isinstance(world, int) and int(d.name[5:]) >= world
             or shared_id is not None and _owner(d) not in (shared_id, None)]
    ranks = [read_rank(d) for d in dirs if d not in stale]
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
    for path in sorted(run_dir.glob(CONFLICT_GLOB)):
        if not path.is_file():
            continue
        note = _read_json(path, "conflict note")
        if not (isinstance(note.get("rank"), int) and isinstance(note.get("pid"), int)
                and isinstance(note.get("argv"), list)):
            raise NeuronProfError(f"{path}: conflict note without rank, pid and argv; delete the file "
                                  "(it only reports a process that wrote nothing)")
        notes.append(note)
    return notes


def read_rank(rank_dir: Path) -> RankData:
    meta = _read_json(rank_dir / RANK_META, "rank metadata")
    commit = _last_commit(rank_dir / MANIFEST)
    tables: dict[str, pa.Table] = {}
    ignored: dict[str, int] = {}
    for name, size in commit.get("sizes", {}).items():
        if name not in TABLES:
            continue  # a table from a newer collector: readers of this version skip it
        tables[name], extra = _read_table(rank_dir / f"{name}{TABLE_SUFFIX}", int(size))
        if extra:
            ignored[name] = extra
    for name, size in commit.get("journal", {}).items():
        if name not in TABLES:
            continue
        rows, extra = _read_journal(rank_dir / f"{name}{JOURNAL_SUFFIX}", int(size), TABLES[name])
        tables[name] = pa.concat_tables([tables[name], rows]) if name in tables else rows
        if extra:
            ignored[name] = ignored.get(name, 0) + extra
    for suffix in (TABLE_SUFFIX, JOURNAL_SUFFIX):  # written but never committed: killed in step 0
        for path in rank_dir.glob(f"*{suffix}"):
            name = path.name[: -len(suffix)]
            if name in TABLES and name not in tables and path.stat().st_size:
                ignored[name] = ignored.get(name, 0) + path.stat().st_size
    return RankData(rank=int(meta.get("rank", rank_dir.name[5:])), dir=rank_dir, meta=meta, tables=tables,
                    last_commit=commit, closed=bool(commit.get("closed")), ignored_bytes=ignored)
