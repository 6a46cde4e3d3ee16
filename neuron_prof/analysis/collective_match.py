"""One collective seen from every rank of its group, on one clock.

Each rank records its own collectives (``Run.collectives``) on its own clock. ``matched`` puts
them on rank 0's clock (``analysis.clock``), joins the rows of one collective by (process group,
the group's sequence number), and reads from the join what no single rank can tell:

* **who made whom wait**: in a collective every rank waits for the last one to arrive (issue
  it), so a rank's wait is the last arrival minus its own arrival (``waits``), and the last rank,
  or the rank its lateness traces back to, is the straggler (``matched.root_rank``;
  ``analysis.stragglers`` names the ones that matter). Step time cannot show this in synchronous
  training: every rank finishes the step together.
* **what does not match**: ranks that issued a different op, size or dtype at one (group, seq),
  or never issued it (``mismatches``); collectives issued and never completed, and who never
  arrived (``in_flight``: what a hung job was stuck in).

Wait that neuron_prof caused (its own work at a step boundary on the last rank, ``matched.own_ns``:
the first flush of a run can hold a rank for a second) is measured here, so that what a rank
caused can leave it out.

Times are int64 ns; -1 means unknown. DataFrames in, DataFrames out.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from neuron_prof.analysis.clock import to_rank0
from neuron_prof.analysis.intervals import covered_before, union_by_key
from neuron_prof.analysis.steps import own_work
from neuron_prof.units import format_bytes

SAME_BYTES_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
"""Ops whose buffer must be the same size on every rank (all_to_all, gather, scatter and
point-to-point legitimately differ)."""

OPEN_STATUS = ("in_flight", "failed")
"""Statuses of a collective that was issued and never completed: it has no end (``done``)."""


def _aligned(coll: pd.DataFrame, offsets: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each row on rank 0's clock: start = the issue; end = completion (``done``),
    else the end of the issue call, else -1 (in flight, or failed without a time)."""
    ranks = coll["rank"].to_numpy()
    start = to_rank0(coll["ts"].to_numpy(np.int64), ranks, offsets)
    done = coll["done"].to_numpy(np.int64)
    status = coll["status"].astype(str).to_numpy()
    raw_end = np.where(done >= 0, done, np.where(np.isin(status, OPEN_STATUS), -1,
                                                 coll["ts"].to_numpy(np.int64) + coll["dur"].to_numpy(np.int64)))
    return start, to_rank0(raw_end, ranks, offsets)


def _members(coll: pd.DataFrame, groups: pd.DataFrame | None) -> dict[str, list[int]]:
    """Each group's members as global ranks: from ``groups`` (``Run.collective_groups``) where it
    lists them, else the ranks that issued something on the group."""
    out: dict[str, set[int]] = {str(g): set(map(int, r)) for g, r in
                                coll.groupby("group", observed=True)["rank"].unique().items()}
    if groups is not None and len(groups):
        for g, ranks in zip(groups["group"].astype(str), groups["ranks"]):
            if ranks is not None and len(ranks):
                out[g] = out.get(g, set()) | set(int(x) for x in ranks)
    return {g: sorted(v) for g, v in out.items()}


def _missing(coll: pd.DataFrame, keys: pd.DataFrame, members: dict[str, list[int]]) -> list[list[int]]:
    """Per (group, seq) of ``keys``: the members that did not issue it although their capture of
    the group had begun (they issued an earlier seq on it, or nothing on it at all)."""
    seen = coll.groupby(["group", "seq"], observed=True)["rank"].nunique()
    n_seen = seen.reindex(pd.MultiIndex.from_frame(keys[["group", "seq"]].astype({"group": str}))).fillna(0).to_numpy()
    n_members = np.array([len(members.get(str(g), [])) for g in keys["group"]])
    out: list[list[int]] = [[] for _ in range(len(keys))]
    short = np.flatnonzero(n_seen < n_members)  # the common case, everyone there, costs nothing more
    if not len(short):
        return out
    have = coll.groupby(["group", "seq"], observed=True)["rank"].agg(lambda r: set(map(int, r)))
    first = coll.groupby(["group", "rank"], observed=True)["seq"].min()
    first = {(str(g), int(r)): int(s) for (g, r), s in first.items()}
    groups, seqs = keys["group"].astype(str).to_numpy(), keys["seq"].to_numpy()
    for i in short:
        g, q = groups[i], int(seqs[i])
        got = have.get((g, q), set())
        out[i] = [r for r in members.get(g, []) if r not in got and first.get((g, r), -1) <= q]
    return out


