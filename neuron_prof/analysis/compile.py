"""torch.compile at compile time and at run time: break sites, recompiles, compile time, fusion,
and what each compiled graph and each graph break costs per step.

Run time comes from the op timeline: every compiled graph runs inside a
``Torch-Compiled Region: F/N`` range (F/N = frame id / frame compile id, the compile id that
Dynamo's compile events carry), so hits and costs need no extra capture.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.intervals import union_by_key
from neuron_prof.analysis.ops import name_mask, parent_index
from neuron_prof.store.keys import thread_key, thread_key_parts

REGION_PREFIX = "Torch-Compiled Region: "
CACHE_LIMIT_WORDS = ("cache_size_limit", "recompile_limit", "cache size limit", "recompile limit")


def normalize_compile_id(cid: str) -> str:
    """``[0/1_2]`` / ``0/1_2`` (attempt 2) -> ``0/1``: the id compiled regions are named by."""
    cid = str(cid).strip().strip("[]")
    return cid.split("_")[0]


BACKWARD_COMPILE_PHASE = "backward compile"  # collectors/compiler.py's name for the lazy backward compile


def compile_spans(compiles: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """When each thread was compiling: frame compiles and the lazy backward compiles (at the
    first ``backward()`` of a compiled graph), overlapping spans merged. Columns rank, tid, ts,
    end (ns), sorted. torch.compile compiles inside the first call that needs a graph, so these
    spans lie inside steps and inside the ops of the calling code; run-time figures leave them
    out (``analysis.ops.compile_overlap``)."""
    cols = ["rank", "tid", "ts", "end"]
    parts = [compiles[["rank", "tid", "ts", "dur"]]] if len(compiles) else []
    if len(phases):
        bwd = phases[phases["phase"].astype(str) == BACKWARD_COMPILE_PHASE]
        if len(bwd):
            parts.append(bwd[["rank", "tid", "ts", "dur"]])
    if not parts:
        return pd.DataFrame(columns=cols)
    s = pd.concat(parts, ignore_index=True)
    ts = s["ts"].to_numpy(np.int64)
    key, start, end = union_by_key(thread_key(s["rank"], s["tid"]), ts, ts + s["dur"].to_numpy(np.int64))
    rank, tid = thread_key_parts(key)
    return pd.DataFrame({"rank": rank, "tid": tid, "ts": start, "end": end}, columns=cols)


def _region_mask(ops: pd.DataFrame) -> np.ndarray:
    """Which ops are compiled-region ranges (``REGION_PREFIX``): one string test per distinct
    name, not per op."""
    names = ops["name"].astype("category")
    cats = pd.Series(names.cat.categories.astype(str))
    return cats.str.startswith(REGION_PREFIX).to_numpy()[names.cat.codes.to_numpy()]


def _region_compile_ids(names: pd.Series) -> pd.Series:
    """The compile id of each region range's graph, from its name."""
    return names.astype(str).str[len(REGION_PREFIX):].map(normalize_compile_id)


COMPILED_FORWARD, COMPILED_BACKWARD = "CompiledFunction", "CompiledFunctionBackward"
"""AOTAutograd's autograd function around a compiled forward graph, and its node that runs the
compiled backward graph (the same sequence number, on the forward's thread)."""


def _first_ancestor(parent: np.ndarray, flagged: np.ndarray, rows: np.ndarray, max_depth: int) -> np.ndarray:
    """Per row of ``rows``: the nearest of itself and its enclosing ops that is ``flagged`` (-1: none)."""
    found = np.full(len(rows), -1, np.int64)
    cur = rows.astype(np.int64)
    for _ in range(max_depth + 1):
        live = (cur >= 0) & (found < 0)
        if not live.any():
            break
        hit = live & flagged[np.maximum(cur, 0)]
        found[hit] = cur[hit]
        cur = np.where(live & ~hit, parent[np.maximum(cur, 0)], -1)
    return found


