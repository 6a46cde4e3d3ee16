"""Memory analyses: allocations with lifetimes and categories, timeline, peaks, leaks, diffs.

Pandas in, pandas out; inputs are ``Run.memory_events``, ``Run.memory_tensors``,
``Run.memory_steps``, ``Run.memory_sources``, ``Run.process_memory`` and ``Run.steps``. Every byte
figure is what the allocator was asked for (the CPU allocator and CUDA's caching allocator report
requested sizes), per device, except the process's resident memory (:func:`process_growth`) and the
per-step figures of a device whose allocator does not report to the profiler: its backend's own
counters (:func:`figures_from`), totals without lines.

Each allocation names the line that made it (``source``, possibly inside a library) and the
innermost line of the user's own files on the way there (``user_source``: the call that led to
it); ``grad`` says an op returned a tensor over the block that carries a ``grad_fn`` (it belongs
to an autograd graph).

Categories (:func:`allocations`), decided in this order:

``parameter``, ``gradient``, ``optimizer state``
    the block holds, at a captured step boundary, a tensor an optimizer that stepped knows in that
    role (its params, their ``.grad``, its ``state``) — exact, from Python, by storage address.
``input``
    made outside any module and outside backward/optimizer by a top-level factory or copy op
    (``randn``, ``zeros``, ``empty``, ``tensor``, ``arange``, ``to``, ``_to_copy``, ``pin_memory``,
    ...): the data the loop feeds the model.
``activation``
    made in the forward pass (not a backward op, not inside ``Optimizer.step``) and either freed by
    a backward op (autograd released it after using it) or alive after its step ended (kept for a
    backward that has not run, or never will: the classic leak of a retained graph).
``temporary``
    freed within the step it was made in, by an op of the same pass, or by a non-backward op.
``other``
    the rest: made outside any op, before capture windows (``baseline`` without a known role), or
    in backward/optimizer and alive after the step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from neuron_prof.analysis.steps import captured_steps
from neuron_prof.paths import is_user_file
from neuron_prof.store.schema import LEAK_CONFIRMED_BY, MEMORY_FIGURES

CATEGORIES = ("parameter", "gradient", "optimizer state", "input", "activation", "temporary", "other")
NEVER = np.iinfo(np.int64).max  # free_ts of a block still live when capture ended
_INPUT_OPS = re.compile(
    r"^aten::(randn|rand|randint|randperm|normal|zeros|ones|empty|empty_strided|full|tensor|scalar_tensor|"
    r"arange|linspace|from_file|as_tensor|to|_to_copy|copy_|pin_memory|_pin_memory|clone|stack|cat)(_like)?$")
_OPTIMIZER = "Optimizer."
ALLOC_COLUMNS = ["rank", "device", "addr", "bytes", "alloc_ts", "free_ts", "step", "op", "top_op", "module",
                 "source", "user_source", "source_full", "stack", "shape", "dtype", "bwd", "grad", "free_op",
                 "free_bwd", "baseline", "category"]


def _step_of(ts: np.ndarray, rank: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step each timestamp falls in, per rank (-1: before the first step)."""
    out = np.full(len(ts), -1, dtype=np.int32)
    for r in np.unique(rank):
        s = steps[steps["rank"] == r].sort_values("ts")
        idx = np.flatnonzero(rank == r)
        if len(s) and len(idx):
            pos = np.searchsorted(s["ts"].to_numpy(), ts[idx], side="right") - 1
            out[idx] = np.where(pos >= 0, s["step"].to_numpy()[np.maximum(pos, 0)], -1)
    return out


def _where(col: pd.Series, test) -> np.ndarray:
    """``test`` (a function of one string) per row, evaluated once per distinct value."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = np.array([bool(test(str(c))) for c in col.cat.categories] + [bool(test(""))])
        return cats[col.cat.codes.to_numpy()]  # code -1 (missing) takes the last entry
    return np.array([bool(test(str(v))) for v in col], dtype=bool)


def _take(col: pd.Series, pos: np.ndarray, hit: np.ndarray) -> pd.Categorical:
    """``col[pos]`` where ``hit``, else the empty string, as a categorical (no per-row strings)."""
    c = col.astype("category") if not isinstance(col.dtype, pd.CategoricalDtype) else col
    cats = c.cat.categories.astype(str)
    if "" not in set(cats):
        cats = cats.append(pd.Index([""]))
        c = c.cat.set_categories(cats) if len(c) else pd.Series(pd.Categorical([], categories=cats))
    codes = c.cat.codes.to_numpy()[np.maximum(pos, 0)] if len(c) else np.zeros(len(pos), np.int8)
    empty = cats.get_loc("")
    return pd.Categorical.from_codes(np.where(hit & (codes >= 0), codes, empty), categories=cats)


def allocations(events: pd.DataFrame, tensors: pd.DataFrame | None = None,
                steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per captured allocation with its lifetime (``free_ts`` = :data:`NEVER` if it was
    still live when capture ended), the step it was made in, attribution and category."""
    kind = events["kind"]
    made = np.flatnonzero(kind.isin(["alloc", "baseline"]).to_numpy())
    # an ``unfollowed`` block's lifetime is known until its window closed (CPU blocks, where
    # always-on capture follows CPU allocations in its sampled steps only): it ends there
    freed = np.flatnonzero(kind.isin(["free", "late_free", "unfollowed"]).to_numpy())
    # each allocation's free by exact key lookup (a merge would turn missing int64 times into floats)
    first, firsts, pos = _match_frees(_lifetime_key(events), made, freed)
    a = events.iloc[made[first]].reset_index(drop=True)
    frees = events.iloc[freed[firsts]]
    hit = pos >= 0
    a["free_ts"] = np.where(hit, frees["ts"].to_numpy(np.int64)[np.maximum(pos, 0)] if len(frees) else 0, NEVER)
    a["free_op"] = _take(frees["op"], pos, hit)
    a["free_bwd"] = hit & (frees["bwd"].to_numpy(bool)[np.maximum(pos, 0)] if len(frees) else False)
    # a block drained before the op that returned it ended learns it is in a graph from its free
    a["grad"] = a["grad"].to_numpy(bool) | (hit & (frees["grad"].to_numpy(bool)[np.maximum(pos, 0)]
                                                   if len(frees) else False))
    # an allocation drained before the op that made it ended learns its shape from its free
    for col in ("shape", "dtype"):
        late = _take(frees[col], pos, hit)
        mine = a[col].astype("category") if not isinstance(a[col].dtype, pd.CategoricalDtype) else a[col]
        missing = _where(mine, lambda v: v == "")
        if missing.any():  # by codes: object arrays of every row took 0.1 s per column at 200k blocks
            both = pd.api.types.union_categoricals([pd.Categorical(mine), late]).categories
            a[col] = pd.Categorical.from_codes(np.where(missing, late.set_categories(both).codes,
                                                        pd.Categorical(mine).set_categories(both).codes), both)
    a["baseline"] = (a["kind"] == "baseline").to_numpy(bool)
    a["bytes"] = a["bytes"].astype(np.int64)
    if steps is not None and len(steps):
        a["step"] = _step_of(a["alloc_ts"].to_numpy(), a["rank"].to_numpy(), steps)
    else:
        a["step"] = np.int32(-1)
    a["category"] = _categories(a, tensors, steps)
    a = a.sort_values(["rank", "alloc_ts"], ignore_index=True)
    for c in ("device", "op", "top_op", "module", "source", "user_source", "source_full", "shape", "dtype",
              "free_op"):
        if c in a and a[c].dtype != "category":
            a[c] = a[c].astype(str).astype("category")
    return a[ALLOC_COLUMNS]


