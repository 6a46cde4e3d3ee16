"""Collectives across ranks: one collective seen from every rank of its group, on one clock.

Each rank records its own collectives (``Run.collectives``) on its own clock. The analyses here
put them on rank 0's clock (``clock_offsets``, ``to_rank0``: every merged view uses them), join
the rows of one collective by (process group, the group's sequence number) (``matched``), and
read from the join what no single rank can tell:

* **who made whom wait**: in a collective every rank waits for the last one to arrive (issue
  it), so a rank's wait is the last arrival minus its own arrival, and the last rank is the
  straggler (``waits``, ``stragglers``, ``straggler_steps``). Step time cannot show this in
  synchronous training: every rank finishes the step together.
* **what does not match**: ranks that issued a different op, size or dtype at one (group, seq),
  or never issued it (``mismatches``); collectives issued and never completed, and who never
  arrived (``in_flight``: what a hung job was stuck in).
* **what communication costs**: time in collectives per step, the part no compute overlapped
  (``overlap``: the Overview's "communication" split), and achieved bandwidth (``bandwidth``).

Significance (``straggler_steps``): in synchronous training some rank is always last, by a few
microseconds of noise, and on a busy host by tens of milliseconds. A step's top straggler (the
rank that caused the most wait in it) is *significant* when the wait it caused is

* at least ``SHARE`` of the median steady step (less is not worth a finding), and
* above the run's noise floor: an outlier among the steady steps' top waits, more than ``NOISE``
  robust standard deviations (1.4826 x MAD) above their median, so the jitter every step has
  never names a rank, however large it is on a loaded host;
* or, instead of the floor, the rank is the top straggler in every steady step (at least
  ``PERSISTENT_MIN`` of them): a rank that is late every time (slower hardware, more data) makes
  its own wait the median, yet it is the most important straggler to name.

Steps are the steady ones (``analysis.steps.basis_steps``), like the rest of the report. Wait
that neuron_prof caused (its own work at a step boundary on the last rank, ``matched.own_ns``:
the first flush of a run can hold a rank for a second) is left out of what a rank caused.

Times are int64 ns; -1 means unknown. Functions take and return DataFrames; ``summary`` takes a
``Run`` only to read its tables, and returns plain JSON-ready values.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import COMM_PREFIXES, name_mask
from neuron_prof.analysis.records import records
from neuron_prof.analysis.steps import basis_steps, own_work
from neuron_prof.units import format_bytes

SHARE = 0.1
"""A significant straggler made the others wait at least this share of the median steady step."""
NOISE = 3.0
"""... and more than this many robust standard deviations above the median step's top wait."""
PERSISTENT_MIN = 3
"""A rank last in every one of at least this many steady steps needs no noise floor."""

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n}
"""busbw = algbw x factor(group size), as NCCL-tests define it (other ops: 1): what each rank's
link carried, comparable across ops and group sizes."""

SAME_BYTES_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
"""Ops whose buffer must be the same size on every rank (all_to_all, gather, scatter and
point-to-point legitimately differ)."""

OPEN_STATUS = ("in_flight", "failed")


# ---------------------------------------------------------------- clocks

