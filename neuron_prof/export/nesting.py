"""Slices on one track must nest, and events must be written in an order that keeps them nested.

Partial overlaps (which real data has now and then) are repaired deterministically before writing:
in pre-order (start ascending, end descending) a slice that outlives its enclosing slice is clipped
to the enclosing slice's end; negative durations become 0. The buffered writer counts both in
``writer.stats["repaired_slices"]``.

``emission_order`` / ``slice_event_order`` give the time order of begin/end events with the
tie-breaks that keep equal-time slices nested (the Perfetto writer emits in that order).
"""
from __future__ import annotations

import numpy as np

__all__ = ["nest_repair", "emission_order", "slice_event_order", "narrow"]


def emission_order(t, cls, k2):
    """Order of events: by time; at equal time ends (cls 0) before begins (cls 1) before ends of
    zero-length slices (cls 2) before instants (3) and counters (4); equal-time begins outer-first
    (k2 = -end), equal-time ends inner-first (k2 = -begin); remaining ties by position, which for
    begins is input order and for ends reversed input order, so exact duplicates nest too."""
    n = len(t)
    if n == 0:
        return np.empty(0, np.int64)
    tmin, tmax = int(t.min()), int(t.max())
    if (tmax - tmin) >= (1 << 59):
        return np.lexsort((k2, cls, t))
    p = (t - tmin) * 8 + cls
    return _fix_ties(p, np.argsort(p, kind="stable"), lambda idx: k2[idx])


def _fix_ties(p, order, k2_of):
    ps = p[order]
    eq = ps[1:] == ps[:-1]
    if eq.any():  # ties in (t, cls): order those groups by k2 (stable keeps position order)
        tie = np.zeros(len(p), bool)
        tie[1:] = eq
        tie[:-1] |= eq
        pos = np.flatnonzero(tie)
        sub = order[pos]
        order[pos] = sub[np.lexsort((k2_of(sub), ps[pos]))]
    return order


def slice_event_order(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``emission_order`` of the 2n begin/end events of slices, laid out as
    [begins in input order, ends in reversed input order], without materialising the event table."""
    n = len(ts)
    if n == 0:
        return np.empty(0, np.int64)
    tmin, tmax = int(ts.min()), int(end.max())
    rev = slice(None, None, -1)
    if (tmax - tmin) >= (1 << 59):
        t = np.concatenate([ts, end[rev]])
        cls = np.concatenate([np.ones(n, np.int8), np.where(end == ts, 2, 0).astype(np.int8)[rev]])
        return np.lexsort((np.concatenate([-end, -ts[rev]]), cls, t))
    p = np.empty(2 * n, np.int64)
    b, e = p[:n], p[n:]
    np.subtract(ts, tmin, out=b)
    b *= 8
    b += 1
    np.subtract(end[rev], tmin, out=e)
    e *= 8
    e += (end[rev] == ts[rev]).view(np.uint8) * np.uint8(2)

    def k2_of(idx):
        isb = idx < n
        return np.where(isb, -end[np.where(isb, idx, 0)], -ts[np.where(isb, 0, 2 * n - 1 - idx)])
    return _fix_ties(p, np.argsort(p, kind="stable"), k2_of)


def narrow(x: np.ndarray) -> np.ndarray:
    """Narrow non-negative ints so stable argsort uses radix sort."""
    m = int(x.max(initial=0))
    return x.astype(np.uint16) if m < 65536 else x


def _mismatched(track, order):
    """Slices (rows) that do not nest with the others of their track, by the begins/ends
    (layout of ``slice_event_order``) in ``order``: a slice nests iff its end leaves as many
    slices open on its track as were open at its begin (if every slice does, stack matching pairs
    each end with its own begin: the first end follows its own begin directly, and removing that
    pair changes no other depth). Empty: the slices nest."""
    n = len(order) // 2
    isb = order < n
    sid = np.where(isb, order, 2 * n - 1 - order)
    o2 = np.argsort(narrow(track[sid]), kind="stable")  # per-track event sequences, time order kept
    sid, isb = sid[o2], isb[o2]
    # open slices after each event; tracks are balanced, so the running count is 0 between tracks
    level = np.cumsum(isb.view(np.int8) * np.int8(2) - np.int8(1), dtype=np.int32)
    depth = np.empty(n, np.int32)
    depth[sid[isb]] = level[isb] - 1
    ends = ~isb
    bad = depth[sid[ends]] != level[ends]
    return np.unique(sid[ends][bad])


def _repair_rows(rows, ts, end):
    """Clip ends in pre-order so slices nest; rows sorted by (ts asc, end desc). Returns repairs."""
    stack: list[int] = []
    reps = 0
    tsl, endl = ts[rows].tolist(), end[rows].tolist()
    for j, (s, e) in enumerate(zip(tsl, endl)):
        while stack and stack[-1] <= s:
            stack.pop()
        if stack and e > stack[-1]:
            e = stack[-1]
            end[rows[j]] = e
            reps += 1
        stack.append(e)
    return reps


def nest_repair(track: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Make slices nest per track (see the module doc). Returns (dur, number of repaired slices, order)
    where ``order`` is ``slice_event_order`` of the repaired slices."""
    dur = np.asarray(dur, np.int64)
    reps = int((dur < 0).sum())
    if reps:
        dur = np.maximum(dur, 0)
    end = ts + dur
    order = slice_event_order(ts, end)
    bad = _mismatched(track, order) if len(ts) > 1 else ()
    if not len(bad):
        return dur, reps, order
    for tk in np.unique(track[bad]):
        rows = np.flatnonzero(track == tk)
        rows = rows[np.lexsort((rows, -end[rows], ts[rows]))]
        # connected components in pre-order; only those holding a mismatch need the sequential pass
        runmax = np.maximum.accumulate(end[rows])
        start = np.ones(len(rows), bool)
        start[1:] = ts[rows][1:] >= runmax[:-1]
        comp = np.cumsum(start) - 1
        bounds = np.append(np.flatnonzero(start), len(rows))   # components are contiguous in pre-order
        pos = np.empty(len(ts), np.int64)
        pos[rows] = np.arange(len(rows))
        bad_here = bad[track[bad] == tk]
        for c in np.unique(comp[pos[bad_here]]).tolist():
            reps += _repair_rows(rows[bounds[c]:bounds[c + 1]], ts, end)
    order = slice_event_order(ts, end)
    bad = _mismatched(track, order)
    if len(bad):  # cannot happen; be safe rather than write a broken trace
        for tk in np.unique(track[bad]):
            rows = np.flatnonzero(track == tk)
            rows = rows[np.lexsort((rows, -end[rows], ts[rows]))]
            reps += _repair_rows(rows, ts, end)
        order = slice_event_order(ts, end)
    return end - ts, reps, order
