"""Unions of time intervals and how much of a window they cover: device busy time, time in
collectives, compute that overlapped them, neuron_prof's own work inside a wait.

Intervals are half-open ``[start, end)`` in int64 ns. Touching intervals merge (``[0, 5)`` and
``[5, 9)`` are one ``[0, 9)``), and an empty one (start == end) stays as a piece of length 0.
One core (``union_by_key``) serves both shapes: one set of intervals (``union``) and a set per
key (a rank, a thread, a (rank, step): ``neuron_prof.store.keys``), so the two never disagree on what
a union is. Time spent in overlapping intervals (two async collectives a rank waits for at once)
counts once: ``length_by_key``, never a sum of the intervals' lengths.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def union_by_key(key: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key, the union of its intervals ``[starts, ends)``, as (key, start, end) of disjoint
    intervals sorted by key and start."""
    key, starts, ends = np.asarray(key), np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not len(key):
        return key, starts, ends
    order = np.lexsort((starts, key))  # stable: equal starts keep their order
    k, s, e = key[order], starts[order], ends[order]
    one_key = k[0] == k[-1]
    # the furthest end so far within the key: an interval starting after it begins a new piece
    reach = np.maximum.accumulate(e) if one_key else pd.Series(e).groupby(k, sort=False).cummax().to_numpy(np.int64)
    new = np.ones(len(k), dtype=bool)
    new[1:] = (k[1:] != k[:-1]) | (s[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(k) - 1)
    return k[first], s[first], reach[last]


def length_by_key(key: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key, how long the union of its intervals is (ns), as (key, length) sorted by key: a
    rank that waits for two overlapping collectives waited once, not the two waits added up."""
    k, s, e = union_by_key(key, starts, ends)
    if not len(k):
        return k, s
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[first], np.add.reduceat(e - s, first)


def minus_by_key(key: np.ndarray, starts: np.ndarray, ends: np.ndarray, cut_key: np.ndarray,
                 cut_starts: np.ndarray, cut_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each interval ``[starts, ends)`` less the union of the cuts with the same key, as pieces
    (position of the interval, start, end) in the intervals' order; pieces of length 0 are left
    out. A wait less the time the rank it waited for spent in neuron_prof's own work."""
    key = np.asarray(key)
    s, e = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    ck, cs, ce = union_by_key(cut_key, cut_starts, cut_ends)
    if not len(ck) or not len(s):
        keep = np.flatnonzero(e > s)
        return keep, s[keep], e[keep]
    j0, j1 = np.zeros(len(s), dtype=np.int64), np.zeros(len(s), dtype=np.int64)
    by_key = np.argsort(key, kind="stable")
    sorted_key = key[by_key]
    for k in np.unique(ck):  # the cuts of key k: ck[lo:hi], disjoint and in time order
        lo, hi = np.searchsorted(ck, k, side="left"), np.searchsorted(ck, k, side="right")
        mine = by_key[np.searchsorted(sorted_key, k, side="left"):np.searchsorted(sorted_key, k, side="right")]
        j0[mine] = lo + np.searchsorted(ce[lo:hi], s[mine], side="right")  # the first cut ending after s
        j1[mine] = lo + np.searchsorted(cs[lo:hi], e[mine], side="left")  # the first cut starting at e or later
    n = np.maximum(j1 - j0, 0)  # the cuts inside an interval: n of them leave n + 1 pieces
    idx = np.repeat(np.arange(len(s)), n + 1)
    p = np.arange(len(idx)) - np.repeat(np.cumsum(n + 1) - (n + 1), n + 1)
    j = j0[idx] + p
    ps = np.maximum(np.where(p == 0, s[idx], ce[np.clip(j - 1, 0, len(ce) - 1)]), s[idx])
    pe = np.minimum(np.where(p == n[idx], e[idx], cs[np.clip(j, 0, len(cs) - 1)]), e[idx])
    keep = pe > ps
    return idx[keep], ps[keep], pe[keep]


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[starts, ends)`` as disjoint intervals (start, end), in time order."""
    _, s, e = union_by_key(np.zeros(len(starts), dtype=np.int64), starts, ends)
    return s, e


def covered_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How much of the disjoint sorted intervals ``[starts, ends)`` (a ``union``) lies before
    each time ``t`` (ns). The difference at two times is what the union covers between them."""
    t = np.asarray(t, dtype=np.int64)
    if not len(starts):
        return np.zeros(len(t), dtype=np.int64)
    before = np.r_[0, np.cumsum(ends - starts)]  # covered time before interval i
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    part = np.clip(np.minimum(t, ends[j]) - starts[j], 0, None)
    return np.where(i >= 0, before[j] + part, 0).astype(np.int64)


def covered(starts: np.ndarray, ends: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """Per window ``[w0, w1]``: how much of it the union of ``[starts, ends)`` covers (ns)."""
    s, e = union(starts, ends)
    return covered_before(s, e, w1) - covered_before(s, e, w0)