def _lifetime_key(events: pd.DataFrame) -> list[np.ndarray]:
    """An allocation's identity per event: rank, device (as codes), address and the time it was
    made; numpy columns, so finding duplicates and frees needs no pandas index."""
    dev = events["device"]
    codes = dev.cat.codes.to_numpy() if isinstance(dev.dtype, pd.CategoricalDtype) else \
        pd.factorize(dev.astype(str).to_numpy(object))[0]
    return [events["rank"].to_numpy(), codes, events["addr"].to_numpy(), events["alloc_ts"].to_numpy()]


def _group_starts(keys: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Mask over the rows in ``order`` (sorted by ``keys``): where a new key begins."""
    new = np.zeros(len(order), dtype=bool)
    new[:1] = True
    for k in keys:
        sk = k[order]
        new[1:] |= sk[1:] != sk[:-1]
    return new


def _match_frees(key: list[np.ndarray], made: np.ndarray, freed: np.ndarray) -> tuple[np.ndarray, ...]:
    """The first of the ``made`` rows of each distinct ``key`` and the first of the ``freed`` rows
    (``drop_duplicates(keep="first")`` of each: positions into ``made`` and ``freed``, ascending),
    and per kept made row the position among the kept freed rows of its free (-1: none), as
    ``MultiIndex.get_indexer`` would find it. One sort of both: pandas factorized every key
    column of each (0.1 s a table at 200k allocations)."""
    rows = np.r_[made, freed]
    k = [c[rows] for c in key]
    order = np.lexsort(k[::-1])  # stable: in a key's run, its made rows (in row order), then its freed rows
    new = _group_starts(k, order)
    is_made = order < len(made)
    made_first = new & is_made
    freed_first = ~is_made & (new | np.r_[False, is_made[:-1]])
    first = np.sort(order[made_first])
    firsts = np.sort(order[freed_first] - len(made))
    group = np.cumsum(new) - 1
    freed_at = np.full(int(group[-1]) + 1 if len(group) else 0, -1, dtype=np.intp)
    freed_at[group[freed_first]] = np.searchsorted(firsts, order[freed_first] - len(made))
    pos = np.empty(len(first), dtype=np.intp)
    pos[np.searchsorted(first, order[made_first])] = freed_at[group[made_first]]
    return first, firsts, pos


def _categories(a: pd.DataFrame, tensors: pd.DataFrame | None, steps: pd.DataFrame | None) -> pd.Categorical:
    code = {c: np.int8(i) for i, c in enumerate(CATEGORIES)}  # codes, not strings: no object array per block
    cat = np.full(len(a), code["other"], dtype=np.int8)
    has_op = _where(a["op"], lambda v: v != "")
    bwd = a["bwd"].to_numpy(bool)
    in_opt = _where(a["top_op"], lambda v: v.startswith(_OPTIMIZER))
    forward = has_op & ~bwd & ~in_opt
    # the end of each allocation's step (a block alive past it outlived its step)
    step_end = np.full(len(a), NEVER, dtype=np.int64)
    if steps is not None and len(steps):
        ends = steps.assign(end=steps["ts"] + steps["dur"]).set_index(["rank", "step"])["end"]
        idx = pd.MultiIndex.from_arrays([a["rank"].to_numpy(), a["step"].to_numpy()])
        step_end = ends.reindex(idx, fill_value=NEVER).to_numpy(np.int64)
    free_ts = a["free_ts"].to_numpy(np.int64)
    outlived = free_ts > step_end
    free_bwd = a["free_bwd"].to_numpy(bool)
    is_input = (forward & _where(a["module"], lambda v: v == "")
                & _where(a["top_op"], lambda v: bool(_INPUT_OPS.match(v))))
    cat[forward & ~is_input & ~outlived & ~free_bwd] = code["temporary"]
    cat[(bwd | in_opt) & ~outlived] = code["temporary"]
    cat[forward & ~is_input & (outlived | free_bwd)] = code["activation"]
    cat[is_input] = code["input"]
    if tensors is not None and len(tensors):
        role = _known_roles(a, tensors)
        cat = np.where(role != _NO_ROLE, role, cat)
    return pd.Categorical.from_codes(cat, categories=CATEGORIES)


_NO_ROLE = -2
"""``_known_roles``'s code of a block without one (-1 is a role outside ``CATEGORIES``: missing)."""


def _known_roles(a: pd.DataFrame, tensors: pd.DataFrame) -> np.ndarray:
    """The Python-known role of each allocation alive at a boundary where its address had one,
    as its code in ``CATEGORIES`` (``_NO_ROLE``: none)."""
    out = np.full(len(a), _NO_ROLE, dtype=np.int8)
    left = a[["rank", "device", "addr", "alloc_ts", "free_ts"]].reset_index(names="i")
    right = tensors[["rank", "device", "addr", "ts", "category"]].copy()
    # only blocks at an address a tensor had can match: the merge then reads a few rows, not every block
    left = left[np.isin(left["addr"].to_numpy(), right["addr"].to_numpy())]
    for df in (left, right):
        df["device"] = df["device"].astype(str)
    m = left.merge(right, on=["rank", "device", "addr"], how="inner")
    m = m[(m["alloc_ts"] <= m["ts"]) & (m["ts"] < m["free_ts"])]
    if len(m):
        order = {c: i for i, c in enumerate(CATEGORIES)}
        m = m.assign(o=m["category"].astype(str).map(order)).sort_values(["i", "o"]).drop_duplicates("i")
        role = m["category"].astype(str)
        codes = pd.Categorical(role, categories=CATEGORIES).codes
        out[m["i"].to_numpy()] = np.where(role.to_numpy(object) == "", _NO_ROLE, codes)
    return out


# ---------------------------------------------------------------- live memory over time
def _deltas(allocs: pd.DataFrame) -> pd.DataFrame:
    """+bytes at each allocation, -bytes at each free, time-ordered per rank and device (equal
    times: allocations first, larger first; then row order). Sorted as numpy arrays: pandas'
    four-column sort of a concatenated frame took most of the timeline's time."""
    gone = np.flatnonzero(allocs["free_ts"].to_numpy(np.int64) != NEVER)
    rows = np.r_[np.arange(len(allocs)), gone]
    ts = np.r_[allocs["alloc_ts"].to_numpy(np.int64), allocs["free_ts"].to_numpy(np.int64)[gone]]
    size = allocs["bytes"].to_numpy(np.int64)
    size = np.r_[size, -size[gone]]
    device = pd.Categorical(allocs["device"])   # sorted by its categories' order, missing last
    dev = np.where(device.codes < 0, len(device.categories), device.codes)[rows]
    # a key with one value orders nothing: one rank and device (the common case) sort two keys, not four
    keys = [k for k in (dev, allocs["rank"].to_numpy()[rows]) if len(k) and (k != k[0]).any()]
    order = np.lexsort((-size, ts, *keys))
    at = rows[order]
    return pd.DataFrame({"rank": allocs["rank"].to_numpy()[at], "device": allocs["device"].array[at],
                         "ts": ts[order], "bytes": size[order], "category": allocs["category"].array[at]})


def _extremes(total: np.ndarray, max_points: int) -> np.ndarray:
    """Rows to keep of a timeline longer than ``max_points``: in each of ``max_points // 2 - 1``
    equal buckets the first minimum and first maximum of ``total``, and the first and last row."""
    half = max(max_points // 2 - 1, 1)
    bucket = np.minimum(np.arange(len(total)) * half // len(total), half - 1)  # non-decreasing, none empty
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    keep = np.zeros(len(total), dtype=bool)
    for extreme in (np.minimum, np.maximum):
        at = np.flatnonzero(total == extreme.reduceat(total, starts)[bucket])  # every row equal to its bucket's
        keep[at[np.r_[True, bucket[at][1:] != bucket[at][:-1]]]] = True  # the first of them per bucket
    keep[[0, -1]] = True
    return np.flatnonzero(keep)


def timeline(allocs: pd.DataFrame, max_points: int = 4000) -> pd.DataFrame:
    """Live bytes over time per rank and device, total and per category, downsampled to at most
    ``max_points`` rows per device keeping each bucket's minimum and maximum total (so the peak is
    always a row) and the first and last state."""
    cols = ["rank", "device", "ts", "total", *CATEGORIES]
    if allocs.empty:
        return pd.DataFrame(columns=cols)
    d = _deltas(allocs)
    parts = []
    for (rank, device), g in d.groupby(["rank", "device"], observed=True, sort=True):
        # running sum per category (numpy: a crosstab of millions of events takes seconds)
        codes = pd.Categorical(g["category"], categories=CATEGORIES).codes
        delta = g["bytes"].to_numpy(np.int64)
        ts = g["ts"].to_numpy(np.int64)
        settled = np.r_[ts[1:] != ts[:-1], True]  # simultaneous events: the state after all of them
        live = [np.cumsum(np.where(codes == i, delta, 0))[settled] for i in range(len(CATEGORIES))]
        total = live[0].copy()
        for c in live[1:]:
            total += c
        # rows chosen before the frame is built: a frame of every event took 0.1 s at 400k events
        rows = _extremes(total, max_points) if len(total) > max_points else slice(None)
        per = pd.DataFrame({c: live[i][rows] for i, c in enumerate(CATEGORIES)},
                           index=pd.Index(ts[settled][rows], name="ts"))
        per["total"] = total[rows]
        per.columns.name = "category"
        per = per.reset_index().assign(rank=rank, device=device)
        parts.append(per[cols])
    return pd.concat(parts, ignore_index=True)


def live_at(allocs: pd.DataFrame, ts: int, rank: int | None = None, device: str | None = None) -> pd.DataFrame:
    """The allocations alive at ``ts`` (made at or before it, freed after it)."""
    m = (allocs["alloc_ts"] <= ts) & (allocs["free_ts"] > ts)
    if rank is not None:
        m &= allocs["rank"] == rank
    if device is not None:
        m &= allocs["device"].astype(str) == device
    return allocs[m]


def snapshot(allocs: pd.DataFrame, ts: int, by: str | list[str] = "category", rank: int | None = None,
             device: str | None = None) -> pd.DataFrame:
    """Live bytes and block count at ``ts`` grouped ``by`` (category, source, module, op, ...)."""
    by = [by] if isinstance(by, str) else list(by)
    live = live_at(allocs, ts, rank, device)
    out = live.groupby(by, observed=True).agg(bytes=("bytes", "sum"), blocks=("bytes", "size")).reset_index()
    return out.sort_values("bytes", ascending=False, ignore_index=True)


def snapshot_diff(allocs: pd.DataFrame, ts_a: int, ts_b: int, by: str = "source", rank: int | None = None,
                  device: str | None = None) -> pd.DataFrame:
    """What appeared between two times (alive at ``ts_b``, not at ``ts_a``) and what went away,
    by ``by``; ``net`` = appeared - gone, largest growth first."""
    a = live_at(allocs, ts_a, rank, device)
    b = live_at(allocs, ts_b, rank, device)
    key = ["rank", "device", "addr", "alloc_ts"]
    new = b.merge(a[key], on=key, how="left", indicator=True)
    new = new[new["_merge"] == "left_only"]
    gone = a.merge(b[key], on=key, how="left", indicator=True)
    gone = gone[gone["_merge"] == "left_only"]
    up = new.groupby(by, observed=True)["bytes"].agg(appeared="sum", appeared_blocks="size")
    down = gone.groupby(by, observed=True)["bytes"].agg(gone="sum", gone_blocks="size")
    out = up.join(down, how="outer").fillna(0).astype(np.int64)
    out["net"] = out["appeared"] - out["gone"]
    return out.reset_index().sort_values("net", ascending=False, ignore_index=True)


def step_boundaries(steps: pd.DataFrame) -> pd.DataFrame:
    """rank, step, ts of each complete step's end (the boundary after it)."""
    s = steps[steps["complete"]]
    return pd.DataFrame({"rank": s["rank"].to_numpy(), "step": s["step"].to_numpy(),
                         "ts": (s["ts"] + s["dur"]).to_numpy(np.int64)})


# ---------------------------------------------------------------- peaks
PEAK_COLUMNS = ["rank", "device", "step", "ts", "bytes", "op", "source", "user_source", "module", "alloc_bytes",
                "category", "source_full"]


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``lo[i]`` to ``hi[i] - 1`` of every range (none empty) laid end to end, and where
    each range starts among them: a pass over each step's rows without a Python loop per step."""
    n = hi - lo
    start = np.cumsum(n) - n
    return np.arange(int(n.sum())) - np.repeat(start - lo, n), start


def _arg_extreme(values: np.ndarray, start: np.ndarray, last: bool) -> np.ndarray:
    """Per range of ``values`` (contiguous, from ``start``), the position of its first (``last``:
    its last) maximum, as ``np.argmax`` per range would find it."""
    if not len(start):
        return np.empty(0, np.int64)
    seg = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(values)]))
    hit = np.flatnonzero(values == np.maximum.reduceat(values, start)[seg])
    change = seg[hit][1:] != seg[hit][:-1]
    return hit[np.r_[change, True] if last else np.r_[True, change]]


