"""Unions of time intervals and how much of a window they cover: device busy time, time in
collectives, compute that overlapped them, neuron_prof's own work inside a wait.

Intervals are half-open ``[start, end)`` in int64 ns. Touching intervals merge (``[0, 5)`` and
``[5, 9)`` are one ``[0, 9)``), and an empty one (start == end) stays as a piece of length 0.
One core (``union_by_key``) serves both shapes: one set of intervals (``union``) and a set per
key (a rank, a thread, a (rank, step): ``neuron_prof.keys``), so the two never disagree on what
a union is.
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