def _modes(df: pd.DataFrame, col: str) -> pd.Series:
    """Per (group, seq) of ``df``: the most common value of ``col`` (ties: the smallest)."""
    n = df.groupby(["group", "seq", col], sort=False).size().reset_index(name="n")
    n = n.sort_values(["group", "seq", "n", col], ascending=[True, True, False, True], kind="stable")
    return n.drop_duplicates(["group", "seq"]).set_index(["group", "seq"])[col]


def _ranks_seen(df: pd.DataFrame) -> pd.Series:
    """Per (group, seq) of ``df`` (sorted by group and seq): its ranks, sorted, as a list."""
    order = df.sort_values(["group", "seq", "rank"], kind="stable")
    keys = pd.MultiIndex.from_frame(order[["group", "seq"]])
    cut = np.flatnonzero(~keys.duplicated())
    ranks = np.split(order["rank"].to_numpy(np.int64), cut[1:])
    return pd.Series([r.tolist() for r in ranks], index=keys[cut])


MATCHED_COLUMNS = ["group", "seq", "op", "step", "bytes", "out_bytes", "dtype", "group_size", "ranks_seen", "missing",
                   "first_arrival", "last_arrival", "last_rank", "root_rank", "wait_ns", "own_ns", "end", "transfer_ns",
                   "complete"]


