"""The implementation both trace writers share: everything buffered column-wise, written in ``close()``.

Strings are interned once (Categorical codes map through a per-category table, object arrays
through ``pd.factorize``; ``neuron_prof.export.string_table``). At ``close()`` the columns are
gathered per process (``ProcessData``), slices nest-repaired (``neuron_prof.export.nesting``), and
the format's ``_write`` turns them into a file.

The file is written as a new one and renamed onto ``path`` at the end (``neuron_prof.store.safefile``):
a link or file already at ``path`` is replaced, never written through. Whether it may be replaced
is the caller's check (``neuron_prof.export.output.check_destination``).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
from dataclasses import dataclass, field
from typing import IO, Iterator

import numpy as np
import pandas as pd

from neuron_prof.export.nesting import narrow, nest_repair
from neuron_prof.export.string_table import StringTable

__all__ = ["BufferedTraceWriter", "ProcessData", "EventTable", "ArgColumn", "Track"]


@dataclass
class Track:
    handle: int
    kind: str        # process | thread | track | counter
    proc: int        # owning process handle (itself for a process)
    name: str
    pid: int = 0
    tid: int = 0
    unit: str = ""


@dataclass
class ArgColumn:
    kind: str                 # "s" (string ids into arg_values), "i", "f", "b"
    values: np.ndarray
    present: np.ndarray       # bool


@dataclass
class EventTable:
    """Slices (dur set) or instants (dur None) of one process, repaired, in input order."""
    track: np.ndarray
    ts: np.ndarray
    dur: np.ndarray | None
    name: np.ndarray          # ids into names
    ids: np.ndarray           # global event ids
    args: dict[str, ArgColumn] = field(default_factory=dict)   # key -> column
    order: np.ndarray | None = None   # slices: emission order of [begins, reversed ends]

    def __len__(self):
        return len(self.ts)


@dataclass
class ProcessData:
    proc: Track
    tracks: list[Track]       # child tracks, creation order
    slices: EventTable
    instants: EventTable
    counter_track: np.ndarray
    counter_ts: np.ndarray
    counter_val: np.ndarray   # float64
    counter_int: np.ndarray   # bool: value came from an integer array
    # flows: (fid, kind, row) for each end of each arrow in this process; kind 0 slice, 1 instant
    flow_fid: np.ndarray
    flow_kind: np.ndarray
    flow_row: np.ndarray


def _as_i64(a, n=None) -> np.ndarray:
    if isinstance(a, (pd.Series, pd.Index)):
        a = a.to_numpy()
    a = np.asarray(a)
    if a.dtype.kind == "M":
        a = a.view(np.int64)
    a = a.astype(np.int64, copy=False)
    if n is not None and a.ndim == 0:
        a = np.full(n, int(a), np.int64)
    return np.ascontiguousarray(a)


def _plain(x):
    if isinstance(x, pd.Series):
        return x.array if isinstance(x.dtype, pd.CategoricalDtype) else x.to_numpy()
    return x


class BufferedTraceWriter:
    """Collects everything column-wise; subclasses implement ``_write(processes)``."""

    def __init__(self, path):
        self.path = str(path)
        self.tracks: list[Track] = []
        self.names = StringTable()
        self.arg_keys = StringTable()
        self.arg_values = StringTable()
        self._keyed: dict[tuple, int] = {}
        self._slices: list[tuple] = []
        self._instants: list[tuple] = []
        self._counters: list[tuple] = []
        self._flows: list[tuple[np.ndarray, np.ndarray]] = []
        self._next_id = 0
        self._flow_ends = None   # (src track, src ts, dst track, dst ts, flow id) after _collect
        self._closed = False
        self.stats: dict[str, int] = {"repaired_slices": 0, "slices": 0, "instants": 0, "counters": 0,
                                      "flows": 0, "dropped_flows": 0}

    # --- tracks
    def _new(self, key, **kw) -> int:
        h = self._keyed.get(key)
        if h is None:
            h = len(self.tracks)
            if kw["kind"] == "process":
                kw["proc"] = h
            self.tracks.append(Track(handle=h, **kw))
            self._keyed[key] = h
        return h

    def _proc(self, proc: int) -> Track:
        t = self.tracks[proc]
        if t.kind != "process":
            raise ValueError(f"handle {proc} is a {t.kind} track, not a process")
        return t

    def process(self, pid: int, name: str) -> int:
        return self._new(("p", int(pid)), kind="process", proc=-1, name=str(name), pid=int(pid))

    def thread_track(self, proc: int, tid: int, name: str) -> int:
        p = self._proc(proc)
        return self._new(("t", proc, int(tid)), kind="thread", proc=proc, name=str(name), pid=p.pid, tid=int(tid))

    def track(self, proc: int, name: str) -> int:
        p = self._proc(proc)
        return self._new(("c", proc, str(name)), kind="track", proc=proc, name=str(name), pid=p.pid)

    def counter_track(self, proc: int, name: str, unit: str = "") -> int:
        p = self._proc(proc)
        return self._new(("n", proc, str(name)), kind="counter", proc=proc, name=str(name), pid=p.pid,
                         unit=str(unit))

    # --- events
    def _track_col(self, track, n) -> np.ndarray:
        tr = np.asarray(_plain(track))
        tr = np.full(n, int(tr), np.int32) if tr.ndim == 0 else tr.astype(np.int32)
        if len(tr) != n:
            raise ValueError(f"track column has {len(tr)} rows, expected {n}")
        if n and (tr.min() < 0 or tr.max() >= len(self.tracks)):
            raise ValueError("unknown track handle")
        return tr

    def _args(self, args, n) -> dict:
        out = {}
        for key, col in (args or {}).items():
            col = _plain(col)
            arr = col if isinstance(col, pd.Categorical) else np.asarray(col)
            if isinstance(arr, pd.Categorical) or arr.dtype.kind in "OUS":
                out[str(key)] = ("s", self.arg_values.encode(arr, n, omit_empty=True))
            elif arr.dtype.kind == "b":
                out[str(key)] = ("b", arr.astype(bool))
            elif arr.dtype.kind in "iu":
                out[str(key)] = ("i", arr.astype(np.int64))
            elif arr.dtype.kind == "f":
                out[str(key)] = ("f", arr.astype(np.float64))
            else:
                out[str(key)] = ("s", self.arg_values.encode(arr.astype(str).astype(object), n, omit_empty=True))
            if len(out[str(key)][1]) != n:
                raise ValueError(f"arg {key!r} has {len(out[str(key)][1])} rows, expected {n}")
            self.arg_keys.id(str(key))
        return out

    def _ids(self, n) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
        self._next_id += n
        return ids

    def slices(self, track, ts, dur, names, args=None) -> np.ndarray:
        """Complete slices. Returns their event ids (for ``flows``)."""
        ts = _as_i64(ts)
        n = len(ts)
        dur = _as_i64(dur, n)
        tr = self._track_col(track, n)
        nm = self.names.encode(_plain(names), n, omit_empty=False)
        ids = self._ids(n)
        self._slices.append((tr, ts, dur, nm, ids, self._args(args, n)))
        return ids

    def instants(self, track, ts, names, args=None) -> np.ndarray:
        """Instant events. Returns their event ids (for ``flows``)."""
        ts = _as_i64(ts)
        n = len(ts)
        tr = self._track_col(track, n)
        nm = self.names.encode(_plain(names), n, omit_empty=False)
        ids = self._ids(n)
        self._instants.append((tr, ts, None, nm, ids, self._args(args, n)))
        return ids

    def counters(self, track: int, ts, values) -> None:
        ts = _as_i64(ts)
        n = len(ts)
        tr = self._track_col(track, n)
        if n and any(self.tracks[t].kind != "counter" for t in np.unique(tr)):
            raise ValueError("counters() needs a counter_track handle")
        v = np.asarray(_plain(values))
        is_int = v.dtype.kind in "iub"
        v = np.broadcast_to(v.astype(np.float64), (n,))
        self._counters.append((tr, ts, np.ascontiguousarray(v), np.full(n, is_int)))

    def flows(self, src, dst) -> int:
        """Arrows between events (ids returned by ``slices``/``instants``), one per (src, dst) pair.
        Arrows point from the earlier event to the later one (Perfetto resolves flows in time order).
        Returns the number of arrows added."""
        src, dst = np.atleast_1d(_as_i64(src)), np.atleast_1d(_as_i64(dst))
        src, dst = np.broadcast_arrays(src, dst)
        self._flows.append((src.copy(), dst.copy()))
        return len(src)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._write(self._collect())

    def _write(self, procs: list[ProcessData]) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _output(self, compresslevel: int, text: bool = False) -> Iterator[IO]:
        """The output file for ``_write``: gzip when ``path`` ends in .gz, UTF-8 text if ``text``;
        it becomes ``path`` only once written completely."""
        from neuron_prof.store.safefile import atomic_output
        with atomic_output(self.path) as raw:
            with contextlib.ExitStack() as stack:
                f: IO = raw
                if self.path.endswith(".gz"):
                    # named as gzip.open would name it, not after the temporary file
                    f = stack.enter_context(gzip.GzipFile(os.path.basename(self.path), "wb", compresslevel, raw))
                if text:
                    f = stack.enter_context(io.TextIOWrapper(f, encoding="utf-8"))
                yield f

    # --- gathering per process
    def _concat(self, chunks, with_dur):
        if not chunks:
            e = np.empty(0, np.int64)
            return EventTable(e.astype(np.int32), e, e.copy() if with_dur else None, e.astype(np.int32), e), {}
        tr = np.concatenate([c[0] for c in chunks])
        ts = np.concatenate([c[1] for c in chunks])
        dur = np.concatenate([c[2] for c in chunks]) if with_dur else None
        nm = np.concatenate([c[3] for c in chunks])
        ids = np.concatenate([c[4] for c in chunks])
        return EventTable(tr, ts, dur, nm, ids), self._arg_columns(chunks, len(ts))

    def _arg_columns(self, chunks, n: int) -> dict[str, ArgColumn]:
        """The chunks' annotations as columns of all ``n`` rows (absent in a chunk without the key;
        a key of two kinds is two columns, ``key:kind``). Each column is one array written chunk by
        chunk (a filler array per chunk without the key, then their concatenation, wrote millions of
        rows twice)."""
        keys: dict[tuple[str, str], None] = {}
        for c in chunks:
            for k, (kind, _) in c[5].items():
                keys.setdefault((k, kind), None)
        multi = {k for k, _ in keys if sum(1 for kk, _ in keys if kk == k) > 1}
        bounds = np.cumsum([0] + [len(c[1]) for c in chunks]).tolist()
        cols: dict[str, ArgColumn] = {}
        for key, kind in keys:
            name = f"{key}:{kind}" if key in multi else key
            if kind == "s":
                vals = np.full(n, -1, np.int32)
            else:
                vals = np.zeros(n, {"f": np.float64, "b": bool, "i": np.int64}[kind])
            pres = np.zeros(n, bool)
            for c, lo, hi in zip(chunks, bounds, bounds[1:]):
                got = c[5].get(key)
                if got is not None and got[0] == kind:
                    vals[lo:hi] = got[1]
                    if kind == "s":
                        np.greater_equal(got[1], 0, out=pres[lo:hi])
                    elif kind == "f":
                        np.isnan(got[1], out=pres[lo:hi])
                        np.logical_not(pres[lo:hi], out=pres[lo:hi])
                    else:
                        pres[lo:hi] = True
            if name != key:
                self.arg_keys.id(name)
            cols[name] = ArgColumn(kind, vals, pres)
        return cols

    def _collect(self) -> list[ProcessData]:
        proc_of = np.array([t.proc for t in self.tracks] or [0], np.int32)
        procs = [t for t in self.tracks if t.kind == "process"]
        sl, sl_args = self._concat(self._slices, True)
        ins, in_args = self._concat(self._instants, False)
        self._slices, self._instants = [], []
        if self._counters:
            ct = np.concatenate([c[0] for c in self._counters])
            cts = np.concatenate([c[1] for c in self._counters])
            cv = np.concatenate([c[2] for c in self._counters])
            ci = np.concatenate([c[3] for c in self._counters])
        else:
            ct, cts, cv, ci = (np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0), np.empty(0, bool))
        self._counters = []
        # split per process (stable: input order kept inside a process)
        def split(tr):
            p = proc_of[tr] if len(tr) else np.empty(0, np.int32)
            one = len(procs) == 1   # one rank: its rows are every row, in order (no sort of millions)
            order = np.arange(len(p)) if one else np.argsort(narrow(p), kind="stable")
            bounds = np.searchsorted(p if one else p[order], [x.handle for x in procs] + [len(self.tracks)])
            return order, p, bounds

        def sub(tab: EventTable, args, rows):
            if len(rows) == len(tab) and (len(rows) == 0 or (rows[0] == 0 and rows[-1] == len(rows) - 1)):
                rows = slice(None)  # the whole table, in order (sorted distinct rows): no copy
            t = EventTable(tab.track[rows], tab.ts[rows], None if tab.dur is None else tab.dur[rows],
                           tab.name[rows], tab.ids[rows])
            for k, c in args.items():
                pres = c.present[rows]
                if pres.any():
                    t.args[k] = ArgColumn(c.kind, c.values[rows], pres)
            return t

        # flows: map event ids -> (process, kind, row within the process table)
        all_ids = np.concatenate([sl.ids, ins.ids])
        all_kind = np.concatenate([np.zeros(len(sl), np.int8), np.ones(len(ins), np.int8)])
        all_tr = np.concatenate([sl.track, ins.track])
        all_ts = np.concatenate([sl.ts, ins.ts])
        src = np.concatenate([f[0] for f in self._flows]) if self._flows else np.empty(0, np.int64)
        dst = np.concatenate([f[1] for f in self._flows]) if self._flows else np.empty(0, np.int64)
        self._flows = []
        id_order = np.argsort(all_ids, kind="stable")
        sorted_ids = all_ids[id_order]

        def locate(x):
            i = np.searchsorted(sorted_ids, x)
            i = np.minimum(i, max(len(sorted_ids) - 1, 0))
            ok = (sorted_ids[i] == x) if len(sorted_ids) else np.zeros(len(x), bool)
            return id_order[i] if len(sorted_ids) else i, ok

        si, sok = locate(src)
        di, dok = locate(dst)
        keep = sok & dok
        self.stats["dropped_flows"] += int((~keep).sum())
        si, di = si[keep], di[keep]
        fid = np.arange(1, len(si) + 1, dtype=np.int64)
        self.stats["flows"] += len(si)
        fl_pos = np.concatenate([si, di])        # position in concat(all slices, all instants)
        fl_fid = np.concatenate([fid, fid])
        self._flow_ends = (all_tr[si], all_ts[si], all_tr[di], all_ts[di], fid)

        so, sp, sb = split(sl.track)
        io, ip, ib = split(ins.track)
        co, cp, cb = split(ct)
        # global position -> (process, local row); local row = rank inside the process slice/instant table
        s_local = np.empty(len(sl), np.int64)
        i_local = np.empty(len(ins), np.int64)
        out = []
        for j, p in enumerate(procs):
            srows = so[sb[j]:sb[j + 1]]
            irows = io[ib[j]:ib[j + 1]]
            crows = co[cb[j]:cb[j + 1]]
            s_local[srows] = np.arange(len(srows))
            i_local[irows] = np.arange(len(irows))
            stab = sub(sl, sl_args, srows)
            if len(stab):
                stab.dur, reps, stab.order = nest_repair(stab.track, stab.ts, stab.dur)
                self.stats["repaired_slices"] += reps
            itab = sub(ins, in_args, irows)
            out.append(ProcessData(
                proc=p, tracks=[t for t in self.tracks if t.proc == p.handle and t.kind != "process"],
                slices=stab, instants=itab, counter_track=ct[crows], counter_ts=cts[crows],
                counter_val=cv[crows], counter_int=ci[crows],
                flow_fid=np.empty(0, np.int64), flow_kind=np.empty(0, np.int8), flow_row=np.empty(0, np.int64)))
        self.stats["slices"] += len(sl)
        self.stats["instants"] += len(ins)
        self.stats["counters"] += len(ct)
        if len(fl_pos):
            nsl = len(sl)
            kind = (fl_pos >= nsl).astype(np.int8)
            row = np.where(kind == 0, s_local[np.minimum(fl_pos, max(nsl - 1, 0))] if nsl else 0,
                           i_local[np.maximum(fl_pos - nsl, 0)] if len(ins) else 0)
            pr = proc_of[all_tr[fl_pos]]
            hidx = {p.handle: j for j, p in enumerate(procs)}
            for h in np.unique(pr):
                m = pr == h
                d = out[hidx[int(h)]]
                d.flow_fid, d.flow_kind, d.flow_row = fl_fid[m], kind[m], row[m]
        return out
