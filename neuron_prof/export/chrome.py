"""Chrome trace-event JSON writer (the ``--format chrome`` fallback).

``{"traceEvents": [...], "displayTimeUnit": "ns"}`` with "M" metadata (process/thread names and
sort order), "X" complete events, "i" instants, "C" counters and "s"/"f" flow events; timestamps in
microseconds with ns precision (three decimals, exact: built from integer ns). Custom tracks
("Steps", ...) become pseudo-threads with a synthetic tid. Slices are nest-repaired exactly like
the Perfetto writer's and written per process sorted by start (outer first at equal start).
Gzip if the path ends in .gz.
"""
from __future__ import annotations

import json
import math

import numpy as np

from neuron_prof.export.buffered_writer import BufferedTraceWriter, EventTable, ProcessData

__all__ = ["ChromeTraceWriter"]

_SYNTH_TID = 1_000_000_000


def _ts_strings(ts: np.ndarray) -> list[str]:
    """int64 ns -> exact decimal microseconds ("12.345")."""
    neg = ts < 0
    q, r = np.divmod(np.abs(ts), 1000)
    out = [f"{a}.{b:03d}" if b else str(a) for a, b in zip(q.tolist(), r.tolist())]
    if neg.any():
        for i in np.flatnonzero(neg).tolist():
            out[i] = "-" + out[i]
    return out


