"""What communication costs: time in collectives per rank and step, the part no compute
overlapped (``overlap``: the Overview's "communication" split), and achieved bandwidth per
collective and per group (``bandwidth``, ``group_bandwidth``), and time and waits per group and
op (``by_op``).

Overlap is measured per rank on its own clock (compute and communication of one rank need no
alignment); bandwidth comes from the matched collectives (``collective_match.matched``), whose
transfer time starts when the last rank arrived.

Times are int64 ns; -1 means unknown. DataFrames in, DataFrames out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.collective_match import OPEN_STATUS
from neuron_prof.analysis.intervals import covered_before, length_by_key, union_by_key
from neuron_prof.analysis.ops import COMM_PREFIXES, name_mask
from neuron_prof.analysis.stragglers import steady_steps
from neuron_prof.store.keys import step_key, step_key_parts, thread_key

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n}
"""busbw = algbw x factor(group size), as NCCL-tests define it (other ops: 1): what each rank's
link carried, comparable across ops and group sizes."""


def _compute(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """When each rank computed, as (rank, start, end) of disjoint intervals: the time its
    innermost ops ran, on any thread, outside collective ops. Innermost, because a rank that
    waits for a collective often waits inside an enclosing op (DDP's forward waits for its
    broadcast in ``Work.wait``, which records no op of its own): that op's own time is waiting
    or Python, not compute."""
    depth = ops["depth"].to_numpy()
    comm = name_mask(ops, lambda n: n.startswith(COMM_PREFIXES))
    rank, tid = ops["rank"].to_numpy(np.int64), ops["tid"].to_numpy(np.int64)
    ts = ops["ts"].to_numpy(np.int64)
    end = ts + ops["dur"].to_numpy(np.int64)
    thread = pd.factorize(thread_key(rank, tid))[0].astype(np.int64)
    order = np.lexsort((depth, ts, thread))  # an op with children is followed by its first child
    cur, nxt = order[:-1], order[1:]
    parent = np.zeros(len(ops), dtype=bool)
    parent[cur] = (thread[nxt] == thread[cur]) & (depth[nxt] > depth[cur]) & (ts[nxt] < end[cur])
    leaf = ~parent & ~comm
    lk, ls, le = union_by_key(thread[leaf], ts[leaf], end[leaf])
    hk, hs, he = union_by_key(thread[comm], ts[comm], end[comm])  # what runs inside a collective is communication
    # a sweep per thread: +1 inside an innermost op, -1 inside a collective; 1 = computing
    key = np.r_[lk, lk, hk, hk]
    t = np.r_[ls, le, hs, he]
    step = np.r_[np.ones(len(lk)), -np.ones(len(lk)), -np.ones(len(hk)), np.ones(len(hk))].astype(np.int64)
    o = np.lexsort((t, key))
    key, t, level = key[o], t[o], np.cumsum(step[o])
    on = (level[:-1] == 1) & (key[:-1] == key[1:]) & (t[1:] > t[:-1])
    rank_of = pd.Series(rank).groupby(thread).first().to_numpy()
    return union_by_key(rank_of[key[:-1][on]], t[:-1][on], t[1:][on])


def overlap(coll: pd.DataFrame, ops: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step with collectives (each rank on its own clock): ``comm_ns`` (time with a
    collective under way: from issue to completion, the union over its collectives),
    ``overlapped_ns`` (the part in which the rank computed: its innermost ops ran, on any thread,
    outside collective ops; -1 when the step's ops were not captured), ``exposed_ns`` (the
    rest: the rank only waited for communication), ``step_ns`` and ``comm_share`` (exposed /
    step). In-flight collectives (no end) are left out."""
    cols = ["rank", "step", "comm_ns", "overlapped_ns", "exposed_ns", "step_ns", "comm_share"]
    done = coll["done"].to_numpy(np.int64)
    keep = ~(coll["status"].astype(str).isin(OPEN_STATUS).to_numpy() & (done < 0))
    if not keep.any():
        return pd.DataFrame(columns=cols)
    ts = coll["ts"].to_numpy(np.int64)[keep]
    end = np.where(done >= 0, done, coll["ts"].to_numpy(np.int64) + coll["dur"].to_numpy(np.int64))[keep]
    rank = coll["rank"].to_numpy(np.int64)[keep]
    step = coll["step"].to_numpy(np.int64)[keep]
    k, cs, ce = union_by_key(step_key(rank, step), ts, end)  # step -1 (before the first) included
    k_rank, _ = step_key_parts(k)
    over = np.zeros(len(k), dtype=np.int64)
    if len(ops):
        o_rank_k, us, ue = _compute(ops)
        for r in np.unique(k_rank):
            sel, mine = k_rank == r, o_rank_k == r
            over[sel] = (covered_before(us[mine], ue[mine], ce[sel]) -
                         covered_before(us[mine], ue[mine], cs[sel]))
    per = pd.DataFrame({"key": k, "comm_ns": ce - cs, "overlapped_ns": over}).groupby("key").sum()
    per_rank, per_step = step_key_parts(per.index.to_numpy())
    out = pd.DataFrame({"rank": per_rank, "step": per_step,
                        "comm_ns": per["comm_ns"].to_numpy(), "overlapped_ns": per["overlapped_ns"].to_numpy()})
    s = steps.set_index(["rank", "step"]) if len(steps) else None
    idx = pd.MultiIndex.from_arrays([out["rank"], out["step"]])
    out["step_ns"] = s["dur"].reindex(idx).fillna(-1).to_numpy(np.int64) if s is not None else -1
    captured = s["active"].reindex(idx).fillna(False).to_numpy(bool) if s is not None else np.zeros(len(out), bool)
    if len(ops):  # before the first step (-1) there is no step row: ops were captured if any were
        captured = captured | (out["step"].to_numpy() < 0)
    out.loc[~captured, "overlapped_ns"] = -1
    out["exposed_ns"] = np.where(captured, out["comm_ns"] - out["overlapped_ns"], -1)
    ok = captured & (out["step_ns"].to_numpy() > 0)
    out["comm_share"] = np.where(ok, out["exposed_ns"] / np.where(ok, out["step_ns"], 1), np.nan)
    return out[cols]


