"""Op time: self time from the per-thread nesting, and the top ops by self time with module path."""
from __future__ import annotations

import numpy as np
import pandas as pd


def parent_index(ops: pd.DataFrame) -> np.ndarray:
    """Row position of each op's enclosing op on the same thread (-1 for top-level ops).

    Uses the recorded nesting depth: the parent of an op at depth d is the last op at depth d-1
    that started before it on the same rank and thread and contains it.
    """
    n = len(ops)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    order = np.lexsort((ops["depth"].to_numpy(), ops["ts"].to_numpy(), ops["tid"].to_numpy(),
                        ops["rank"].to_numpy()))
    depth = ops["depth"].to_numpy()[order]
    ts = ops["ts"].to_numpy()[order]
    end = ts + ops["dur"].to_numpy()[order]
    group = ops["rank"].to_numpy()[order].astype(np.int64) * (1 << 40) + ops["tid"].to_numpy()[order]
    sorted_parent = np.full(n, -1, dtype=np.int64)
    for d in range(1, int(depth.max(initial=0)) + 1):
        cand = np.flatnonzero(depth == d - 1)
        kids = np.flatnonzero(depth == d)
        if not len(cand) or not len(kids):
            continue
        k = np.searchsorted(cand, kids) - 1
        ok = k >= 0
        p = cand[np.maximum(k, 0)]
        ok &= (group[p] == group[kids]) & (ts[p] <= ts[kids]) & (end[p] >= end[kids])
        sorted_parent[kids[ok]] = p[ok]
    valid = sorted_parent >= 0
    parent[order[valid]] = order[sorted_parent[valid]]
    return parent


def self_time(ops: pd.DataFrame) -> np.ndarray:
    """Duration minus the duration of direct children (ns)."""
    parent = parent_index(ops)
    dur = ops["dur"].to_numpy()
    child = np.bincount(parent[parent >= 0], weights=dur[parent >= 0], minlength=len(ops))
    return np.maximum(dur - child.astype(np.int64), 0)


def op_stats(ops: pd.DataFrame, by: tuple[str, ...] = ("name", "module")) -> pd.DataFrame:
    """Calls, total and self time per group, sorted by self time; ``self_pct`` of all self time."""
    cols = [*by, "calls", "total_ms", "self_ms", "self_pct", "mean_us", "backward"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    df = ops[list(by) + ["dur", "bwd"]].assign(self_ns=self_time(ops))
    g = df.groupby(list(by), observed=True, sort=False)
    out = pd.DataFrame({
        "calls": g.size(),
        "total_ms": g["dur"].sum() / 1e6,
        "self_ms": g["self_ns"].sum() / 1e6,
        "mean_us": g["dur"].mean() / 1e3,
        "backward": g["bwd"].mean() > 0.5,
    }).reset_index()
    total_self = out["self_ms"].sum()
    out["self_pct"] = 100 * out["self_ms"] / total_self if total_self else 0.0
    return out.sort_values("self_ms", ascending=False, ignore_index=True)[cols]