def own_spans(steps: pd.DataFrame | None, offsets: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """neuron_prof's own work at each rank's step boundaries (``analysis.steps.own_work``: flushing
    the step) on rank 0's clock, as (rank, start, end) of disjoint intervals: what delays that
    rank's arrival at its next collective without being the rank's doing."""
    gaps = own_work(steps) if steps is not None and not steps.empty else pd.DataFrame()
    if gaps.empty:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    ranks = gaps["rank"].to_numpy(np.int64)
    start = to_rank0(gaps["ts"].to_numpy(np.int64), ranks, offsets)
    end = to_rank0((gaps["ts"] + gaps["dur"]).to_numpy(np.int64), ranks, offsets)
    return union_by_key(ranks, start, end)


def _own_ns(out: pd.DataFrame, steps: pd.DataFrame | None, offsets: pd.DataFrame) -> np.ndarray:
    """Per matched row: how much of its wait the last rank spent in neuron_prof's own work at a
    step boundary (``own_spans``), which delays that rank's arrival; the first flush of a run can
    take a second."""
    own = np.zeros(len(out), dtype=np.int64)
    key, gs, ge = own_spans(steps, offsets)
    last = out["last_rank"].to_numpy()
    for rank in np.unique(key):
        us, ue = gs[key == rank], ge[key == rank]
        rows = last == rank
        a, b = out["first_arrival"].to_numpy()[rows], out["last_arrival"].to_numpy()[rows]
        own[rows] = covered_before(us, ue, b) - covered_before(us, ue, a)
    return own


def _root_ranks(rows: pd.DataFrame, out: pd.DataFrame) -> np.ndarray:
    """Per matched collective: the rank its wait traces back to. The last rank to arrive, unless it
    came late because it was itself waiting, at its previous collective, on another group (a
    collective of the same group lets all its ranks go together: nobody inherits a delay from it),
    for at least half as long: then that collective's root. A rank slow at a tensor-parallel
    all-reduce delays its whole group; whoever of the group reaches the next world all-reduce last
    only passes the delay on (``rows``: matched's per-rank rows with aligned ``start``)."""
    r = rows.sort_values(["rank", "start"], kind="stable", ignore_index=True)
    same = r["rank"].to_numpy()[1:] == r["rank"].to_numpy()[:-1]
    prev = np.r_[-1, np.where(same, np.arange(len(r) - 1), -1)]
    keys = pd.MultiIndex.from_frame(out[["group", "seq"]])
    at = pd.MultiIndex.from_frame(r[["group", "seq", "rank"]]).get_indexer(
        pd.MultiIndex.from_arrays([out["group"], out["seq"], out["last_rank"]]))
    p_row = np.where(at >= 0, prev[np.maximum(at, 0)], -1)  # the last rank's previous collective
    p_key = np.full(len(out), -1)
    has = p_row >= 0
    p_key[has] = keys.get_indexer(pd.MultiIndex.from_frame(r.loc[p_row[has], ["group", "seq"]]))
    last_arrival, wait = out["last_arrival"].to_numpy(), out["wait_ns"].to_numpy()
    start = r["start"].to_numpy()
    waited = np.where(p_key >= 0, last_arrival[np.maximum(p_key, 0)] - start[np.maximum(p_row, 0)], 0)
    group = out["group"].to_numpy()
    other_group = (p_key >= 0) & (group[np.maximum(p_key, 0)] != group)
    inherits = other_group & (waited * 2 >= wait) & (wait > 0)
    root = out["last_rank"].to_numpy().copy()
    for i in np.argsort(last_arrival, kind="stable"):  # a collective's root after its predecessor's
        if inherits[i]:
            root[i] = root[p_key[i]]
    return root


def matched(coll: pd.DataFrame, offsets: pd.DataFrame, groups: pd.DataFrame | None = None,
            steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per collective (group, seq) across its ranks: op, step (the lowest rank's), bytes
    and out_bytes (per rank, the most common), dtype, group_size, ranks_seen, missing (members
    that never issued it), first/last_arrival (aligned issue times), last_rank (who arrived last),
    root_rank (the rank that wait traces back to: the straggler; see ``_root_ranks``),
    wait_ns (how long the first arrival waited for the last), own_ns (the part of that wait in
    which the last rank was in neuron_prof's own work at a step boundary: the profiler's doing,
    not the rank's; needs ``steps``), end (aligned latest completion,
    -1: none), transfer_ns (end - last_arrival: the collective's own time, -1 unknown) and
    complete (every member issued it and it completed on each). ``groups``: the members of each
    group (``Run.collective_groups``), to name a member that issued nothing; ``steps``:
    ``Run.steps``, for ``own_ns``."""
    if coll.empty:
        return pd.DataFrame(columns=MATCHED_COLUMNS)
    start, end = _aligned(coll, offsets)
    df = pd.DataFrame({"group": coll["group"].astype(str).to_numpy(), "seq": coll["seq"].to_numpy(np.int64),
                       "rank": coll["rank"].to_numpy(np.int64), "op": coll["op"].astype(str).to_numpy(),
                       "step": coll["step"].to_numpy(np.int64), "bytes": coll["bytes"].to_numpy(np.int64),
                       "out_bytes": coll["out_bytes"].to_numpy(np.int64), "dtype": coll["dtype"].astype(str).to_numpy(),
                       "group_size": coll["group_size"].to_numpy(np.int64), "start": start, "end": end,
                       "ok": coll["status"].astype(str).to_numpy() == "completed"})
    df = df.sort_values(["group", "seq", "start"], kind="stable", ignore_index=True)
    g = df.groupby(["group", "seq"], sort=True)
    first_rank = df.loc[g["rank"].idxmin(), ["group", "seq", "op", "step", "dtype"]].set_index(["group", "seq"])
    out = pd.DataFrame({
        "bytes": _modes(df, "bytes"), "out_bytes": _modes(df, "out_bytes"),
        "group_size": g["group_size"].max(), "ranks_seen": _ranks_seen(df),
        "first_arrival": g["start"].min(), "last_arrival": g["start"].max(),
        "last_rank": df.loc[g["start"].idxmax(), ["group", "seq", "rank"]].set_index(["group", "seq"])["rank"],
        "end": g["end"].max(), "all_ok": g["ok"].all(), "ended": g["end"].min(),
    }).join(first_rank).reset_index()
    out["wait_ns"] = out["last_arrival"] - out["first_arrival"]
    out["own_ns"] = _own_ns(out, steps, offsets)
    out["transfer_ns"] = np.where(out["end"] >= 0, np.maximum(out["end"] - out["last_arrival"], 0), -1)
    out["missing"] = _missing(coll.assign(group=coll["group"].astype(str)), out, _members(coll, groups))
    out["complete"] = out["all_ok"] & (out["ended"] >= 0) & (out["missing"].str.len() == 0)
    out["root_rank"] = _root_ranks(df, out)
    out["group_size"] = np.maximum(out["group_size"], out["ranks_seen"].str.len() + out["missing"].str.len())
    return out[MATCHED_COLUMNS]


def waits(coll: pd.DataFrame, matched: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """``coll`` plus ``start``/``end`` (aligned; end -1 while in flight), ``wait_ns`` (this rank's
    wait for the last arrival: from its arrival to the last, never past its own end),
    ``late_rank`` (who arrived last) and ``root_rank`` (whom the wait traces back to:
    ``matched.root_rank``). Waits of one rank at collectives under way together overlap: what
    the rank waited is their union (``analysis.stragglers.waited``), not their sum."""
    start, end = _aligned(coll, offsets)
    key = matched.set_index(["group", "seq"])
    idx = pd.MultiIndex.from_arrays([coll["group"].astype(str), coll["seq"].to_numpy(np.int64)])
    last = key["last_arrival"].reindex(idx).to_numpy()
    wait = np.maximum(np.nan_to_num(last, nan=0).astype(np.int64) - start, 0)
    wait = np.where(end >= 0, np.minimum(wait, np.maximum(end - start, 0)), wait)
    out = coll.copy()
    out["start"], out["end"], out["wait_ns"] = start, end, wait
    out["late_rank"] = key["last_rank"].reindex(idx).fillna(-1).to_numpy(np.int64)
    out["root_rank"] = key["root_rank"].reindex(idx).fillna(-1).to_numpy(np.int64)
    return out


def mismatches(coll: pd.DataFrame, groups: pd.DataFrame | None = None) -> pd.DataFrame:
    """Collectives the ranks of a group did not agree on: per (group, seq) and ``kind`` (op: a
    different op; bytes: a different size of an op whose buffers must match,
    ``SAME_BYTES_OPS``; dtype; missing: a member never issued it, see ``matched``), the
    ``ranks`` concerned and one readable sentence (``detail``). A different op is reported alone:
    its size and dtype differ as a consequence."""
    cols = ["group", "seq", "kind", "ranks", "detail"]
    if coll.empty:
        return pd.DataFrame(columns=cols)
    c = coll.assign(group=coll["group"].astype(str), op=coll["op"].astype(str), dtype=coll["dtype"].astype(str))
    kinds = c.groupby(["group", "seq"])[["op", "bytes", "dtype"]].nunique()
    odd_keys = set(kinds.index[(kinds > 1).any(axis=1)])  # the few that disagree, out of thousands
    rows = []
    for (g, q), x in c[[k in odd_keys for k in zip(c["group"], c["seq"])]].groupby(["group", "seq"], sort=True):
        x = x.sort_values("rank")
        for kind in ("op", "bytes", "dtype"):
            if kind == "bytes" and x["op"].iloc[0] not in SAME_BYTES_OPS:
                continue
            agreed = _agreed(x[kind])
            odd = x[x[kind] != agreed]
            if len(odd):
                said = [*odd.to_dict("records"), x[x[kind] == agreed].iloc[0].to_dict()]
                rows.append({"group": g, "seq": int(q), "kind": kind, "ranks": sorted(map(int, odd["rank"])),
                             "detail": ", ".join(map(_said, said)) + " at the same seq"})
                break
    keys = c[["group", "seq"]].drop_duplicates().sort_values(["group", "seq"], ignore_index=True)
    for (g, q), miss in zip(keys.itertuples(index=False), _missing(c, keys, _members(coll, groups))):
        if miss:
            x = c[(c["group"] == g) & (c["seq"] == q)].sort_values("rank").iloc[0].to_dict()
            rows.append({"group": g, "seq": int(q), "kind": "missing", "ranks": miss,
                         "detail": f"{_said(x)}; rank{'s' if len(miss) > 1 else ''} {', '.join(map(str, miss))} "
                                   "never did"})
    return pd.DataFrame(rows, columns=cols).sort_values(["group", "seq"], kind="stable", ignore_index=True)


def _agreed(values: pd.Series) -> Any:
    """What most ranks issued; on a tie, the lowest rank's (``values`` in rank order)."""
    counts = values.value_counts()
    tied = set(counts.index[counts == counts.max()])
    return next(v for v in values if v in tied)


def _said(row: dict[str, Any]) -> str:
    """One rank's collective in words: ``rank 1 issued all_reduce of 4.0 KiB float32``."""
    return f"rank {int(row['rank'])} issued {row['op']} of {format_bytes(row['bytes'])} {row['dtype']}".rstrip()


def in_flight(coll: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame:
    """Collectives issued and never completed (status in_flight or failed), per rank: what each
    rank was stuck in when the job hung or its group timed out, with ``arrived`` (the ranks that
    issued it too) and ``missing`` (the members that never did)."""
    cols = ["rank", "group", "seq", "op", "bytes", "dtype", "status", "ts", "step", "source", "arrived", "missing"]
    stuck = coll[coll["status"].astype(str).isin(OPEN_STATUS)]
    if stuck.empty:
        return pd.DataFrame(columns=cols)
    key = matched.set_index(["group", "seq"])
    idx = pd.MultiIndex.from_arrays([stuck["group"].astype(str), stuck["seq"].to_numpy(np.int64)])
    out = stuck.assign(group=stuck["group"].astype(str), op=stuck["op"].astype(str),
                       dtype=stuck["dtype"].astype(str), status=stuck["status"].astype(str),
                       source=stuck["source"].astype(str))
    out["arrived"] = list(key["ranks_seen"].reindex(idx))
    out["missing"] = list(key["missing"].reindex(idx))
    return out[cols].sort_values(["rank", "ts"], ignore_index=True)