def bandwidth(matched: pd.DataFrame) -> pd.DataFrame:
    """Achieved bandwidth per completed collective with a known transfer time: ``size`` (bytes
    of the larger of a rank's input and output, as NCCL-tests counts them), ``algbw`` (size /
    transfer time, GB/s) and ``busbw`` (algbw x ``BUS_FACTORS``)."""
    cols = ["group", "seq", "op", "step", "group_size", "size", "last_arrival", "transfer_ns", "algbw", "busbw"]
    m = matched[(matched["transfer_ns"] > 0) & matched["complete"]]
    if m.empty:
        return pd.DataFrame(columns=cols)
    size = np.maximum(m["bytes"].to_numpy(np.int64), m["out_bytes"].to_numpy(np.int64))
    algbw = size / m["transfer_ns"].to_numpy(np.float64)  # bytes per ns = GB/s
    factor = np.array([BUS_FACTORS.get(op, lambda n: 1.0)(max(int(n), 1)) for op, n in zip(m["op"], m["group_size"])])
    return m.assign(size=size, algbw=algbw, busbw=algbw * factor)[cols].reset_index(drop=True)


def group_bandwidth(bw: pd.DataFrame) -> pd.DataFrame:
    """Per group and op (from ``bandwidth``): ``calls``, ``bytes`` (sizes summed), ``transfer_ns``
    (the time a transfer was under way: the union of theirs, so that two transfers at once count
    their time once) and the bandwidth over all of them (``algbw``, ``busbw``: total size over
    that time)."""
    cols = ["group", "op", "group_size", "calls", "bytes", "transfer_ns", "algbw", "busbw"]
    if bw.empty:
        return pd.DataFrame(columns=cols)
    g = bw.assign(bus_bytes=bw["busbw"] * bw["transfer_ns"]).groupby(["group", "op"], sort=True)
    out = g.agg(group_size=("group_size", "max"), calls=("seq", "size"), bytes=("size", "sum"),
                bus_bytes=("bus_bytes", "sum")).reset_index()
    codes, keys = pd.MultiIndex.from_frame(bw[["group", "op"]]).factorize()
    start = bw["last_arrival"].to_numpy(np.int64)
    k, ns = length_by_key(codes, start, start + bw["transfer_ns"].to_numpy(np.int64))
    out["transfer_ns"] = pd.Series(ns, index=keys[k]).reindex(pd.MultiIndex.from_frame(out[["group", "op"]])).to_numpy()
    out["algbw"] = out["bytes"] / out["transfer_ns"]
    out["busbw"] = out["bus_bytes"] / out["transfer_ns"]
    return out[cols]


