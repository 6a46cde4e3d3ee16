"""The device side of a run: what the eager queue, its kernels and its CPU fallbacks did, and
what that cost the step.

On an asynchronous device the host's op times say little: an op returns once it is queued, and
the time shows up later, as a wait, on whatever line needs a value. So these analyses work from
what the device backend reported to PyTorch's profiler (Kineto: ``Run.device_kernels``,
``Run.device_enqueues``, ``Run.queue_flushes``, ``Run.fallbacks``, ``Run.device_copies``) and
answer:

- **correlation**: which host op (``Run.ops`` row, so module path and source line) queued each
  op a kernel ran, and how long it waited in the queue;
- **device time per step**: per device, busy (the union of its kernels' spans) and idle within
  each step's wall time, the host's waits for it, and the step's verdict (``VERDICTS``);
- **stalls**: the host's waits by the user's line that made it wait, and why;
- **fusion**: ops per kernel, the share of device time that is at most launch cost, and runs of
  one-op kernels the queue did not fuse, with their lines;
- **fallbacks**: ops the device left to the CPU, by op and line, with the bytes copied each way,
  and the share of device ops that ran natively (coverage);
- **custom kernels**: kernels a backend reports under a custom op's name (NKI kernels, a
  ``torch.library`` op of the user's), forward and backward apart, with the lines that called
  them and their share of the device's busy time (custom-kernel coverage).

Pandas in, pandas out; no function reads a file. Times are the run's monotonic ns.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from neuron_prof.analysis.device_collectives import is_collective_kernel
from neuron_prof.analysis.intervals import covered
from neuron_prof.analysis.ops import in_steps, name_mask, parent_index
from neuron_prof.analysis.steps import captured_steps, steps_per_rank
from neuron_prof.store.keys import backend_key, thread_key
from neuron_prof.backends.op_devices import input_devices
from neuron_prof.store.open_ops import innermost_ops, last_at_or_before

DEVICE_BOUND_BUSY = 0.70
"""A step is device-bound when its busiest device ran kernels for at least this share of it:
the host could not have made the step much shorter."""
HOST_BOUND_BUSY = 0.40
HOST_BOUND_WAIT = 0.15
"""A step is host-bound when its busiest device was busy less than ``HOST_BOUND_BUSY`` of it while
the host waited for the device less than ``HOST_BOUND_WAIT`` of it: the device sat idle,
waiting for work the host had not queued yet."""
VERDICTS = ("host-bound", "device-bound", "balanced")
UNFUSED_MIN_RUN = 3
"""Consecutive one-op kernels on a device, at least this many, form an unfused sequence."""
SIGNATURE_OPS = 6
"""Kernel names shown (and grouped on) per unfused sequence; longer runs end in ``...``."""


def _str_codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``col.astype(str)`` as codes into its distinct values, sorted: (codes, values). A
    categorical column is converted once per category: pandas' ``astype(str)`` builds a string
    array of every row, which at a million rows costs more than the analysis."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy()
        if not len(codes) or codes.min() >= 0:
            cats = np.asarray(col.cat.categories.astype(str), dtype=object)
            remap, values = pd.factorize(cats, sort=True)
            return remap[codes].astype(np.int64), np.asarray(values, dtype=object)
    codes, values = pd.factorize(col.astype(str).to_numpy(dtype=object), sort=True, use_na_sentinel=False)
    return codes.astype(np.int64), np.asarray(values, dtype=object)


def _str_values(col: pd.Series) -> np.ndarray:
    """``col.astype(str).to_numpy(dtype=object)``, a categorical column converted per category."""
    codes, values = _str_codes(col)
    return values[codes] if len(values) else np.empty(len(col), dtype=object)


# --------------------------------------------------------------------------- correlation


def enqueuing_ops(enqueues: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per enqueue, the position in ``ops`` of the innermost op open on its rank and thread at its
    time (the op that queued it: its host op), -1 where none was captured."""
    return innermost_ops(enqueues["rank"].to_numpy(), enqueues["tid"].to_numpy(), enqueues["ts"].to_numpy(), ops)


def kernel_of(enqueues: pd.DataFrame, links: pd.DataFrame) -> np.ndarray:
    """Per enqueue, the id of the kernel that ran it (``Run.kernel_enqueues``), -1 if none did
    (still queued when capture ended, or run by a kernel reported after it)."""
    out = np.full(len(enqueues), -1, dtype=np.int64)
    if enqueues.empty or links.empty:
        return out
    e = backend_key(enqueues["rank"], enqueues["id"])
    lk = backend_key(links["rank"], links["enqueue"])
    order = np.argsort(lk, kind="stable")
    pos = np.clip(np.searchsorted(lk[order], e), 0, len(lk) - 1)
    hit = lk[order][pos] == e
    out[hit] = links["kernel"].to_numpy(np.int64)[order][pos][hit]
    return out


CORRELATION_COLUMNS = ["rank", "id", "ts", "tid", "device", "op", "host_op", "module", "source", "user_source",
                       "source_full", "bwd", "step", "op_index", "kernel", "kernel_name", "kernel_ts",
                       "kernel_dur", "queued_ns"]