def clock_offsets(clock_sync: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """Per rank of ``ranks``, the offset to rank 0's clock (rank 0's time = ts + offset):
    ``offset_start``/``ts_start`` and ``offset_end``/``ts_end`` (the first start and the last end
    measurement), ``rtt`` (the worse round trip: the estimate's error is within rtt/2),
    ``same_clock`` (one clock: every offset that applies is 0) and ``measured`` (False: no
    measurement, offset 0 assumed). A rank with one measurement gets a constant offset."""
    cols = ["rank", "offset_start", "offset_end", "ts_start", "ts_end", "rtt", "same_clock", "measured"]
    rows = []
    cs = clock_sync if len(clock_sync) else None
    for rank in ranks:
        mine = cs[cs["rank"] == rank] if cs is not None else None
        if rank == 0 or mine is None or mine.empty:
            rows.append({"rank": rank, "offset_start": 0, "offset_end": 0, "ts_start": 0, "ts_end": 0, "rtt": 0,
                         "same_clock": rank == 0, "measured": rank == 0})
            continue
        mine = mine.sort_values("ts")
        phase = mine["phase"].astype(str)
        start = mine[phase == "start"]
        end = mine[phase == "end"]
        first = (start if len(start) else mine).iloc[0]
        last = (end if len(end) else mine).iloc[-1]
        same = bool(mine["same_clock"].any())
        rows.append({"rank": rank, "offset_start": 0 if same else int(first["offset"]),
                     "offset_end": 0 if same else int(last["offset"]), "ts_start": int(first["ts"]),
                     "ts_end": int(last["ts"]), "rtt": int(mine["rtt"].max()), "same_clock": same, "measured": True})
    return pd.DataFrame(rows, columns=cols)


def to_rank0(ts: np.ndarray, ranks: np.ndarray, offsets: pd.DataFrame) -> np.ndarray:
    """``ts`` (each on its rank's clock) on rank 0's clock: the rank's offset, linear in time
    between its start and end measurements (clock drift), extrapolated on the same line outside
    them. Unknown times (< 0) stay -1; ranks without a row are left as they are."""
    ts = np.asarray(ts, dtype=np.int64)
    ranks = np.asarray(ranks)
    out = ts.copy()
    for r in offsets.itertuples(index=False):
        if r.offset_start == 0 and r.offset_end == 0:
            continue
        sel = ranks == r.rank
        t = ts[sel]
        span = r.ts_end - r.ts_start
        if span > 0 and r.offset_end != r.offset_start:
            off = r.offset_start + (t - r.ts_start) * ((r.offset_end - r.offset_start) / span)
            out[sel] = t + np.rint(off).astype(np.int64)
        else:
            out[sel] = t + int(r.offset_start)
    out[ts < 0] = -1
    return out


# ---------------------------------------------------------------- matching

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


def _own_ns(out: pd.DataFrame, steps: pd.DataFrame | None, offsets: pd.DataFrame) -> np.ndarray:
    """Per matched row: how much of its wait the last rank spent in neuron_prof's own work at a
    step boundary (``analysis.steps.own_work``: flushing the step), which delays that rank's
    arrival; the first flush of a run can take a second."""
    own = np.zeros(len(out), dtype=np.int64)
    if steps is None or steps.empty:
        return own
    gaps = own_work(steps)
    if gaps.empty:
        return own
    ranks = gaps["rank"].to_numpy(np.int64)
    start = to_rank0(gaps["ts"].to_numpy(np.int64), ranks, offsets)
    end = to_rank0((gaps["ts"] + gaps["dur"]).to_numpy(np.int64), ranks, offsets)
    key, gs, ge = _merged(ranks, start, end)
    last = out["last_rank"].to_numpy()
    for rank in np.unique(key):
        us, ue = gs[key == rank], ge[key == rank]
        rows = last == rank
        a, b = out["first_arrival"].to_numpy()[rows], out["last_arrival"].to_numpy()[rows]
        own[rows] = _covered_before(us, ue, b) - _covered_before(us, ue, a)
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
    wait for the last arrival: from its arrival to the last, never past its own end) and
    ``late_rank`` (who arrived last)."""
    start, end = _aligned(coll, offsets)
    key = matched.set_index(["group", "seq"])
    idx = pd.MultiIndex.from_arrays([coll["group"].astype(str), coll["seq"].to_numpy(np.int64)])
    last = key["last_arrival"].reindex(idx).to_numpy()
    wait = np.maximum(np.nan_to_num(last, nan=0).astype(np.int64) - start, 0)
    wait = np.where(end >= 0, np.minimum(wait, np.maximum(end - start, 0)), wait)
    out = coll.copy()
    out["start"], out["end"], out["wait_ns"] = start, end, wait
    out["late_rank"] = key["last_rank"].reindex(idx).fillna(-1).to_numpy(np.int64)
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


# ---------------------------------------------------------------- stragglers

def _steady(steps: pd.DataFrame) -> tuple[set[int], float]:
    """The steady step numbers (``basis_steps``: all complete steps where none is steady) and
    the median step time over them (ns)."""
    basis = basis_steps(steps).steps
    return set(map(int, basis["step"])), float(basis["dur"].median()) if len(basis) else 0.0


def _caused(matched: pd.DataFrame, steady: set[int]) -> pd.DataFrame:
    """Wait caused per steady step and rank: the waits of the collectives it is the root of
    (``matched.root_rank``: it arrived last, or made the last rank late), less what neuron_prof's own work made of them (``own_ns``; collectives seen on one rank
    cause no wait)."""
    m = matched[matched["step"].isin(steady) & (matched["ranks_seen"].str.len() > 1)]
    m = m.assign(caused=m["wait_ns"] - m["own_ns"])
    return (m.groupby(["step", "root_rank"])["caused"].sum().rename_axis(["step", "rank"])
            .reset_index(name="wait_caused_ns"))


def noise_floor_ns(top_waits: np.ndarray) -> float:
    """Median + ``NOISE`` robust standard deviations of the steps' top waits."""
    if not len(top_waits):
        return 0.0
    mid = float(np.median(top_waits))
    return mid + NOISE * 1.4826 * float(np.median(np.abs(top_waits - mid)))