def peaks(allocs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and captured step: the highest live bytes within the step, when, and what
    caused it: the largest block made in the step and alive at the peak (its top-level op —
    what the user called, e.g. ``aten::contiguous`` — source line and the user's line that led
    there, module, size, category; ``source_full``: the source line with its full path)."""
    if allocs.empty:
        return pd.DataFrame(columns=PEAK_COLUMNS)
    d = _deltas(allocs)
    active = captured_steps(steps)
    rows = []
    for (rank, device), g in d.groupby(["rank", "device"], observed=True, sort=True):
        live = np.cumsum(g["bytes"].to_numpy())
        ts = g["ts"].to_numpy()
        settled = np.r_[ts[1:] != ts[:-1], True]  # the state after all events of one instant, as timeline()
        live, ts = live[settled], ts[settled]
        mine = allocs[(allocs["rank"] == rank) & _where(allocs["device"], lambda v: v == str(device))]
        # allocations by time made: a step's are one slice of them (no pass over all per step)
        by_made = np.argsort(mine["alloc_ts"].to_numpy(), kind="stable")
        made_ts = mine["alloc_ts"].to_numpy()[by_made]
        freed_ts = mine["free_ts"].to_numpy()[by_made]
        size = mine["bytes"].to_numpy()[by_made]
        step, s_ts, s_dur = (active.loc[active["rank"] == rank, c].to_numpy(np.int64) for c in ("step", "ts", "dur"))
        lo, hi = np.searchsorted(ts, s_ts, "left"), np.searchsorted(ts, s_ts + s_dur, "right")
        k = hi > lo
        step, s_ts = step[k], s_ts[k]
        pos, start = _ranges(lo[k], hi[k])
        j = pos[_arg_extreme(live[pos], start, last=False)]   # the step's peak: its first highest
        t = ts[j]
        a, b = np.searchsorted(made_ts, s_ts, "left"), np.searchsorted(made_ts, t, "right")
        k = b > a
        pos, start = _ranges(a[k], b[k])
        # made in the step, alive at its peak
        alive = np.where(freed_ts[pos] > np.repeat(t[k], (b - a)[k]), size[pos], -1)
        best = _arg_extreme(alive, start, last=True)   # the largest; the latest of equals
        ok = alive[best] >= 0   # else nothing made in the step is alive then (e.g. the frees at exit)
        made = by_made[pos[best][ok]]
        n = len(made)
        rows += zip([rank] * n, [device] * n, step[k][ok].tolist(), t[k][ok].tolist(), live[j][k][ok].tolist(),
                    mine.index[made])
    if not rows:
        return pd.DataFrame(columns=PEAK_COLUMNS)
    rank, device, step, ts, live, made = zip(*rows)
    c = allocs.loc[list(made)]  # the blocks that made the peaks, fetched at once
    return pd.DataFrame({
        "rank": rank, "device": device, "step": step, "ts": ts, "bytes": live,
        **{col: c[src].astype(str).to_numpy() for col, src in (("op", "top_op"), ("source", "source"),
                                                              ("user_source", "user_source"), ("module", "module"),
                                                              ("category", "category"), ("source_full", "source_full"))},
        "alloc_bytes": c["bytes"].to_numpy(np.int64)})[PEAK_COLUMNS]


SITE_KEY = ["source", "user_source", "module", "top_op", "category"]
"""An allocation site: the line that allocates, the user's line that led there, module, top-level
op (what the user called, e.g. ``aten::relu`` rather than the ``aten::empty`` inside it), category."""


def peak_sites(allocs: pd.DataFrame, rank: int, device: str, ts: int) -> pd.DataFrame:
    """The contributors to live memory at ``ts``, by site (:data:`SITE_KEY`), biggest first."""
    sites = snapshot(allocs, ts, SITE_KEY, rank, device)
    return sites.rename(columns={"top_op": "op"})


SITE_DETAIL_COLUMNS = ["source", "user_source", "module", "op", "category", "bytes", "blocks", "shape", "dtype",
                       "shapes", "largest", "stack"]


def peak_site_details(allocs: pd.DataFrame, rank: int, device: str, ts: int, top: int = 10) -> pd.DataFrame:
    """The first ``top`` rows of :func:`peak_sites` (the viewer's page of them) with, per site, its
    largest live block: ``shape``, ``dtype``, size (``largest``) and ``stack`` (the stack id of the
    line that made it: ``Run.stack(rank, stack)`` gives its frames); and ``shapes``, how many
    distinct shapes the site's live blocks have. Equal sizes: the latest-made block."""
    sites = peak_sites(allocs, rank, device, ts).head(top)
    if sites.empty:
        return pd.DataFrame(columns=SITE_DETAIL_COLUMNS)
    key = SITE_KEY
    live = live_at(allocs, ts, rank, device)[key + ["bytes", "alloc_ts", "shape", "dtype", "stack"]]
    live = live.astype({k: str for k in key + ["shape", "dtype"]})
    by_site = live.sort_values(["bytes", "alloc_ts"], kind="stable").groupby(key, sort=False)
    largest = by_site.tail(1).set_index(key).rename(columns={"bytes": "largest"})
    largest["shapes"] = by_site["shape"].nunique()
    extra = largest.reindex(pd.MultiIndex.from_arrays(
        [sites[c].astype(str).to_numpy() for c in ("source", "user_source", "module", "op", "category")], names=key))
    out = sites.copy()
    for c in ("shape", "dtype"):
        out[c] = extra[c].to_numpy()
    for c in ("shapes", "largest", "stack"):
        out[c] = extra[c].to_numpy(np.int64)
    return out[SITE_DETAIL_COLUMNS]


# ---------------------------------------------------------------- leaks
LEAK_COLUMNS = ["rank", "device", "growth_per_step", "steps_growing", "steps_checked", "confidence",
                "source", "user_source", "module", "op", "category", "grad", "bytes_per_step", "blocks_per_step",
                "steps_seen", "process_growth_per_step", "process_outgrows", "kept_graph",
                "allocator_growth_per_step", "confirmed_by", "made_at", "keeper", "keeper_via", "keeper_note"]
LEAK_MIN_STEPS = 3
"""Step-to-step differences a device needs before :func:`leaks` judges it at all."""
PROCESS_FACTOR = 4
"""The process "grows much faster" than a leaking device's tracked bytes at this ratio or more ..."""
PROCESS_MIN_BYTES = 16 * 2**10
"""... and by at least this much per step: less can be the C allocator taking memory in chunks."""
PROCESS_SETTLE_NS = 4 * 10**9
"""A captured step grows the process by what the capture holds: each captured step's rows are
built, drained and written, and the memory that frees is reused and trimmed in jumps of megabytes.
So resident memory is judged only at the boundaries of steps not captured that end this long after
the last captured one, after the first half of the run (start-up, optimizer state, allocator
caches)."""
PROCESS_MIN_BOUNDARIES = 8
"""Such boundaries needed to judge the process's growth at all."""
_MAX_SLOPE_POINTS = 256  # boundaries the pairwise slopes are taken over (evenly spaced)


FIGURES_COLUMNS = ["rank", "device", "figures_from", "api"]


def figures_from(memory_steps: pd.DataFrame, memory_sources: pd.DataFrame) -> pd.DataFrame:
    """Where each rank's device's ``memory_steps`` rows come from: ``figures_from`` is ``allocator
    events`` or ``backend counters`` (``schema.MEMORY_FIGURES``), ``api`` the function its counters
    were read with. A device without a ``memory_sources`` row (the CPU; every device of a run
    older than that table) is followed by allocator events."""
    pairs = memory_steps[["rank", "device"]].astype({"device": str}).drop_duplicates()
    said = memory_sources[FIGURES_COLUMNS].astype({c: str for c in FIGURES_COLUMNS[1:]})
    out = pairs.merge(said.drop_duplicates(["rank", "device"]), on=["rank", "device"], how="left")
    out = out.fillna({"figures_from": MEMORY_FIGURES[0], "api": ""})
    return out.sort_values(["rank", "device"], ignore_index=True)[FIGURES_COLUMNS]


def growth(memory_steps: pd.DataFrame) -> pd.DataFrame:
    """Step-over-step growth of live bytes at step boundaries, per rank and device.

    ``growth_per_step`` is the median difference between the boundaries of consecutive steps
    after the first such difference (the first steps allocate optimizer state and caches);
    ``growing`` = how many of those differences are positive, ``checked`` how many there are. Two
    boundaries with a step between them that has no row (:func:`unseen_steps`) give no difference:
    what changed in the unseen step is not known."""
    rows = []
    for (rank, device), g in memory_steps.groupby(["rank", "device"], observed=True, sort=True):
        g = g.sort_values("step")
        live = g["live"].to_numpy(np.int64)
        diffs = np.diff(live)[1:][np.diff(g["step"].to_numpy(np.int64))[1:] == 1]
        rows.append({"rank": rank, "device": str(device), "boundaries": len(live),
                     "growth_per_step": float(np.median(diffs)) if len(diffs) else 0.0,
                     "growing": int((diffs > 0).sum()), "checked": len(diffs),
                     "first": int(live[0]) if len(live) else 0, "last": int(live[-1]) if len(live) else 0})
    return pd.DataFrame(rows, columns=["rank", "device", "boundaries", "growth_per_step", "growing", "checked",
                                       "first", "last"])


def unseen_steps(memory_steps: pd.DataFrame, process_memory: pd.DataFrame) -> dict[tuple[int, str], list[int]]:
    """Per rank and device, the steps from its first row on whose boundary the collector handled
    (a ``memory_steps`` row of another device or a ``process_memory`` row of the rank) but that
    have no row of the device: the job's own torch.profiler held the allocator reports in them
    (``collectors.memory``; a ``failures`` row says so), so their live bytes are not known."""
    handled = {r: set(g["step"].tolist()) for r, g in pd.concat(
        [memory_steps[["rank", "step"]], process_memory[["rank", "step"]]]).groupby("rank")}
    out = {}
    for (rank, device), g in memory_steps.groupby(["rank", "device"], observed=True, sort=True):
        mine = set(g["step"].tolist())
        missing = sorted(s for s in handled.get(rank, ()) if s > min(mine) and s not in mine)
        if missing:
            out[(int(rank), str(device))] = [int(s) for s in missing]
    return out


def allocator_growth(memory_steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`growth` of the allocator's own count of allocated bytes (``memory_steps.allocated``:
    what ``torch.cuda.memory_allocated()`` says, as the allocator reported it at its last event
    before each boundary), per rank and device where it keeps one (every row above 0). Live bytes
    are what the capture saw allocated and freed; this is the allocator's word on the same steps."""
    if memory_steps.empty:
        return growth(memory_steps)
    keeps = memory_steps.groupby(["rank", "device"], observed=True)["allocated"].transform("min") > 0
    own = memory_steps[keeps]
    return growth(own.assign(live=own["allocated"]))


def _median_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every two points (Theil-Sen): the trend of a curve that
    moves in jumps and saw-teeth, which an average or the two ends would follow."""
    if len(x) > _MAX_SLOPE_POINTS:
        keep = np.linspace(0, len(x) - 1, _MAX_SLOPE_POINTS).round().astype(int)
        x, y = x[keep], y[keep]
    i, j = np.triu_indices(len(x), 1)
    dx = (x[j] - x[i]).astype(float)
    ok = dx > 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok])) if ok.any() else float("nan")


PROCESS_COLUMNS = ["rank", "boundaries", "first", "last", "judged", "growth_per_step"]


def process_growth(process_memory: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The process's resident memory (RSS) per rank: at the first and last boundary, and its
    growth per step over the ``judged`` boundaries (:data:`PROCESS_SETTLE_NS` says which), NaN
    with fewer than :data:`PROCESS_MIN_BOUNDARIES` of them (e.g. every step captured). The growth
    is a median of pairwise slopes: the C allocator reuses freed memory first and then takes more
    in chunks, so the curve moves in steps."""
    rows = []
    for rank, g in process_memory.groupby("rank", sort=True):
        g = g.sort_values("step")
        rss, ts, step = (g[c].to_numpy(np.int64) for c in ("rss", "ts", "step"))
        captured = captured_steps(steps[steps["rank"] == rank])
        ends = np.sort((captured["ts"] + captured["dur"]).to_numpy(np.int64))  # = their boundaries' ts
        # time since the end of the latest captured step at or before each boundary
        since = np.full(len(ts), np.iinfo(np.int64).max)
        if len(ends):  # none: killed before its first captured step ended
            latest = np.searchsorted(ends, ts, side="right") - 1
            since = np.where(latest >= 0, ts - ends[np.maximum(latest, 0)], since)
        judged = (np.arange(len(rss)) >= len(rss) // 2) & (since >= PROCESS_SETTLE_NS)
        per_step = (_median_slope(step[judged], rss[judged]) if judged.sum() >= PROCESS_MIN_BOUNDARIES
                    else float("nan"))
        rows.append({"rank": rank, "boundaries": len(rss), "first": int(rss[0]), "last": int(rss[-1]),
                     "judged": int(judged.sum()), "growth_per_step": per_step})
    return pd.DataFrame(rows, columns=PROCESS_COLUMNS)


KEEPER_NOT_RECORDED = "not recorded"
"""``keeper_note`` of a leak on a rank with no keeper walk (a run captured before walks, or whose
capture never ended)."""
KEEPER_NOT_FOUND = "not found: nothing the walk reached holds these blocks"


@dataclass
class Keepers:
    """What :func:`leaks` needs to say where a leak's blocks were made in the step loop and what
    keeps them: ``Run.memory_keepers`` and ``Run.keeper_walks``, ``stack_of(rank, stack id)`` (the
    frames, innermost first: ``Run.stack``) and ``display`` (a path as the run shows it)."""
    keepers: pd.DataFrame = field(default_factory=pd.DataFrame)
    walks: pd.DataFrame = field(default_factory=pd.DataFrame)
    stack_of: Callable[[int, int], list[tuple[str, str, int]]] | None = None
    display: Callable[[str], str] = str

    def sites(self, survivors: pd.DataFrame, sites: pd.DataFrame, rank: int) -> list[dict[str, str]]:
        """Per row of ``sites`` (:data:`SITE_KEY` columns), from its ``survivors`` (allocations):
        ``made_at``, ``keeper``, ``keeper_via``, ``keeper_note``."""
        walks = self.walks[self.walks["rank"] == rank] if len(self.walks) else self.walks
        if walks.empty or self.stack_of is None:
            return [{"made_at": "", "keeper": "", "keeper_via": "", "keeper_note": KEEPER_NOT_RECORDED}] * len(sites)
        loop_file = next((frames[0][0] for frames in map(lambda s: self.stack_of(rank, int(s)), walks["stack"])
                          if frames), "")
        a = survivors.reset_index(drop=True)
        made = {sid: loop_line(self.stack_of(rank, int(sid)), loop_file) for sid in a["stack"].unique()}
        a = a.assign(made_at=a["stack"].map(lambda sid: self._line(made[sid])), keeper="", keeper_via="")
        k = self.keepers[self.keepers["rank"] == rank] if len(self.keepers) else self.keepers
        if len(k):
            left = a[["device", "addr", "alloc_ts", "free_ts"]].astype({"device": str}).reset_index(names="i")
            right = k.assign(text=[self._keeper_text(*r) for r in zip(k["keeper"].astype(str), k["scope"].astype(str),
                                                                      k["file"].astype(str))])
            m = left.merge(right[["device", "addr", "ts", "text", "via"]].astype({"device": str}),
                           on=["device", "addr"])
            m = m[(m["alloc_ts"] <= m["ts"]) & (m["ts"] < m["free_ts"])].drop_duplicates("i", keep="last")
            a.loc[m["i"].to_numpy(), "keeper"] = m["text"].to_numpy()
            a.loc[m["i"].to_numpy(), "keeper_via"] = m["via"].astype(str).to_numpy()
        stopped = "; ".join(x for x in walks["stopped"].astype(str).unique() if x)
        out = []
        for _, s in sites.iterrows():
            mine = a[np.logical_and.reduce([a[c].astype(str).to_numpy() == str(s[c]) for c in SITE_KEY])]
            line = _most_bytes(mine, "made_at")
            keeper = _most_bytes(mine[mine["keeper"] != ""], "keeper")
            via = mine.loc[mine["keeper"] == keeper, "keeper_via"].iloc[0] if keeper else ""
            note = "" if keeper else KEEPER_NOT_FOUND + (f" ({stopped})" if stopped else "")
            out.append({"made_at": line, "keeper": keeper, "keeper_via": via, "keeper_note": note})
        return out

    def _line(self, frame: tuple[str, str, int] | None) -> str:
        return f"{self.display(frame[0])}:{frame[2]}" if frame else ""

    def _keeper_text(self, keeper: str, scope: str, file: str) -> str:
        return f"{keeper} ({scope}" + (f" in {self.display(file)}" if file else "") + ")"


def _most_bytes(a: pd.DataFrame, col: str) -> str:
    """The value of ``col`` that the most bytes of ``a`` have ("" if none)."""
    if a.empty:
        return ""
    by = a.groupby(col, observed=True)["bytes"].sum()
    return str(by.idxmax()) if len(by) else ""


def loop_line(frames: list[tuple[str, str, int]], loop_file: str) -> tuple[str, str, int] | None:
    """The frame of an allocation's stack (innermost first) that a person acts on: the outermost in
    ``loop_file``, the file that runs the step loop (the validation call, not the model line inside
    it); failing that, the first of the user's frames outside the model (past its outermost
    ``forward``); None if neither."""
    mine = [f for f in frames if f[0] == loop_file]
    if loop_file and mine:
        return mine[-1]
    user = [i for i, f in enumerate(frames) if is_user_file(f[0])]
    inside = [i for i in user if frames[i][1] == "forward"]
    outside = [i for i in user if not inside or i > inside[-1]]
    return frames[outside[0]] if outside and inside else None


def leaks(allocs: pd.DataFrame, memory_steps: pd.DataFrame, steps: pd.DataFrame,
          process_memory: pd.DataFrame | None = None, min_steps: int = LEAK_MIN_STEPS,
          figures: pd.DataFrame | None = None, keepers: Keepers | None = None) -> pd.DataFrame:
    """Live memory that grows step over step, and the allocation sites that account for it.

    A device leaks when, over at least ``min_steps`` step-to-step differences (after the first),
    live bytes at the boundaries grow in at least 3/4 of them. Its sites (:data:`SITE_KEY`) are
    the groups whose allocations, made in a captured step before the last, are still alive at the
    last boundary (``survivors``), in at least half of those steps. One row per site:
    ``bytes_per_step`` (median over the steps it survived from), ``blocks_per_step``,
    ``steps_seen`` of ``steps_checked``; ``confidence`` (0..1) = how much of the measured growth
    the device's sites account for (capped at 1) x the share of growing differences; ``grad``:
    most of the site's surviving blocks belong to an autograd graph.

    With ``figures`` (:func:`figures_from`): a device read from its backend's counters has no
    allocation to name, so no site; its one row's ``confidence`` is the share of growing differences
    alone (where allocator events name no site, it is 0).

    Steps without a live figure (:func:`unseen_steps`, of ``memory_steps`` and ``process_memory``)
    give no difference and are not candidates: their allocations were not all seen.

    A device whose allocator keeps its own count (:func:`allocator_growth`) leaks only where that
    count grows too (by the same rule): ``allocator_growth_per_step``, and ``confirmed_by`` says
    which count agreed (``schema.LEAK_CONFIRMED_BY``; a device on its backend's counters is its own
    confirmation); "" and NaN where the allocator keeps none, so the growth is not confirmed.

    With ``process_memory``: ``process_growth_per_step`` (:func:`process_growth`, NaN where not
    known), ``process_outgrows`` = the process grows at least :data:`PROCESS_FACTOR` times as fast
    as the device's live bytes and by :data:`PROCESS_MIN_BYTES` a step or more (what is kept is
    mostly not tensor storage), ``kept_graph`` = that, and one of the device's sites is in an
    autograd graph: the graph's nodes are what grows (the classic ``history.append(loss)``).

    With ``keepers`` (:class:`Keepers`), per site, of its surviving allocations (most bytes wins):
    ``made_at``, the user's line in the step loop they were made from (:func:`loop_line`; "" where
    not known), and ``keeper``, what keeps them alive (``list history (global in train.py)``) and
    ``keeper_via`` (``tensor``, ``autograd graph``), or ``keeper_note``: why there is none (not
    recorded: no walk on the rank; not found).
    """
    out = []
    g_all = growth(memory_steps)
    own = allocator_growth(memory_steps).set_index(["rank", "device"])
    horizon = memory_steps.groupby("rank")["ts"].max()
    proc = (process_growth(process_memory, steps).set_index("rank")["growth_per_step"]
            if process_memory is not None and len(process_memory) else pd.Series(dtype=float))
    unseen = unseen_steps(memory_steps, process_memory if process_memory is not None else memory_steps[["rank", "step"]])
    counted = (set() if figures is None else
               set(figures.loc[figures["figures_from"] == MEMORY_FIGURES[1], ["rank", "device"]].itertuples(
                   index=False, name=None)))
    for _, g in g_all.iterrows():
        if g["checked"] < min_steps or g["growth_per_step"] <= 0 or g["growing"] < 0.75 * g["checked"]:
            continue
        rank, device = g["rank"], g["device"]
        lines = (rank, device) not in counted
        said = own.loc[(rank, device)] if (rank, device) in own.index else None
        if said is not None and (said["growth_per_step"] <= 0 or said["growing"] < 0.75 * said["checked"]):
            continue  # the allocator's own count does not grow: what the capture saw is not a leak
        done = captured_steps(steps[steps["rank"] == rank], complete_only=True)["step"]
        last = memory_steps[memory_steps["rank"] == rank]["step"].max()
        not_seen = set(unseen.get((int(rank), str(device)), ()))
        candidates = sorted(s for s in done if s < last and s not in not_seen)
        a = allocs[(allocs["rank"] == rank) & (allocs["device"].astype(str) == device)
                   & allocs["step"].isin(candidates) & (allocs["free_ts"] > horizon.get(rank, NEVER))]
        per_step = a.groupby(SITE_KEY + ["step"], observed=True).agg(
            sum=("bytes", "sum"), size=("bytes", "size"), grad=("grad", "mean")).reset_index()
        sites = per_step.groupby(SITE_KEY, observed=True).agg(
            bytes_per_step=("sum", "median"), blocks_per_step=("size", "median"), steps_seen=("step", "nunique"),
            grad=("grad", "mean"))
        sites = sites[sites["steps_seen"] >= max(1, len(candidates) / 2)].reset_index()
        sites = sites.sort_values("bytes_per_step", ascending=False, ignore_index=True)
        explained = float(sites["bytes_per_step"].sum())
        share = (min(explained, g["growth_per_step"]) / max(explained, g["growth_per_step"]) if explained
                 else 0.0 if lines else 1.0)
        p = float(proc.get(rank, np.nan))
        outgrows = bool(p >= max(PROCESS_FACTOR * g["growth_per_step"], PROCESS_MIN_BYTES))  # False when NaN
        device_row = {"rank": rank, "device": device, "growth_per_step": g["growth_per_step"],
                      "steps_growing": int(g["growing"]), "steps_checked": len(candidates),
                      "confidence": round(share * g["growing"] / g["checked"], 3), "process_growth_per_step": p,
                      "process_outgrows": outgrows, "kept_graph": outgrows and bool((sites["grad"] >= 0.5).any()),
                      "allocator_growth_per_step": np.nan if said is None else float(said["growth_per_step"]),
                      "confirmed_by": "" if said is None else LEAK_CONFIRMED_BY[0] if lines else LEAK_CONFIRMED_BY[1]}
        told = (keepers or Keepers()).sites(a, sites, int(rank))
        for (_, s), tell in zip(sites.iterrows(), told):
            out.append({**device_row, **tell, "source": str(s["source"]), "user_source": str(s["user_source"]),
                        "module": str(s["module"]), "op": str(s["top_op"]), "category": str(s["category"]),
                        "grad": bool(s["grad"] >= 0.5), "bytes_per_step": int(s["bytes_per_step"]),
                        "blocks_per_step": int(s["blocks_per_step"]), "steps_seen": int(s["steps_seen"])})
        if sites.empty:
            out.append({**device_row, "made_at": "", "keeper": "", "keeper_via": "", "keeper_note": "",
                        "source": "", "user_source": "", "module": "", "op": "",
                        "category": "", "grad": False, "bytes_per_step": 0, "blocks_per_step": 0, "steps_seen": 0})
    return pd.DataFrame(out, columns=LEAK_COLUMNS)