class ChromeTraceWriter(BufferedTraceWriter):
    """Writes Chrome trace-event JSON to ``path`` (gzip if it ends in .gz)."""

    def __init__(self, path, *, compresslevel: int = 1):
        super().__init__(path)
        self.compresslevel = compresslevel

    def _tids(self, procs: list[ProcessData]) -> dict[int, tuple[int, int]]:
        """track handle -> (pid, tid)."""
        out = {}
        for d in procs:
            real = {t.tid for t in d.tracks if t.kind == "thread"}
            nxt = _SYNTH_TID
            for t in [d.proc] + d.tracks:
                if t.kind == "thread":
                    out[t.handle] = (t.pid, t.tid)
                else:
                    while nxt in real:
                        nxt += 1
                    out[t.handle] = (d.proc.pid, nxt)
                    nxt += 1
        return out

    def _arg_frags(self, key: str, col) -> tuple[np.ndarray, np.ndarray]:
        """(object array of ',"key":value' fragments, last one ''), per-row codes (-1 = absent)."""
        k = json.dumps(key.rsplit(":", 1)[0] if key.endswith((":s", ":i", ":f", ":b")) else key)
        if col.kind == "s":
            frags = [f",{k}:{json.dumps(s, ensure_ascii=False)}" for s in self.arg_values.strings]
            codes = col.values
        else:
            codes = np.full(len(col.values), -1, np.int64)
            u, inv = np.unique(col.values[col.present], return_inverse=True)
            codes[col.present] = inv
            if col.kind == "f":
                frags = [f",{k}:{json.dumps(float(x)) if math.isfinite(x) else json.dumps(str(x))}" for x in u.tolist()]
            elif col.kind == "b":
                frags = [f",{k}:{'true' if x else 'false'}" for x in u.tolist()]
            else:
                frags = [f",{k}:{int(x)}" for x in u.tolist()]
        return np.array(frags + [""], dtype=object), codes

    def _rows(self, tab: EventTable, ph: str, pidtid: dict, order: np.ndarray) -> list[str]:
        if not len(order):
            return []
        names = np.array([json.dumps(s, ensure_ascii=False) for s in self.names.strings] + ['""'], dtype=object)
        heads = {h: f'{{"ph":"{ph}",' + ('"s":"t",' if ph == "i" else "") + f'"pid":{p},"tid":{t},"ts":'
                 for h, (p, t) in pidtid.items()}
        head = np.array([heads.get(h, "") for h in range(len(self.tracks))], dtype=object)[tab.track[order]]
        ts = _ts_strings(tab.ts[order])
        nm = names[tab.name[order]]
        args = None
        for key, col in tab.args.items():
            frags, codes = self._arg_frags(key, col)
            a = frags[codes[order]]
            args = a if args is None else args + a
        args = [""] * len(order) if args is None else [f',"args":{{{s[1:]}}}' if s else "" for s in args.tolist()]
        if ph == "X":
            dur = _ts_strings(tab.dur[order])
            return [f'{h}{t},"dur":{d},"name":{n}{a}}}'
                    for h, t, d, n, a in zip(head.tolist(), ts, dur, nm.tolist(), args)]
        return [f'{h}{t},"name":{n}{a}}}' for h, t, n, a in zip(head.tolist(), ts, nm.tolist(), args)]

    def _write(self, procs: list[ProcessData]) -> None:
        pidtid = self._tids(procs)
        dumps = lambda s: json.dumps(s, ensure_ascii=False)  # noqa: E731
        with self._output(self.compresslevel, text=True) as f:
            f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
            first = True

            def emit(lines):
                nonlocal first
                if not lines:
                    return
                if not first:
                    f.write(",\n")
                f.write(",\n".join(lines))
                first = False

            for j, d in enumerate(procs):
                pid = d.proc.pid
                meta = [f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_name","args":{{"name":{dumps(d.proc.name)}}}}}',
                        f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_sort_index","args":{{"sort_index":{j}}}}}']
                used = set(np.unique(d.slices.track).tolist()) | set(np.unique(d.instants.track).tolist())
                for rank, t in enumerate([d.proc] + d.tracks):
                    if t.kind == "counter" or (t.kind == "process" and t.handle not in used):
                        continue
                    _, tid = pidtid[t.handle]
                    meta.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_name",'
                                f'"args":{{"name":{dumps(t.name)}}}}}')
                    meta.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_sort_index",'
                                f'"args":{{"sort_index":{rank}}}}}')
                emit(meta)
                S, I = d.slices, d.instants
                emit(self._rows(S, "X", pidtid, np.lexsort((-(S.ts + S.dur), S.ts)) if len(S) else np.empty(0, int)))
                emit(self._rows(I, "i", pidtid, np.argsort(I.ts, kind="stable")))
                if len(d.counter_ts):
                    o = np.argsort(d.counter_ts, kind="stable")
                    ok = np.isfinite(d.counter_val[o])
                    o = o[ok]
                    heads = {t.handle: f'{{"ph":"C","pid":{pid},"tid":0,"name":{dumps(t.name)},"ts":'
                             for t in d.tracks if t.kind == "counter"}
                    vals = d.counter_val[o]
                    vs = [str(int(v)) if i else json.dumps(v) for v, i in zip(vals.tolist(), d.counter_int[o].tolist())]
                    emit([f'{heads[h]}{t},"args":{{"value":{v}}}}}'
                          for h, t, v in zip(d.counter_track[o].tolist(), _ts_strings(d.counter_ts[o]), vs)])
            # flows: "s" at the earlier event, "f" (binding to the enclosing slice) at the later one
            if self._flow_ends is not None and len(self._flow_ends[4]):
                a_tr, a_ts, b_tr, b_ts, fid = self._flow_ends
                swap = b_ts < a_ts
                s_tr, s_ts = np.where(swap, b_tr, a_tr), np.where(swap, b_ts, a_ts)
                e_tr, e_ts = np.where(swap, a_tr, b_tr), np.where(swap, a_ts, b_ts)
                lines = []
                for st, sts, et, ets, i in zip(s_tr.tolist(), _ts_strings(s_ts), e_tr.tolist(), _ts_strings(e_ts),
                                               fid.tolist()):
                    p, t = pidtid[st]
                    lines.append(f'{{"ph":"s","cat":"flow","name":"flow","id":{i},"pid":{p},"tid":{t},"ts":{sts}}}')
                    p, t = pidtid[et]
                    lines.append(f'{{"ph":"f","bp":"e","cat":"flow","name":"flow","id":{i},"pid":{p},"tid":{t},'
                                 f'"ts":{ets}}}')
                emit(lines)
            f.write("\n]}\n")