def compiled_graph_of(ops: pd.DataFrame, parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per op of ``rows`` (positions in ``ops``): the compiled graph it ran in, as its region's
    compile id (``"0/0"``) inside a ``Torch-Compiled Region`` range, ``"0/0 backward"`` inside the
    backward graph compiled with it (run by a ``CompiledFunctionBackward`` node, paired with its
    forward's ``CompiledFunction`` by thread and sequence number), ``""`` in eager code."""
    out = np.full(len(rows), "", dtype=object)
    if not len(rows) or ops.empty:
        return out
    depth = int(ops["depth"].to_numpy().max(initial=0))
    regions = _region_mask(ops)
    region = _first_ancestor(parent, regions, rows, depth)
    hit = region >= 0
    out[hit] = _region_compile_ids(ops["name"].iloc[region[hit]]).to_numpy()
    node = _first_ancestor(parent, name_mask(ops, lambda n: n == COMPILED_BACKWARD), rows, depth)
    back = (node >= 0) & ~hit
    if back.any():
        forward_rows = np.flatnonzero(name_mask(ops, lambda n: n == COMPILED_FORWARD))
        fwd = ops.iloc[forward_rows]
        by_key = {(int(r), int(t), int(q)): i for i, r, t, q in zip(forward_rows, fwd["rank"], fwd["tid"], fwd["seq"])}
        nodes = ops.iloc[node[back]]
        forward = np.array([by_key.get((int(r), int(t), int(q)), -1)
                            for r, t, q in zip(nodes["rank"], nodes["fwd_tid"], nodes["seq"])], np.int64)
        outer = _first_ancestor(parent, regions, forward, depth)
        labels = _region_compile_ids(ops["name"].iloc[outer[outer >= 0]]).to_numpy()
        out[np.flatnonzero(back)[outer >= 0]] = [f"{c} backward" for c in labels]
    return out


def first_region_runs(ops: pd.DataFrame) -> pd.Series:
    """Per compiled graph (index: compile id), the row position in ``ops`` of its first run (the
    earliest region range; on a tie, the first row): where the graph a compile produced first
    ran, e.g. for a trace's flow from the compile to it. Pass one rank's ops: ids repeat across
    ranks."""
    is_region = _region_mask(ops) if len(ops) else np.zeros(0, dtype=bool)
    pos = np.flatnonzero(is_region)
    pos = pos[np.argsort(ops["ts"].to_numpy()[pos], kind="stable")]
    cid = _region_compile_ids(ops["name"].iloc[pos])
    first = ~cid.duplicated().to_numpy()
    return pd.Series(pos[first], index=cid.to_numpy()[first], dtype=np.int64)


def region_runs(ops: pd.DataFrame, parent: np.ndarray | None = None,
                compile_ns: np.ndarray | None = None) -> pd.DataFrame:
    """One row per run of a compiled graph: rank, step, tid, ts, dur, compile_id, self_ns,
    compile_ns.

    A frame's compiled code calls the frames resumed after its graph breaks, so their regions
    nest inside it; ``self_ns`` is the region's time outside nested regions: its own graph plus
    the eager code of the break that ends it, less any compiling that happened inside it (the
    first run of a region compiles the frames it resumes into): that is ``compile_ns``.
    ``parent``: ``parent_index(ops)`` and ``compile_ns``: ``ops.compile_overlap(...)[1]``, if the
    caller has them already (without ``compile_ns`` no compile time is taken out).
    """
    cols = ["rank", "step", "tid", "ts", "dur", "compile_id", "self_ns", "compile_ns"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    is_region = _region_mask(ops)
    if not is_region.any():
        return pd.DataFrame(columns=cols)
    parent = parent_index(ops) if parent is None else parent
    # nearest enclosing region of every op (-1: none), walking up one level per pass
    enclosing = np.where(parent >= 0, parent, -1)
    for _ in range(int(ops["depth"].max())):
        up = enclosing >= 0
        step_up = up & ~is_region[np.maximum(enclosing, 0)]
        if not step_up.any():
            break
        enclosing = np.where(step_up, parent[np.maximum(enclosing, 0)], enclosing)
    cns = np.zeros(len(ops), dtype=np.int64) if compile_ns is None else np.asarray(compile_ns, dtype=np.int64)
    run_dur = ops["dur"].to_numpy() - cns
    nested = is_region & (enclosing >= 0)
    inner = np.bincount(enclosing[nested], weights=run_dur[nested], minlength=len(ops))
    runs = ops.loc[is_region, ["rank", "step", "tid", "ts", "dur"]].copy()
    runs["compile_id"] = _region_compile_ids(ops.loc[is_region, "name"])
    runs["self_ns"] = np.maximum(run_dur[is_region] - inner[is_region].astype(np.int64), 0)
    runs["compile_ns"] = cns[is_region]
    return runs.sort_values(["rank", "tid", "ts"], ignore_index=True)[cols]


def graph_runs(runs: pd.DataFrame, captured_steps: int) -> pd.DataFrame:
    """Per compiled graph (``runs`` from ``region_runs``, of the ``captured_steps`` steps the
    figures are per): runs, total and self ms, per step."""
    cols = ["compile_id", "runs", "total_ms", "self_ms", "runs_per_step", "self_ms_per_step"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    g = runs.groupby("compile_id")
    out = pd.DataFrame({"runs": g.size(), "total_ms": g["dur"].sum() / 1e6,
                        "self_ms": g["self_ns"].sum() / 1e6}).reset_index()
    n = captured_steps or np.nan  # no step: no per-step figure
    out["runs_per_step"] = out["runs"] / n
    out["self_ms_per_step"] = out["self_ms"] / n
    return out.sort_values("self_ms", ascending=False, ignore_index=True)[cols]


def graph_break_sites(breaks: pd.DataFrame, runs: pd.DataFrame, captured_steps: int) -> pd.DataFrame:
    """Graph breaks grouped by user source line and reason class, with their run-time cost
    (``runs`` from ``region_runs``, of the ``captured_steps`` steps the per-step figures are
    over: the report passes the steady-state steps).

    ``hits`` counts runs of the graphs that end at this break (the break runs once after each);
    ``frame_ms_per_step`` is those regions' self time: the graph before the break plus the eager
    code of the break, until the resumed frame starts (compile time inside them left out).
    """
    cols = ["source", "reason_class", "reason", "gb_id", "breaks", "compile_ids", "hits", "hits_per_step",
            "frame_ms_per_step"]
    if breaks.empty:
        return pd.DataFrame(columns=cols)
    b = breaks.assign(cid=breaks["compile_id"].astype(str).map(normalize_compile_id))
    hits = runs.groupby("compile_id").size()
    self_ms = runs.groupby("compile_id")["self_ns"].sum() / 1e6
    n = captured_steps or np.nan  # no step: no per-step figure
    rows = []
    for (source, cls), grp in b.groupby(["source", "reason_class"], observed=True, sort=False):
        cids = sorted(set(grp["cid"]))
        n_hits = int(sum(hits.get(c, 0) for c in cids))
        rows.append({"source": str(source), "reason_class": str(cls), "reason": str(grp["reason"].iloc[0]),
                     "gb_id": str(grp["gb_id"].iloc[0]), "breaks": len(grp), "compile_ids": cids, "hits": n_hits,
                     "hits_per_step": n_hits / n,
                     "frame_ms_per_step": float(sum(self_ms.get(c, 0.0) for c in cids)) / n})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["frame_ms_per_step", "breaks"], ascending=False, ignore_index=True)


def recompile_summary(recompiles: pd.DataFrame, compiles: pd.DataFrame) -> pd.DataFrame:
    """Per frame: recompiles, the distinct failed guards, and whether the cache limit was hit."""
    cols = ["func", "recompiles", "reasons", "cache_limit_hit"]
    if recompiles.empty and compiles.empty:
        return pd.DataFrame(columns=cols)
    limit = set()
    if len(compiles):
        text = (compiles["status"].astype(str) + " " + compiles["fail_reason"].astype(str)).str.lower()
        hit = text.map(lambda t: any(w in t for w in CACHE_LIMIT_WORDS))
        # a compile that failed on the limit may not name its frame: take it from the frame id
        frame = compiles["compile_id"].astype(str).map(lambda c: normalize_compile_id(c).split("/")[0])
        named = {f: fn for f, fn in zip(frame, compiles["func"].astype(str)) if fn}
        limit = {named.get(f, f"frame {f}") for f, fn, h in zip(frame, compiles["func"].astype(str), hit) if h}
    rows = []
    for func, grp in recompiles.groupby("func", observed=True, sort=False):
        rows.append({"func": str(func), "recompiles": grp["compile_id"].nunique(),
                     "reasons": list(dict.fromkeys(grp["reason"].astype(str))), "cache_limit_hit": str(func) in limit})
    for func in limit - {r["func"] for r in rows}:
        rows.append({"func": func, "recompiles": 0, "reasons": [], "cache_limit_hit": True})
    return pd.DataFrame(rows, columns=cols).sort_values("recompiles", ascending=False, ignore_index=True)


def compile_time(compiles: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Per compile: frame, backend, total ms and ms per top-level phase (one column each)."""
    base = ["compile_id", "func", "backend", "status", "graph_ops", "total_ms"]
    if compiles.empty:
        return pd.DataFrame(columns=base)
    out = compiles[["rank", "compile_id", "func", "backend", "status", "graph_ops"]].copy()
    out["compile_id"] = out["compile_id"].astype(str)
    out["total_ms"] = compiles["dur"].to_numpy() / 1e6
    if len(phases):
        top = phases[phases["depth"] == phases.groupby(["rank", "compile_id"], observed=True)["depth"]
                     .transform("min")]
        per = (top.assign(ms=top["dur"] / 1e6, compile_id=top["compile_id"].astype(str),
                          phase=top["phase"].astype(str))
               .pivot_table(index=["rank", "compile_id"], columns="phase", values="ms", aggfunc="sum"))
        out = out.merge(per.reset_index(), on=["rank", "compile_id"], how="left")
    return out.drop(columns="rank").sort_values("total_ms", ascending=False, ignore_index=True)


def cache_stats(cache: pd.DataFrame) -> pd.DataFrame:
    """Per cache: hits, misses, bypasses, hit rate."""
    cols = ["cache", "hit", "miss", "bypass", "hit_rate"]
    if cache.empty:
        return pd.DataFrame(columns=cols)
    t = pd.crosstab(cache["cache"].astype(str), cache["result"].astype(str))
    for c in ("hit", "miss", "bypass"):
        if c not in t.columns:
            t[c] = 0
    t["hit_rate"] = t["hit"] / (t["hit"] + t["miss"]).replace(0, np.nan)
    return t.reset_index().rename(columns={"index": "cache"})[cols]


def top_fusions(fusions: pd.DataFrame) -> pd.DataFrame:
    """Kernels by how many FX nodes they fuse, most first (every kernel: the report cuts the list)."""
    cols = ["compile_id", "backend", "kernel", "fused", "nodes"]
    if fusions.empty:
        return pd.DataFrame(columns=cols)
    out = fusions.assign(fused=fusions["nodes"].map(len), compile_id=fusions["compile_id"].astype(str),
                         backend=fusions["backend"].astype(str), kernel=fusions["kernel"].astype(str))
    return out.sort_values("fused", ascending=False, ignore_index=True)[cols]