def overlap_by_rank(ov: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``overlap`` over the steady steps whose ops were captured, per rank: mean ms per step in
    collectives, overlapped by compute and exposed, and the exposed share of the step."""
    cols = ["rank", "steps", "comm_ms", "overlapped_ms", "exposed_ms", "step_ms", "exposed_pct"]
    steady, _ = steady_steps(steps)
    o = ov[ov["step"].isin(steady) & (ov["exposed_ns"] >= 0)]
    if o.empty:
        return pd.DataFrame(columns=cols)
    g = o.groupby("rank")
    out = pd.DataFrame({"steps": g.size(), "comm_ms": g["comm_ns"].mean() / 1e6,
                        "overlapped_ms": g["overlapped_ns"].mean() / 1e6, "exposed_ms": g["exposed_ns"].mean() / 1e6,
                        "step_ms": g["step_ns"].mean() / 1e6}).reset_index()
    out["exposed_pct"] = 100 * out["exposed_ms"] / out["step_ms"]
    return out[cols]


def by_op(waits: pd.DataFrame, matched: pd.DataFrame, steady: set[int]) -> pd.DataFrame:
    """Per group and op: collectives, rank calls, bytes one rank sent (summed over the
    collectives), mean time per rank in them (issue to completion) and mean wait per rank, over
    the whole run, each instant of a rank once (the union of its intervals: async collectives
    under way together are not added up); ``per_step``: collectives per ``steady`` step
    (``stragglers.steady_steps``). ``waits``: ``collective_match.waits`` of ``matched``."""
    t = waits.assign(group=waits["group"].astype(str), op=waits["op"].astype(str))
    per = t.groupby(["group", "op"]).agg(calls=("rank", "size"), ranks=("rank", "nunique"))
    codes, keys = pd.MultiIndex.from_frame(t[["group", "op", "rank"]]).factorize()
    start = t["start"].to_numpy(np.int64)
    for col, end in (("time_ns", np.where(t["end"] >= 0, t["end"], start)), ("wait_ns", start + t["wait_ns"])):
        k, ns = length_by_key(codes, start, end)
        per[col] = pd.Series(ns, index=keys[k] if len(k) else keys[:0]).groupby(level=[0, 1]).sum()
    mm = matched.groupby(["group", "op"]).agg(collectives=("seq", "size"), bytes=("bytes", "sum"),
                                              in_steady=("step", lambda s: int(s.isin(steady).sum())))
    out = mm.join(per).reset_index()
    n_steady = max(len(steady), 1)
    return pd.DataFrame({"group": out["group"], "op": out["op"], "collectives": out["collectives"],
                         "calls": out["calls"], "bytes": out["bytes"],
                         "time_ms_per_rank": out["time_ns"] / out["ranks"] / 1e6,
                         "wait_ms_per_rank": out["wait_ns"] / out["ranks"] / 1e6,
                         "per_step": out["in_steady"] / n_steady if steady else float("nan")})