def correlation(enqueues: pd.DataFrame, kernels: pd.DataFrame, links: pd.DataFrame,
                ops: pd.DataFrame, parent: np.ndarray | None = None) -> pd.DataFrame:
    """One row per enqueued op: its enqueue (``Run.device_enqueues`` columns), ``op_index`` (its
    host op's position in ``ops``, -1: not captured), ``kernel`` (the id of the kernel that ran
    it, -1: none), that kernel's name, start and duration, and ``queued_ns`` (from enqueue to the
    kernel's start: how long the op waited in the queue). Both directions read off it: a kernel's
    host ops are the rows with its id, a host op's kernels the rows with its ``op_index``. Kernels
    no launch names (a backend that reports kernels only) are joined by thread and time
    (:func:`kernels_by_time`; ``parent``: ``parent_index(ops)``, if the caller has it)."""
    # a rank whose backend reports no launches at all: its kernels joined by thread and time
    unlinked = kernels[~kernels["rank"].isin(links["rank"].unique())] if len(kernels) else kernels
    by_time = kernels_by_time(unlinked, ops, parent) if len(unlinked) else pd.DataFrame(columns=CORRELATION_COLUMNS)
    if enqueues.empty:
        return by_time
    out = enqueues[[c for c in CORRELATION_COLUMNS[:13]]].copy()
    out["op_index"] = enqueuing_ops(enqueues, ops)
    out["kernel"] = kernel_of(enqueues, links)
    kindex = pd.Index(backend_key(kernels["rank"], kernels["id"]))
    key = backend_key(out["rank"], out["kernel"])
    found = out["kernel"].to_numpy() >= 0
    kts = np.full(len(out), -1, np.int64)
    kdur = np.full(len(out), -1, np.int64)
    kname = np.full(len(out), "", dtype=object)
    if found.any() and len(kernels):
        idx = kindex.get_indexer(key[found])
        ok = idx >= 0
        sel = np.flatnonzero(found)[ok]
        kts[sel] = kernels["ts"].to_numpy(np.int64)[idx[ok]]
        kdur[sel] = kernels["dur"].to_numpy(np.int64)[idx[ok]]
        kname[sel] = _str_values(kernels["name"])[idx[ok]]
    out["kernel_name"] = pd.Categorical(kname)
    out["kernel_ts"], out["kernel_dur"] = kts, kdur
    out["queued_ns"] = np.where(kts >= 0, kts - out["ts"].to_numpy(np.int64), -1)
    out = out.reset_index(drop=True)[CORRELATION_COLUMNS]
    return out if by_time.empty else pd.concat([out, by_time], ignore_index=True)


def kernels_by_time(kernels: pd.DataFrame, ops: pd.DataFrame, parent: np.ndarray | None = None) -> pd.DataFrame:
    """Correlation rows (``CORRELATION_COLUMNS``; ``id`` -1, ``queued_ns`` -1: no launch was
    reported) for kernels no launch names, as backends that report kernels only give them: each
    joined to its host op by thread and time. The op is the innermost op with the kernel's device
    among its inputs open at the kernel's start on any of the rank's threads (a synchronous
    backend runs the kernel inside the op that launched it); where none is open (a queue ran it
    later), the outermost device op around the last device op to start before it (what the host
    was queueing then; the line is right, the op within it a guess)."""
    if kernels.empty or ops.empty:
        return pd.DataFrame(columns=CORRELATION_COLUMNS)
    k = kernels.reset_index(drop=True)
    kts = k["ts"].to_numpy(np.int64)
    krank = k["rank"].to_numpy()
    kdev = k["device"].astype(str).to_numpy()
    pos = np.full(len(k), -1, np.int64)
    on_device = {dev: name_mask(ops, lambda d, dev=dev: dev in input_devices(d), column="devices") for dev in set(kdev)}
    parent = parent_index(ops) if parent is None else parent
    depth = int(ops["depth"].max())
    for dev, mask in on_device.items():
        mine = np.flatnonzero(kdev == dev)
        dev_ops = ops[mask]
        if not len(dev_ops):
            continue
        # (1) open at the kernel's start, on whichever thread: the deepest such op
        best, best_depth = np.full(len(mine), -1, np.int64), np.full(len(mine), -1, np.int64)
        for tid in dev_ops["tid"].unique():
            at = innermost_ops(krank[mine], np.full(len(mine), tid), kts[mine], ops)
            ok = (at >= 0) & mask[np.maximum(at, 0)]
            d = np.where(ok, ops["depth"].to_numpy()[np.maximum(at, 0)], -1)
            better = d > best_depth
            best[better], best_depth[better] = at[better], d[better]
        # (2) none open: the last device op to start before it, up to its outermost device op
        rows = np.flatnonzero(mask)
        order = rows[np.lexsort((ops["ts"].to_numpy(np.int64)[rows], ops["rank"].to_numpy()[rows]))]
        last = last_at_or_before(ops["rank"].to_numpy()[order].astype(np.int64), ops["ts"].to_numpy(np.int64)[order],
                                 krank[mine].astype(np.int64), kts[mine])
        before = np.where(last >= 0, order[np.maximum(last, 0)], -1)
        for _ in range(depth):
            up = np.where(before >= 0, parent[np.maximum(before, 0)], -1)
            climb = (up >= 0) & mask[np.maximum(up, 0)]
            before = np.where(climb, up, before)
        pos[mine] = np.where(best >= 0, best, before)
    found = pos >= 0
    o = ops.iloc[np.maximum(pos, 0)].reset_index(drop=True)

    def take(col: str, empty):
        return np.where(found, o[col].to_numpy(), empty)
    return pd.DataFrame({
        "rank": krank, "id": np.full(len(k), -1, np.int64), "ts": kts, "tid": take("tid", 0).astype(np.int64),
        "device": k["device"].astype(str).to_numpy(), "op": take("name", "").astype(str),
        "host_op": take("name", "").astype(str), "module": take("module", "").astype(str),
        **{c: take(c, "").astype(str) for c in ("source", "user_source", "source_full")},
        "bwd": take("bwd", False).astype(bool), "step": k["step"].to_numpy() if "step" in k else -1,
        "op_index": pos, "kernel": k["id"].to_numpy(np.int64), "kernel_name": pd.Categorical(k["name"].astype(str)),
        "kernel_ts": kts, "kernel_dur": k["dur"].to_numpy(np.int64), "queued_ns": np.full(len(k), -1, np.int64)},
        columns=CORRELATION_COLUMNS)


