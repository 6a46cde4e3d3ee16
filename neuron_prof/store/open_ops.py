"""Which op was open on a thread at a time: the join of a host-side event (a device launch, a host
wait, a copy's call: a thread and a time, all a profiler trace says of them) to the op, module and
line it happened under. The reader joins the device tables' rows this way (``neuron_prof.store.run``),
the analyses and the trace exporter their own events.

Pure numpy and pandas; the ops are ``Run.ops`` rows (rank, tid, ts, dur, depth).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.store.keys import thread_key


def last_at_or_before(keys: np.ndarray, ts: np.ndarray, qkeys: np.ndarray, qts: np.ndarray) -> np.ndarray:
    """Per query, the position in ``keys``/``ts`` (sorted by key, then ts) of the last element
    with the query's key and ``ts <= qts``; -1 where there is none. One search per thread."""
    out = np.full(len(qkeys), -1, dtype=np.int64)
    if not len(keys):
        return out
    first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))  # keys are sorted
    uniq = keys[first]
    bounds = np.append(first, len(keys))
    for i, k in enumerate(uniq):
        q = np.flatnonzero(qkeys == k)
        if len(q):
            lo, hi = bounds[i], bounds[i + 1]
            pos = np.searchsorted(ts[lo:hi], qts[q], side="right") - 1
            out[q] = np.where(pos >= 0, pos + lo, -1)
    return out


def innermost_ops(rank: np.ndarray, tid: np.ndarray, ts: np.ndarray, ops: pd.DataFrame) -> np.ndarray:
    """Per event (``rank``, ``tid``, ``ts``), the position in ``ops`` of the innermost op open on
    its rank and thread at its time, -1 where none was captured."""
    out = np.full(len(ts), -1, dtype=np.int64)
    if not len(ts) or ops.empty:
        return out
    okey, ots = thread_key(ops["rank"], ops["tid"]), ops["ts"].to_numpy(np.int64)
    oend, odepth = ots + ops["dur"].to_numpy(np.int64), ops["depth"].to_numpy()
    ekey, ets = thread_key(rank, tid), np.asarray(ts, dtype=np.int64)
    for d in range(int(odepth.max()), -1, -1):  # innermost first; ops at one depth of a thread never overlap
        at = np.flatnonzero(odepth == d)
        todo = np.flatnonzero(out < 0)
        if not len(at) or not len(todo):
            continue
        order = at[np.lexsort((ots[at], okey[at]))]
        pos = last_at_or_before(okey[order], ots[order], ekey[todo], ets[todo])
        cand = order[np.maximum(pos, 0)]
        ok = (pos >= 0) & (oend[cand] >= ets[todo])
        out[todo[ok]] = cand[ok]
    return out