def straggler_steps(matched: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per steady step with collectives seen on more than one rank: the rank that caused the most
    wait in it (``rank``, ``wait_caused_ns``) and whether that is ``significant`` (module
    docstring); ``threshold_ns``: the wait a step needed, the same for every step."""
    cols = ["step", "rank", "wait_caused_ns", "significant", "threshold_ns"]
    steady, median_step = _steady(steps)
    caused = _caused(matched, steady)
    if caused.empty:
        return pd.DataFrame(columns=cols)
    top = caused.sort_values(["step", "wait_caused_ns", "rank"], ascending=[True, False, True]).drop_duplicates("step")
    wait = top["wait_caused_ns"].to_numpy(np.float64)
    persistent = top["rank"].nunique() == 1 and len(top) >= PERSISTENT_MIN
    floor = 0.0 if persistent else noise_floor_ns(wait)
    significant = (wait >= SHARE * median_step) & (wait > floor)
    return top.assign(significant=significant, threshold_ns=max(SHARE * median_step, floor))[cols].reset_index(drop=True)


def stragglers(matched: pd.DataFrame, waits: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, over the steady steps, worst first: ``steps`` (those in which it was the
    significant straggler: ``straggler_steps``), ``times_last`` (the collectives it arrived last
    at, making others wait, in those steps), ``wait_caused_ns`` (the waits of all the collectives
    it arrived last at, in any steady step, less neuron_prof's own), its ``share`` of all the
    wait caused, and ``waited_ns`` (how long it waited for others itself)."""
    cols = ["rank", "times_last", "wait_caused_ns", "share", "steps", "waited_ns"]
    steady, _ = _steady(steps)
    caused = _caused(matched, steady)
    if caused.empty:
        return pd.DataFrame(columns=cols)
    m = matched[matched["step"].isin(steady) & (matched["ranks_seen"].str.len() > 1)]
    ranks = sorted({int(r) for rs in m["ranks_seen"] for r in rs})
    per = caused.groupby("rank")["wait_caused_ns"].sum().reindex(ranks, fill_value=0)
    sig = straggler_steps(matched, steps)
    sig = sig[sig["significant"]]
    named = [sorted(map(int, sig.loc[sig["rank"] == r, "step"])) for r in ranks]
    at = m[m["wait_ns"] > m["own_ns"]]
    times = [int(((at["root_rank"] == r) & at["step"].isin(s)).sum()) for r, s in zip(ranks, named)]
    waited = waits[waits["step"].isin(steady)].groupby("rank")["wait_ns"].sum().reindex(ranks, fill_value=0)
    total = float(per.sum())
    out = pd.DataFrame({"rank": ranks, "times_last": times,
                        "wait_caused_ns": per.to_numpy(np.int64),
                        "share": per.to_numpy() / total if total else 0.0, "steps": named,
                        "waited_ns": waited.to_numpy(np.int64)})
    # worst first: the most significant steps, then the most wait caused (a rank at the root of a
    # long chain of small waits in one step is not worse than one that stalls the job every 10 steps)
    out["n_steps"] = out["steps"].str.len()
    return out.sort_values(["n_steps", "wait_caused_ns", "rank"], ascending=[False, False, True],
                           ignore_index=True)[cols]


# ---------------------------------------------------------------- overlap and bandwidth

def _covered_before(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How much of the disjoint sorted intervals [us, ue) lies before each time ``t``."""
    cum = np.r_[0, np.cumsum(ue - us)]
    k = np.searchsorted(us, t, side="right") - 1
    kk = np.maximum(k, 0)
    part = np.clip(np.minimum(t, ue[kk]) - us[kk], 0, None) if len(us) else np.zeros(len(t), np.int64)
    return np.where(k >= 0, cum[kk] + part, 0)


def _merged(key: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key, the union of its intervals [s, e), as (key, start, end) of disjoint intervals
    sorted by key and start."""
    df = pd.DataFrame({"key": key, "s": s, "e": e}).sort_values(["key", "s"], kind="stable")
    reach = df.groupby("key", sort=False)["e"].cummax()
    before = reach.groupby(df["key"], sort=False).shift()
    piece = (before.isna() | (df["s"] > before)).cumsum()
    out = df.assign(e=reach).groupby(piece.to_numpy(), sort=True).agg(key=("key", "first"), s=("s", "min"),
                                                                      e=("e", "max"))
    return out["key"].to_numpy(), out["s"].to_numpy(np.int64), out["e"].to_numpy(np.int64)


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
    thread = pd.factorize(rank << 40 | tid)[0].astype(np.int64)
    order = np.lexsort((depth, ts, thread))  # an op with children is followed by its first child
    cur, nxt = order[:-1], order[1:]
    parent = np.zeros(len(ops), dtype=bool)
    parent[cur] = (thread[nxt] == thread[cur]) & (depth[nxt] > depth[cur]) & (ts[nxt] < end[cur])
    leaf = ~parent & ~comm
    lk, ls, le = _merged(thread[leaf], ts[leaf], end[leaf])
    hk, hs, he = _merged(thread[comm], ts[comm], end[comm])  # what runs inside a collective is communication
    # a sweep per thread: +1 inside an innermost op, -1 inside a collective; 1 = computing
    key = np.r_[lk, lk, hk, hk]
    t = np.r_[ls, le, hs, he]
    step = np.r_[np.ones(len(lk)), -np.ones(len(lk)), -np.ones(len(hk)), np.ones(len(hk))].astype(np.int64)
    o = np.lexsort((t, key))
    key, t, level = key[o], t[o], np.cumsum(step[o])
    on = (level[:-1] == 1) & (key[:-1] == key[1:]) & (t[1:] > t[:-1])
    rank_of = pd.Series(rank).groupby(thread).first().to_numpy()
    return _merged(rank_of[key[:-1][on]], t[:-1][on], t[1:][on])


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
    key = rank << 32 | (step + 1)  # one key per (rank, step); step -1 (before the first) included
    k, cs, ce = _merged(key, ts, end)
    over = np.zeros(len(k), dtype=np.int64)
    if len(ops):
        o_rank_k, us, ue = _compute(ops)
        for r in np.unique(k >> 32):
            sel, mine = (k >> 32) == r, o_rank_k == r
            over[sel] = (_covered_before(us[mine], ue[mine], ce[sel]) -
                         _covered_before(us[mine], ue[mine], cs[sel]))
    per = pd.DataFrame({"key": k, "comm_ns": ce - cs, "overlapped_ns": over}).groupby("key").sum()
    out = pd.DataFrame({"rank": (per.index.to_numpy() >> 32).astype(np.int64),
                        "step": (per.index.to_numpy() & 0xFFFFFFFF).astype(np.int64) - 1,
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
    cols = ["group", "seq", "op", "step", "group_size", "size", "transfer_ns", "algbw", "busbw"]
    m = matched[(matched["transfer_ns"] > 0) & matched["complete"]]
    if m.empty:
        return pd.DataFrame(columns=cols)
    size = np.maximum(m["bytes"].to_numpy(np.int64), m["out_bytes"].to_numpy(np.int64))
    algbw = size / m["transfer_ns"].to_numpy(np.float64)  # bytes per ns = GB/s
    factor = np.array([BUS_FACTORS.get(op, lambda n: 1.0)(max(int(n), 1)) for op, n in zip(m["op"], m["group_size"])])
    return m.assign(size=size, algbw=algbw, busbw=algbw * factor)[cols].reset_index(drop=True)


def group_bandwidth(bw: pd.DataFrame) -> pd.DataFrame:
    """Per group and op (from ``bandwidth``): ``calls``, ``bytes`` (sizes summed), ``transfer_ns``
    and the bandwidth over all of them (``algbw``, ``busbw``: total size over total time)."""
    cols = ["group", "op", "group_size", "calls", "bytes", "transfer_ns", "algbw", "busbw"]
    if bw.empty:
        return pd.DataFrame(columns=cols)
    g = bw.assign(bus_bytes=bw["busbw"] * bw["transfer_ns"]).groupby(["group", "op"], sort=True)
    out = g.agg(group_size=("group_size", "max"), calls=("seq", "size"), bytes=("size", "sum"),
                transfer_ns=("transfer_ns", "sum"), bus_bytes=("bus_bytes", "sum")).reset_index()
    out["algbw"] = out["bytes"] / out["transfer_ns"]
    out["busbw"] = out["bus_bytes"] / out["transfer_ns"]
    return out[cols]


# ---------------------------------------------------------------- summary

def _where(w: pd.DataFrame, m: pd.DataFrame, rank: int, steps: list[int]) -> dict[str, Any]:
    """The collective of ``steps`` at which ``rank`` made the others wait longest, as the rank
    issued it: op, bytes, source line, module, backward or not."""
    mine = m[(m["root_rank"] == rank) & m["step"].isin(steps)]
    if (mine["last_rank"] == rank).any():  # where it was late itself, not where its delay was passed on
        mine = mine[mine["last_rank"] == rank]
    if mine.empty:
        return {}
    top = mine.loc[(mine["wait_ns"] - mine["own_ns"]).idxmax()]
    r = w[(w["rank"] == rank) & (w["group"].astype(str) == top["group"]) & (w["seq"] == top["seq"])]
    if r.empty:
        return {}
    r = r.iloc[0]
    return {"group": top["group"], "seq": int(top["seq"]), "op": top["op"], "bytes": int(top["bytes"]),
            "source": str(r["source"]), "user_source": str(r["user_source"]), "module": str(r["module"]),
            "bwd": bool(r["bwd"])}


def _groups(groups: pd.DataFrame) -> pd.DataFrame:
    """One row per process group: name, description, backend, size, members."""
    g = groups.drop_duplicates("group")
    return pd.DataFrame({"group": g["group"].astype(str), "desc": g["desc"].astype(str),
                         "backend": g["backend"].astype(str), "size": g["size"],
                         "ranks": [list(map(int, x)) for x in g["ranks"]]})


def _by_op(w: pd.DataFrame, m: pd.DataFrame, steady: set[int]) -> pd.DataFrame:
    """Per group and op: collectives, rank calls, bytes one rank sent (summed over the
    collectives), mean time per rank in them (issue to completion) and mean wait per rank, over
    the whole run; ``per_step``: collectives per steady step."""
    t = w.assign(group=w["group"].astype(str), op=w["op"].astype(str),
                 time=np.where(w["end"] >= 0, w["end"] - w["start"], 0))
    per = t.groupby(["group", "op"]).agg(calls=("rank", "size"), ranks=("rank", "nunique"), time_ns=("time", "sum"),
                                         wait_ns=("wait_ns", "sum"))
    mm = m.groupby(["group", "op"]).agg(collectives=("seq", "size"), bytes=("bytes", "sum"),
                                        in_steady=("step", lambda s: int(s.isin(steady).sum())))
    out = mm.join(per).reset_index()
    n_steady = max(len(steady), 1)
    return pd.DataFrame({"group": out["group"], "op": out["op"], "collectives": out["collectives"],
                         "calls": out["calls"], "bytes": out["bytes"],
                         "time_ms_per_rank": out["time_ns"] / out["ranks"] / 1e6,
                         "wait_ms_per_rank": out["wait_ns"] / out["ranks"] / 1e6,
                         "per_step": out["in_steady"] / n_steady if steady else float("nan")})


def overlap_by_rank(ov: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``overlap`` over the steady steps whose ops were captured, per rank: mean ms per step in
    collectives, overlapped by compute and exposed, and the exposed share of the step."""
    cols = ["rank", "steps", "comm_ms", "overlapped_ms", "exposed_ms", "step_ms", "exposed_pct"]
    steady, _ = _steady(steps)
    o = ov[ov["step"].isin(steady) & (ov["exposed_ns"] >= 0)]
    if o.empty:
        return pd.DataFrame(columns=cols)
    g = o.groupby("rank")
    out = pd.DataFrame({"steps": g.size(), "comm_ms": g["comm_ns"].mean() / 1e6,
                        "overlapped_ms": g["overlapped_ns"].mean() / 1e6, "exposed_ms": g["exposed_ns"].mean() / 1e6,
                        "step_ms": g["step_ns"].mean() / 1e6}).reset_index()
    out["exposed_pct"] = 100 * out["exposed_ms"] / out["step_ms"]
    return out[cols]


def summary(run: Any) -> dict[str, Any]:
    """Everything the report, its JSON and the viewer's header show about collectives, JSON-ready
    (``report.summarize`` puts it under ``"collectives"``). ``run``: a ``neuron_prof.Run`` (its
    tables and cached analyses are read, nothing else). ``{"captured": False}`` when the run has
    no collective."""
    coll = run.collectives
    if coll.empty:
        return {"captured": False, "ranks": len(run.ranks)}
    m, w, kinds = run.collectives_matched, run.collective_waits, run.step_kinds
    steady, median_step = _steady(kinds)
    ranking = stragglers(m, w, kinds)
    per_step = straggler_steps(m, kinds)
    ranking_rows = records(ranking)
    for r in ranking_rows:
        sig = per_step[(per_step["rank"] == r["rank"]) & per_step["significant"]]
        r["wait_in_steps_ns"] = int(sig["wait_caused_ns"].sum())
        r["where"] = _where(w, m, r["rank"], r["steps"])
    status = coll["status"].astype(str).value_counts()
    return {
        "captured": True,
        "ranks": len(run.ranks),
        "collectives": int(len(m)),
        "calls": int(len(coll)),
        "status": {k: int(v) for k, v in status.items() if v},
        "groups": records(_groups(run.collective_groups)),
        "by_op": records(_by_op(w, m, steady)),
        "steady_steps": len(steady),
        "median_step_ms": median_step / 1e6,
        "threshold_ms": float(per_step["threshold_ns"].iloc[0] if len(per_step) else SHARE * median_step) / 1e6,
        "stragglers": ranking_rows,
        "straggler_steps": records(per_step),
        "mismatches": records(run.collective_mismatches),
        "in_flight": records(in_flight(coll, m)),
        "overlap": records(overlap_by_rank(run.collective_overlap, kinds)),
        "bandwidth": records(group_bandwidth(bandwidth(m))),
        "clock": records(run.collective_offsets),
    }