# --------------------------------------------------------------------------- device time per step


DEVICE_STEP_COLUMNS = ["rank", "device", "step", "ts", "dur", "kernels", "busy_ns", "idle_ns", "busy_pct",
                       "wait_ns", "wait_pct"]


def device_steps(kernels: pd.DataFrame, flushes: pd.DataFrame, steps: pd.DataFrame,
                 gaps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank, device and step (``steps``: ``RunAnalysis.step_kinds`` or plain steps; complete steps
    captured in detail only: the backend reports nothing outside them): ``busy_ns`` (the time
    within the step's wall time that some kernel of the device ran, whichever step queued it),
    ``idle_ns``, ``kernels`` (started in the step), ``wait_ns`` (time within the step that a host
    thread of the rank waited for the device's queue: flushes), and both as a percentage of the
    step. Steps a device gap overlaps (``gaps``: ``Run.device_gaps``, no device trace for a
    while) are left out: their kernels are unknown, not absent, and an idle device there would be
    a false "host-bound"."""
    done = captured_steps(steps, complete_only=True)
    if gaps is not None:
        done = traced_steps(done, gaps)
    if kernels.empty or done.empty:
        return pd.DataFrame(columns=DEVICE_STEP_COLUMNS)
    rows = []
    for (rank, device), k in kernels.groupby(["rank", "device"], observed=True):
        s = done[done["rank"] == rank]
        if s.empty:
            continue
        w0 = s["ts"].to_numpy(np.int64)
        w1 = w0 + s["dur"].to_numpy(np.int64)
        kts = k["ts"].to_numpy(np.int64)
        busy = covered(kts, kts + k["dur"].to_numpy(np.int64), w0, w1)
        f = flushes[(flushes["rank"] == rank) & (flushes["device"].astype(str) == str(device))]
        fts = f["ts"].to_numpy(np.int64)
        wait = covered(fts, fts + f["dur"].to_numpy(np.int64), w0, w1)
        started = np.searchsorted(np.sort(kts), w1, side="left") - np.searchsorted(np.sort(kts), w0, side="left")
        dur = (w1 - w0).astype(np.float64)
        rows.append(pd.DataFrame({
            "rank": rank, "device": str(device), "step": s["step"].to_numpy(), "ts": w0, "dur": w1 - w0,
            "kernels": started, "busy_ns": busy, "idle_ns": (w1 - w0) - busy,
            "busy_pct": np.divide(100 * busy, dur, out=np.zeros(len(s)), where=dur > 0),
            "wait_ns": wait, "wait_pct": np.divide(100 * wait, dur, out=np.zeros(len(s)), where=dur > 0)}))
    if not rows:
        return pd.DataFrame(columns=DEVICE_STEP_COLUMNS)
    return pd.concat(rows, ignore_index=True)[DEVICE_STEP_COLUMNS].sort_values(["rank", "step", "device"],
                                                                             ignore_index=True)


def verdict(busy_pct: float, wait_pct: float) -> str:
    """What bounds a step, from its busiest device's busy share and the host's wait share (%)."""
    if busy_pct >= 100 * DEVICE_BOUND_BUSY:
        return "device-bound"
    if busy_pct < 100 * HOST_BOUND_BUSY and wait_pct < 100 * HOST_BOUND_WAIT:
        return "host-bound"
    return "balanced"


def step_verdicts(per_device: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: the busiest device (``device_steps`` rows), its busy and idle time, the
    host's wait for it, and the step's ``verdict`` (``verdict``)."""
    cols = ["rank", "step", "device", "dur", "busy_ns", "idle_ns", "busy_pct", "wait_ns", "wait_pct", "verdict"]
    if per_device.empty:
        return pd.DataFrame(columns=cols)
    top = per_device.sort_values(["rank", "step", "busy_ns"], ascending=[True, True, False], kind="stable")
    top = top.drop_duplicates(["rank", "step"], keep="first")
    out = top.assign(verdict=[verdict(b, w) for b, w in zip(top["busy_pct"], top["wait_pct"])])
    return out[cols].reset_index(drop=True)


def verdict_summary(verdicts: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank and verdict, over the ``basis`` steps (the steady steps): how many steps had it,
    their share of the rank's basis steps, their busiest device, and their mean step, busy, idle
    and wait ms and busy and wait shares. Most steps first."""
    cols = ["rank", "verdict", "device", "steps", "share", "step_ms", "busy_ms", "idle_ms", "wait_ms", "busy_pct",
            "wait_pct"]
    v = verdicts[in_steps(verdicts, basis)] if len(verdicts) and len(basis) else verdicts.iloc[0:0]
    if v.empty:
        return pd.DataFrame(columns=cols)
    total = v.groupby("rank").size()
    g = v.groupby(["rank", "verdict"])
    out = pd.DataFrame({"device": g["device"].agg(lambda x: x.mode().iloc[0]), "steps": g.size(),
                        "step_ms": g["dur"].mean() / 1e6, "busy_ms": g["busy_ns"].mean() / 1e6,
                        "idle_ms": g["idle_ns"].mean() / 1e6, "wait_ms": g["wait_ns"].mean() / 1e6,
                        "busy_pct": g["busy_pct"].mean(), "wait_pct": g["wait_pct"].mean()}).reset_index()
    out["share"] = out["steps"] / out["rank"].map(total)
    return out.sort_values(["rank", "steps"], ascending=[True, False], ignore_index=True)[cols]


# --------------------------------------------------------------------------- stalls


STALL_COLUMNS = ["rank", "source", "user_source", "host_op", "reason", "device", "count", "total_ms", "in_steps",
                 "per_step_ms", "mean_ms", "max_ms", "ops"]


def stalls(flushes: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """The host's waits for a device queue, grouped by rank, the line that made it wait (the host
    op's source and the user's line that led there), the host op, the reason and the device:
    ``count``, ``total_ms`` over the run, ``in_steps`` (waits in the ``basis`` steps),
    ``per_step_ms`` (their wait per basis step; None when there are none), ``mean_ms``, ``max_ms``
    and ``ops`` (queued ops waited for, in all). Most waited first."""
    if flushes.empty:
        return pd.DataFrame(columns=STALL_COLUMNS)
    n = steps_per_rank(basis)
    hit = in_steps(flushes, basis) if n else np.zeros(len(flushes), dtype=bool)
    f = flushes.assign(hit=hit, hit_dur=np.where(hit, flushes["dur"], 0))
    g = f.groupby(["rank", "source", "user_source", "host_op", "reason", "device"], observed=True)
    out = pd.DataFrame({"count": g.size(), "total_ms": g["dur"].sum() / 1e6, "in_steps": g["hit"].sum(),
                        "per_step_ms": g["hit_dur"].sum() / 1e6 / n if n else np.nan,
                        "mean_ms": g["dur"].mean() / 1e6, "max_ms": g["dur"].max() / 1e6,
                        "ops": g["ops"].sum()}).reset_index()
    out = out[out["count"] > 0]
    for c in ("source", "user_source", "host_op", "reason", "device"):
        out[c] = out[c].astype(str)
    out["per_step_ms"] = out["per_step_ms"].astype(object).where(out["in_steps"] > 0, None) if n else None
    return out.sort_values(["total_ms"], ascending=False, ignore_index=True)[STALL_COLUMNS]


def sync_waits(sync: pd.DataFrame, flushes: pd.DataFrame) -> np.ndarray:
    """Per sync point (``analysis.sync.sync_points`` rows), the time its thread waited for a
    device queue inside it (ns; 0 where it did not wait, e.g. the queue was already empty)."""
    if sync.empty or flushes.empty:
        return np.zeros(len(sync), dtype=np.int64)
    fk, fts = thread_key(flushes["rank"], flushes["tid"]), flushes["ts"].to_numpy(np.int64)
    order = np.lexsort((fts, fk))
    fk, fts = fk[order], fts[order]
    cum = np.concatenate([[0], np.cumsum(flushes["dur"].to_numpy(np.int64)[order])])
    sk, s0 = thread_key(sync["rank"], sync["tid"]), sync["ts"].to_numpy(np.int64)
    s1 = s0 + sync["dur"].to_numpy(np.int64)
    # the thread's flushes that start within the op: after the last one before it, up to the last by its end
    before = last_at_or_before(fk, fts, sk, s0 - 1)
    last = last_at_or_before(fk, fts, sk, s1)
    lo = np.where(before >= 0, before + 1, np.searchsorted(fk, sk, side="left"))
    return np.where(last >= lo, cum[last + 1] - cum[lo], 0).astype(np.int64)


# --------------------------------------------------------------------------- fusion


TOP_KERNEL_COLUMNS = ["rank", "device", "name", "kernels", "ops", "total_ms", "per_step_ms", "mean_us", "pct",
                      "source", "user_source"]


def top_kernels(kernels: pd.DataFrame, corr: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Where device time goes: kernels by name per rank and device, with their count, ops, device
    time over the run and per ``basis`` step (None when none ran in one), mean duration, share of
    the device's busy time, and the line that queued the most of that device time (the first op of
    that line's longest kernel): a sum, so one kernel held up by the host's scheduler cannot name
    the line. Most device time first (every name: the report cuts the list): on an asynchronous
    device this, not the host ops' time, is the cost."""
    if kernels.empty:
        return pd.DataFrame(columns=TOP_KERNEL_COLUMNS)
    n = steps_per_rank(basis)
    k = kernels.reset_index(drop=True)
    hit = in_steps(k, basis) if n else np.zeros(len(k), dtype=bool)
    # grouped on codes that sort as the names do (not on a million strings), named afterwards
    dev_code, dev_names = _str_codes(k["device"])
    name_code, names = _str_codes(k["name"])
    k = pd.DataFrame({"rank": k["rank"].to_numpy(), "device": dev_code, "name": name_code, "dur": k["dur"].to_numpy(),
                      "n_ops": k["n_ops"].to_numpy(), "hit_dur": np.where(hit, k["dur"], 0)})
    busy = k.groupby(["rank", "device"])["dur"].transform("sum")
    k["share"] = k["dur"] / busy
    g = k.groupby(["rank", "device", "name"])
    out = pd.DataFrame({"kernels": g.size(), "ops": g["n_ops"].sum(), "total_ms": g["dur"].sum() / 1e6,
                        "per_step_ms": g["hit_dur"].sum() / 1e6 / n if n else np.nan,
                        "mean_us": g["dur"].mean() / 1e3, "pct": 100 * g["share"].sum()}).reset_index()
    out["device"], out["name"] = dev_names[out["device"].to_numpy()], names[out["name"].to_numpy()]
    if corr.empty:
        out["source"] = out["user_source"] = np.full(len(out), "", dtype=object)
    else:  # per kernel name: the line with the most device time, by its longest kernel's first op
        named, first_op, _ = _kernel_ops(kernels, corr)
        source, _ = _str_codes(corr["source"])
        k["source"] = np.where(named, source[first_op], -1)
        k["line_dur"] = k.groupby(["rank", "device", "name", "source"])["dur"].transform("sum")
        chosen = k.sort_values(["rank", "device", "name", "line_dur", "dur"], kind="stable").groupby(
            ["rank", "device", "name"]).tail(1).index.to_numpy()  # in the groups' order, as ``out``
        out["source"] = _strings_at(corr["source"], first_op[chosen], named[chosen])
        out["user_source"] = _strings_at(corr["user_source"], first_op[chosen], named[chosen])
    out["per_step_ms"] = out["per_step_ms"].astype(object).where(out["per_step_ms"] > 0, None) if n else None
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[TOP_KERNEL_COLUMNS]


FUSION_COLUMNS = ["rank", "device", "kernels", "ops", "ops_per_kernel", "one_op_kernels", "one_op_pct",
                  "busy_ms", "launch_floor_us", "launch_ms", "launch_pct", "collective_kernels"]


def fusion(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device: kernels, ops they ran, ops per kernel, kernels of one op (the queue
    fused nothing into them) and their share, device busy time, and launch cost: a device's
    fixed cost per kernel is at most its shortest kernel (``launch_floor_us``), so
    ``launch_ms`` (kernels x that) bounds from above the device time spent on launches, and
    ``launch_pct`` is its share of the busy time: high, and fusing or compiling pays. Collective
    kernels are counted apart (``collective_kernels``) and left out of the rest: the communication
    library's, no queue fuses them."""
    if kernels.empty:
        return pd.DataFrame(columns=FUSION_COLUMNS)
    comm = is_collective_kernel(kernels)
    n_comm = kernels[comm].groupby(["rank", "device"], observed=True).size()
    kernels = kernels[~comm]
    rows = []
    for (rank, device), k in kernels.groupby(["rank", "device"], observed=True):
        n, ops = len(k), int(k["n_ops"].sum())
        busy = int(k["dur"].sum())
        floor = int(k["dur"].min())
        one = int((k["n_ops"] == 1).sum())
        rows.append({"rank": int(rank), "device": str(device), "kernels": n, "ops": ops, "ops_per_kernel": ops / n,
                     "one_op_kernels": one, "one_op_pct": 100 * one / n, "busy_ms": busy / 1e6,
                     "launch_floor_us": floor / 1e3, "launch_ms": n * floor / 1e6,
                     "launch_pct": 100 * n * floor / busy if busy else 0.0,
                     "collective_kernels": int(n_comm.get((rank, device), 0))})
    return pd.DataFrame(rows, columns=FUSION_COLUMNS)


UNFUSED_COLUMNS = ["rank", "device", "kernels", "source", "user_source", "last_source", "occurrences",
                   "total_kernels", "total_ms", "launch_ms", "per_step", "first_step"]


def _kernel_ops(kernels: pd.DataFrame, corr: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel (``kernels`` order): whether ``correlation`` rows name it, and the positions in
    ``corr`` of its first and last queued op by enqueue id (meaningful where it is named)."""
    kern = corr["kernel"].to_numpy(np.int64)
    rows = np.flatnonzero(kern >= 0)
    ck = backend_key(corr["rank"].to_numpy()[rows], kern[rows])
    o = np.lexsort((corr["id"].to_numpy()[rows], ck))  # per kernel, its ops by enqueue id
    rows, ck = rows[o], ck[o]
    new = np.ones(len(ck), dtype=bool)
    new[1:] = ck[1:] != ck[:-1]
    last = np.ones(len(ck), dtype=bool)
    last[:-1] = new[1:]
    keys = ck[new]  # sorted, one per kernel named
    key = backend_key(kernels["rank"], kernels["id"])
    if not len(keys):
        nowhere = np.zeros(len(key), dtype=np.int64)
        return np.zeros(len(key), dtype=bool), nowhere, nowhere
    pos = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
    return keys[pos] == key, rows[new][pos], rows[last][pos]


def _strings_at(col: pd.Series, rows: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """``col.astype(str)`` at ``rows`` where ``hit``, "" elsewhere and where it is missing; a
    categorical column converted per category."""
    out = np.full(len(rows), "", dtype=object)
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy()[rows[hit]]
        cats = np.asarray(col.cat.categories.astype(str), dtype=object)
        if len(cats):
            out[hit] = np.where(codes >= 0, cats[np.maximum(codes, 0)], "")
        return out
    values = col.astype(str).to_numpy(dtype=object)[rows[hit]]
    values[pd.isna(values)] = ""
    out[hit] = values
    return out


def unfused_sequences(kernels: pd.DataFrame, corr: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Runs of at least ``UNFUSED_MIN_RUN`` consecutive one-op kernels on a stream of a device
    (collective kernels break a run: nothing fuses them), within one step, grouped by what they ran (``kernels``: the first ``SIGNATURE_OPS`` kernel names, "..."
    after) and where (the first and last op's line): ``occurrences``, ``total_kernels``,
    ``total_ms`` (device time), ``launch_ms`` (the launch-cost bound of ``fusion``),
    ``per_step`` (occurrences per ``basis`` step; None when they are not in one) and
    ``first_step``. Most launch cost first (what fusing them could save; every run: the report cuts the list): where a compiled region (``torch.compile
    (backend="neuron")``) or a custom kernel would save launches."""
    if kernels.empty:
        return pd.DataFrame(columns=UNFUSED_COLUMNS)
    k = kernels.reset_index(drop=True)
    floor = k.groupby(["rank", "device"], observed=True)["dur"].transform("min").to_numpy(np.int64)
    dev_code, dev_names = _str_codes(k["device"])  # codes in the names' order: sorts as the names do
    order = np.lexsort((k["ts"].to_numpy(), k["stream"].to_numpy(), dev_code, k["rank"].to_numpy()))
    n = len(order)
    one = ((k["n_ops"].to_numpy() == 1) & ~is_collective_kernel(k))[order]
    rank = k["rank"].to_numpy(np.int64)[order]
    dev = dev_code[order]
    stream = k["stream"].to_numpy(np.int64)[order]
    step = k["step"].to_numpy(np.int64)[order]
    brk = np.ones(n, dtype=bool)
    brk[1:] = (~one[1:]) | (~one[:-1]) | (rank[1:] != rank[:-1]) | (dev[1:] != dev[:-1]) | \
        (stream[1:] != stream[:-1]) | (step[1:] != step[:-1])
    # a run of one-op kernels: from a break at a one-op kernel to the next break
    bpos = np.flatnonzero(brk)
    starts = np.flatnonzero(one & brk)
    ends = np.append(bpos, n)[np.searchsorted(bpos, starts) + 1]
    long = ends - starts >= UNFUSED_MIN_RUN
    starts, ends = starts[long], ends[long]
    if not len(starts):
        return pd.DataFrame(columns=UNFUSED_COLUMNS)
    n_basis = steps_per_rank(basis)
    first, last = order[starts], order[ends - 1]
    # signatures: the first SIGNATURE_OPS names, joined once per distinct sequence of names
    name_code, names = _str_codes(k["name"])
    name_code = name_code[order]
    at = starts[:, None] + np.arange(SIGNATURE_OPS)[None, :]
    seqs = np.column_stack([np.where(at < ends[:, None], name_code[np.minimum(at, n - 1)], -1),
                            ends - starts > SIGNATURE_OPS])
    by = np.lexsort(seqs.T[::-1])
    distinct = np.ones(len(by), dtype=bool)
    distinct[1:] = (seqs[by][1:] != seqs[by][:-1]).any(axis=1)
    sig_of = np.empty(len(by), dtype=np.int64)
    sig_of[by] = np.cumsum(distinct) - 1
    sigs = np.array([" > ".join(names[c] for c in row[:SIGNATURE_OPS] if c >= 0) + (" > ..." if row[-1] else "")
                     for row in seqs[by][distinct]], dtype=object)
    # lines: of the first kernel's first op and the last kernel's last op
    if corr.empty:
        source = user_source = last_source = np.full(len(first), "", dtype=object)
    else:
        hit, first_op, last_op = _kernel_ops(k, corr)
        source = _strings_at(corr["source"], first_op[first], hit[first])
        user_source = _strings_at(corr["user_source"], first_op[first], hit[first])
        last_source = _strings_at(corr["source"], last_op[last], hit[last])
    dur = np.concatenate([[0], np.cumsum(k["dur"].to_numpy(np.int64)[order])])
    launch = np.concatenate([[0], np.cumsum(floor[order])])
    r = pd.DataFrame({"rank": k["rank"].to_numpy(np.int64)[first], "device": dev_names[dev_code[first]],
                      "kernels": sigs[sig_of], "source": source, "user_source": user_source,
                      "last_source": last_source, "n": ends - starts,
                      "ms": (dur[ends] - dur[starts]) / 1e6, "launch": (launch[ends] - launch[starts]) / 1e6,
                      "step": k["step"].to_numpy(np.int64)[first]})
    steady = in_steps(r, basis) if n_basis else np.zeros(len(r), dtype=bool)
    g = r.assign(steady=steady).groupby(["rank", "device", "kernels", "source", "user_source", "last_source"])
    out = pd.DataFrame({"occurrences": g.size(), "total_kernels": g["n"].sum(), "total_ms": g["ms"].sum(),
                        "launch_ms": g["launch"].sum(), "steady": g["steady"].sum(),
                        "first_step": g["step"].min()}).reset_index()
    out["per_step"] = pd.Series([s / n_basis if n_basis and s else None for s in out["steady"]], dtype=object)
    return out.sort_values(["launch_ms", "total_ms"], ascending=False, ignore_index=True)[UNFUSED_COLUMNS]


def queue_depth(enqueues: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device, the queue's depth over time: rank, device, ts, depth. At each enqueue
    the depth the backend reported (ops queued and not yet run, the new one included); at each
    kernel's end that less the ops of the kernels that ended since. Devices whose backend does not
    say its depth (CUDA: -1) have none."""
    cols = ["rank", "device", "ts", "depth"]
    enqueues = enqueues[enqueues["queue_depth"].to_numpy() >= 0] if len(enqueues) else enqueues
    if enqueues.empty:
        return pd.DataFrame(columns=cols)
    parts = []
    ecode, enames = _str_codes(enqueues["device"])
    kcode, knames = _str_codes(kernels["device"]) if len(kernels) else (np.zeros(0, np.int64), np.zeros(0, object))
    erank, krank = enqueues["rank"].to_numpy(), kernels["rank"].to_numpy()
    for rank in np.unique(erank).tolist():
        for code in np.unique(ecode[erank == rank]):  # the devices in name order, as a groupby sorts them
            device = enames[code]
            e = enqueues.iloc[np.flatnonzero((erank == rank) & (ecode == code))]
            kc = np.flatnonzero(knames == device)
            k = kernels.iloc[np.flatnonzero((krank == rank) & (kcode == (kc[0] if len(kc) else -1)))]
            ts = np.concatenate([e["ts"].to_numpy(np.int64), (k["ts"] + k["dur"]).to_numpy(np.int64)])
            is_enq = np.concatenate([np.ones(len(e), bool), np.zeros(len(k), bool)])
            reported = np.concatenate([e["queue_depth"].to_numpy(np.int64), np.zeros(len(k), np.int64)])
            done = np.concatenate([np.zeros(len(e), np.int64), k["n_ops"].to_numpy(np.int64)])
            order = np.lexsort((~is_enq, ts))  # at one time, the enqueue first
            ts, is_enq, reported, done = ts[order], is_enq[order], reported[order], done[order]
            ended = np.cumsum(done)
            last = np.maximum.accumulate(np.where(is_enq, np.arange(len(ts)), -1))
            base = np.where(last >= 0, reported[np.maximum(last, 0)], 0)
            depth = np.clip(base - (ended - np.where(last >= 0, ended[np.maximum(last, 0)], 0)), 0, None)
            parts.append(pd.DataFrame({"rank": rank, "device": device, "ts": ts, "depth": depth}))
    return pd.concat(parts, ignore_index=True)[cols]


# --------------------------------------------------------------------------- fallbacks and coverage


FALLBACK_COLUMNS = ["rank", "device", "op", "calls", "sources", "user_sources", "bytes_to_host", "bytes_from_host",
                    "total_ms", "in_steps", "per_step_ms", "calls_per_step"]


def fallback_summary(fallbacks: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and op that fell back to the CPU: calls, the lines that called it (``sources``;
    ``user_sources``: the user's lines that led there), bytes copied to the host (inputs) and
    back (results) in all, time (copies included), and over the ``basis`` steps its time and
    calls per step (None when none fell in them). Costliest first."""
    if fallbacks.empty:
        return pd.DataFrame(columns=FALLBACK_COLUMNS)
    n = steps_per_rank(basis)
    hit = in_steps(fallbacks, basis) if n else np.zeros(len(fallbacks), dtype=bool)
    f = fallbacks.assign(hit=hit, hit_dur=np.where(hit, fallbacks["dur"], 0),
                         device=fallbacks["device"].astype(str), op=fallbacks["op"].astype(str))
    rows = []
    for (rank, device, op), g in f.groupby(["rank", "device", "op"]):
        k = int(g["hit"].sum())
        rows.append({"rank": int(rank), "device": device, "op": op, "calls": len(g),
                     "sources": sorted({str(x) for x in g["source"] if str(x)}),
                     "user_sources": sorted({str(x) for x in g["user_source"] if str(x)}),
                     "bytes_to_host": int(g["bytes_to_host"].sum()), "bytes_from_host": int(g["bytes_from_host"].sum()),
                     "total_ms": g["dur"].sum() / 1e6, "in_steps": k,
                     "per_step_ms": g["hit_dur"].sum() / 1e6 / n if n and k else None,
                     "calls_per_step": k / n if n and k else None})
    return pd.DataFrame(rows, columns=FALLBACK_COLUMNS).sort_values("total_ms", ascending=False, ignore_index=True)


COVERAGE_COLUMNS = ["rank", "device", "native_ops", "fallback_ops", "coverage_pct", "fallback_op_kinds"]


def coverage(native: pd.DataFrame, fallbacks: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device: ops it ran natively (``native``: a (rank, device) row each,
    ``RunAnalysis.cpu_fallbacks.native``), ops it left to the CPU, the native share
    (``coverage_pct``) and how many distinct ops fell back."""
    parts = []
    for df, col in ((native, "native_ops"), (fallbacks, "fallback_ops")):
        if len(df):
            pairs = df.groupby(["rank", "device"], observed=True, dropna=False).size().rename("n").reset_index()
            parts.append(pairs.groupby(["rank", pairs["device"].astype(str)])["n"].sum().rename(col))
    if not parts:
        return pd.DataFrame(columns=COVERAGE_COLUMNS)
    out = pd.concat(parts, axis=1).fillna(0).astype(np.int64).reset_index()
    for col in ("native_ops", "fallback_ops"):
        if col not in out.columns:
            out[col] = 0
    total = out["native_ops"] + out["fallback_ops"]
    out["coverage_pct"] = 100 * out["native_ops"] / total.where(total > 0, 1)
    kinds = fallbacks.groupby(["rank", fallbacks["device"].astype(str)])["op"].nunique() if len(fallbacks) else None
    out["fallback_op_kinds"] = [int(kinds.get((r, d), 0)) if kinds is not None else 0
                                for r, d in zip(out["rank"], out["device"])]
    return out[COVERAGE_COLUMNS]


# --------------------------------------------------------------------------- copies


COPY_COLUMNS = ["rank", "device", "kind", "user_source", "copies", "bytes", "total_ms", "in_steps", "bytes_per_step",
                "per_step_ms", "gbps"]


def copy_summary(copies: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device, direction (``kind``: HtoD, DtoH, DtoD ... memset) and the user's line
    that issued them (``Run.device_copies``): copies, bytes and device time over the run, and over
    the ``basis`` steps their bytes and time per step (None when none fell in them), and the rate
    (GB/s over their device time). Most bytes first."""
    if copies.empty:
        return pd.DataFrame(columns=COPY_COLUMNS)
    n = steps_per_rank(basis)
    hit = in_steps(copies, basis) if n else np.zeros(len(copies), dtype=bool)
    known = np.maximum(copies["bytes"].to_numpy(np.int64), 0)
    c = copies.assign(hit=hit, b=known, hit_b=np.where(hit, known, 0), hit_dur=np.where(hit, copies["dur"], 0),
                      device=copies["device"].astype(str), kind=copies["kind"].astype(str),
                      user_source=copies["user_source"].astype(str))
    g = c.groupby(["rank", "device", "kind", "user_source"])
    out = pd.DataFrame({"copies": g.size(), "bytes": g["b"].sum(), "total_ms": g["dur"].sum() / 1e6,
                        "in_steps": g["hit"].sum(), "hit_b": g["hit_b"].sum(), "hit_ns": g["hit_dur"].sum(),
                        "ns": g["dur"].sum()}).reset_index()
    some = (out["in_steps"] > 0) & bool(n)
    out["bytes_per_step"] = (out["hit_b"] / max(n, 1)).astype(object).where(some, None)
    out["per_step_ms"] = (out["hit_ns"] / 1e6 / max(n, 1)).astype(object).where(some, None)
    out["gbps"] = (out["bytes"] / out["ns"].where(out["ns"] > 0)).astype(object).where(out["ns"] > 0, None)
    return out.sort_values(["bytes", "total_ms"], ascending=False, ignore_index=True)[COPY_COLUMNS]


# --------------------------------------------------------------------------- custom kernels


CUSTOM_KERNEL_COLUMNS = ["rank", "device", "name", "calls", "forward_calls", "backward_calls", "total_ms", "forward_ms",
                         "backward_ms", "mean_us", "per_step_ms", "pct", "user_sources", "graphs"]
BUILTIN_NAMESPACES = ("aten", "prims", "c10d")
"""Op namespaces that are PyTorch's own (``c10d``: a collective's kernel): a kernel named ``ns::op``
outside them is a custom kernel."""


def is_custom_kernel(names: np.ndarray) -> np.ndarray:
    """Mask of kernel names (strings) that are a custom op's qualified name (``lib::op``, ``lib``
    not one of ``BUILTIN_NAMESPACES``): how a backend reports a custom kernel
    (collectors/neuron_prof_backend.h)."""
    ns = np.array([v.split("::", 1)[0] if "::" in v else "" for v in names], dtype=object)
    return (ns != "") & ~np.isin(ns, BUILTIN_NAMESPACES)


def custom_kernels(kernels: pd.DataFrame, corr: pd.DataFrame, basis: pd.DataFrame,
                   graph_of: Callable[[np.ndarray], np.ndarray] | None = None) -> pd.DataFrame:
    """Per rank, device and custom kernel: its runs (``calls``), forward and backward apart (a run
    is a backward one when the op that queued its first op ran in the backward pass), device time
    in all, mean, per ``basis`` step (None when none ran in one), its share of the device's busy
    time over the run (``pct``; their sum is the custom-kernel coverage), the user's lines that
    queued it (a backward run's: the forward call's line) and the compiled graphs it ran in
    (``graph_of``: the graph of each host op row, ``analysis.compile.compiled_graph_of``: the
    graph of the op that queued its first op). Costliest first."""
    if kernels.empty:
        return pd.DataFrame(columns=CUSTOM_KERNEL_COLUMNS)
    names = _str_values(kernels["name"])
    mine = is_custom_kernel(names)
    if not mine.any():
        return pd.DataFrame(columns=CUSTOM_KERNEL_COLUMNS)
    k = kernels.reset_index(drop=True).assign(device=_str_values(kernels["device"]), name=names)
    busy = k.groupby(["rank", "device"])["dur"].sum()
    n = steps_per_rank(basis)
    hit = in_steps(k, basis) if n else np.zeros(len(k), dtype=bool)
    bwd = np.zeros(len(k), dtype=bool)
    line = np.full(len(k), "", dtype=object)
    graph = np.full(len(k), "", dtype=object)
    if not corr.empty:  # each kernel's first queued op: its pass, the user's line, its graph
        named, first_op, _ = _kernel_ops(kernels, corr)
        named &= mine
        bwd = named & corr["bwd"].to_numpy(bool)[np.where(named, first_op, 0)]
        line = _strings_at(corr["user_source"], first_op, named)
        if graph_of is not None:
            host = corr["op_index"].to_numpy(np.int64)[first_op[named]]
            graph[np.flatnonzero(named)[host >= 0]] = graph_of(host[host >= 0])
    k = k.assign(bwd=bwd, line=line, graph=graph, hit_dur=np.where(hit, k["dur"], 0))[mine]
    rows = []
    for (rank, device, name), g in k.groupby(["rank", "device", "name"], sort=False):
        back = g["bwd"].to_numpy()
        lines = {x for x in g["line"] if x}
        rows.append({"rank": int(rank), "device": device, "name": name, "calls": len(g),
                     "forward_calls": int((~back).sum()), "backward_calls": int(back.sum()),
                     "total_ms": g["dur"].sum() / 1e6, "forward_ms": g.loc[~back, "dur"].sum() / 1e6,
                     "backward_ms": g.loc[back, "dur"].sum() / 1e6, "mean_us": g["dur"].mean() / 1e3,
                     "per_step_ms": g["hit_dur"].sum() / 1e6 / n if n and g["hit_dur"].sum() > 0 else None,
                     "pct": 100 * g["dur"].sum() / max(int(busy[(rank, device)]), 1),
                     "user_sources": sorted(lines), "graphs": sorted({x for x in g["graph"] if x})})
    return pd.DataFrame(rows, columns=CUSTOM_KERNEL_COLUMNS).sort_values("total_ms", ascending=False,
                                                                         ignore_index=True)


# --------------------------------------------------------------------------- capture gaps


GAP_COLUMNS = ["rank", "first_step", "last_step", "reason"]


def traced_steps(steps: pd.DataFrame, gaps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` less those a device gap overlaps (``gap_steps``): the steps whose device side is
    known, the basis of every per-step device figure."""
    if gaps.empty or steps.empty:
        return steps
    lost = np.zeros(len(steps), dtype=bool)
    for g in gap_steps(gaps, steps).itertuples():
        lost |= (steps["rank"].to_numpy() == g.rank) & steps["step"].between(g.first_step, g.last_step).to_numpy()
    return steps[~lost]


def gap_steps(gaps: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per device gap (``Run.device_gaps``: a stretch of a capture window without device activity),
    the first and last step it overlaps and why; gaps that overlap no step are left out."""
    rows = []
    for g in gaps.itertuples():
        s = steps[steps["rank"] == g.rank]
        hit = s[(s["ts"] < g.ts + g.dur) & (s["ts"] + s["dur"] > g.ts)]
        if len(hit):
            rows.append((int(g.rank), int(hit["step"].min()), int(hit["step"].max()), str(g.reason)))
    return pd.DataFrame(rows, columns=GAP_COLUMNS)
