"""Op time: self time from the per-thread nesting, and the top ops by self time with module path."""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.store.keys import step_key, thread_key


def parent_index(ops: pd.DataFrame) -> np.ndarray:
    """Row position of each op's enclosing op on the same thread (-1 for top-level ops).

    Uses the recorded nesting depth: the parent of an op at depth d is the last op at depth d-1
    that started before it on the same rank and thread and contains it.
    """
    n = len(ops)
    if n == 0:
        return np.full(0, -1, dtype=np.int64)
    rank = ops["rank"].to_numpy()
    one_rank = rank.min() == rank.max()  # the common case: no rank key (memory at 10M+ ops)
    keys = (ops["depth"].to_numpy(), ops["ts"].to_numpy(), ops["tid"].to_numpy())
    order = np.lexsort(keys if one_rank else (*keys, rank))
    depth = keys[0][order]
    ts = keys[1][order]
    end = ops["dur"].to_numpy()[order]
    end += ts
    group = keys[2][order].astype(np.int64, copy=False) if one_rank else thread_key(rank[order], keys[2][order])
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
    del depth, ts, end, group
    parent = np.full(n, -1, dtype=np.int64)
    valid = sorted_parent >= 0
    parent[order[valid]] = order[sorted_parent[valid]]
    return parent


def has_ancestor(parent: np.ndarray, flagged: np.ndarray, max_depth: int) -> np.ndarray:
    """True where some ancestor of the op (not the op itself) is flagged."""
    has_parent = parent >= 0
    up = np.maximum(parent, 0)
    inside = np.zeros(len(parent), dtype=bool)
    for _ in range(max_depth):
        inside = has_parent & (flagged[up] | inside[up])
    return inside


def name_mask(ops: pd.DataFrame, pred, column: str = "name") -> np.ndarray:
    """``pred(value)`` of ``column`` for every op, evaluated once per distinct value (the ops'
    string columns are categorical: no per-row strings over millions of ops)."""
    cat = ops[column].astype("category")
    return np.array([bool(pred(str(c))) for c in cat.cat.categories] + [False], dtype=bool)[cat.cat.codes.to_numpy()]


OP_PHASES = ("forward", "backward", "recompute", "optimizer", "communication")
OPTIMIZER_PREFIX = "Optimizer."  # torch.optim's record_function ranges: Optimizer.step#Adam.step, ...
COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "record_param_comms")


def step_phases(ops: pd.DataFrame, parent: np.ndarray) -> np.ndarray:
    """The phase of a training step each op's self time belongs to, as an index into ``OP_PHASES``:
    ``communication`` for collective ops (``c10d::``, NCCL/Gloo ranges) and what runs inside them;
    ``backward`` for other ops autograd's backward pass ran, but ``recompute`` for the forward ops
    it re-ran (activation checkpointing: ``ops.recompute``); ``optimizer`` for the rest of
    torch.optim's ranges (``Optimizer.step``/``zero_grad`` and what runs inside them) outside any
    module; ``forward`` for everything else, a module's ops inside an optimizer range included:
    Lightning and closure optimizers (LBFGS) run forward and backward inside
    ``optimizer.step(closure)``."""
    depth = int(ops["depth"].to_numpy().max(initial=0))

    def within(flag: np.ndarray) -> np.ndarray:
        return flag | has_ancestor(parent, flag, depth)

    phase = np.zeros(len(ops), dtype=np.int8)
    in_opt = within(name_mask(ops, lambda n: n.startswith(OPTIMIZER_PREFIX)))
    phase[in_opt & ~name_mask(ops, bool, "module")] = OP_PHASES.index("optimizer")
    phase[ops["bwd"].to_numpy(bool)] = OP_PHASES.index("backward")
    if "recompute" in ops.columns:  # a frame built without it (an imported trace) has no recompute
        phase[ops["recompute"].to_numpy(bool)] = OP_PHASES.index("recompute")
    phase[within(name_mask(ops, lambda n: n.startswith(COMM_PREFIXES)))] = OP_PHASES.index("communication")
    return phase


def comm_ops(ops: pd.DataFrame, parent: np.ndarray, keep: np.ndarray, compile_ns: np.ndarray) -> pd.DataFrame:
    """The outermost collective ops (``c10d::``, NCCL/Gloo ranges) among the ``keep`` rows, at any
    depth (DDP's all-reduce runs inside backward, which runs inside ``optimizer.step(closure)``
    under Lightning), with their run time: rank, step, dur."""
    comm = name_mask(ops, lambda n: n.startswith(COMM_PREFIXES))
    if not comm.any():
        return pd.DataFrame({"rank": [], "step": [], "dur": []})
    outer = comm & ~has_ancestor(parent, comm, int(ops["depth"].to_numpy().max(initial=0))) & keep
    out = ops.loc[outer, ["rank", "step"]]
    return out.assign(dur=ops["dur"].to_numpy()[outer] - compile_ns[outer])


def phase_time(ops: pd.DataFrame, phase: np.ndarray, self_ns: np.ndarray, keep: np.ndarray) -> pd.DataFrame:
    """Run-time self time per rank and phase (``step_phases``) of the ``keep`` rows: rank, phase, ns."""
    ranks, rank_idx = np.unique(ops["rank"].to_numpy()[keep], return_inverse=True)
    n = len(OP_PHASES)
    ns = np.bincount(rank_idx.reshape(-1) * n + phase[keep], weights=self_ns[keep], minlength=len(ranks) * n)
    return pd.DataFrame({"rank": np.repeat(ranks, n), "phase": list(OP_PHASES) * len(ranks), "ns": ns})


def self_time(ops: pd.DataFrame, parent: np.ndarray | None = None, dur: np.ndarray | None = None) -> np.ndarray:
    """Duration minus the duration of direct children (ns). ``parent``: ``parent_index(ops)``, if
    the caller has it already (it is the expensive part). ``dur``: the durations to use instead of
    ``ops.dur``, e.g. run time (``dur`` less ``compile_overlap``'s compile time)."""
    parent = parent_index(ops) if parent is None else parent
    dur = ops["dur"].to_numpy() if dur is None else np.asarray(dur)
    child = np.bincount(parent[parent >= 0], weights=dur[parent >= 0], minlength=len(ops))
    return np.maximum(dur - child.astype(np.int64), 0)


def compile_overlap(ops: pd.DataFrame, spans: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(inside, compile_ns)`` per op, from ``analysis.compile.compile_spans``: whether the op
    ran within a compile on its thread (compile-time work: Dynamo's tracing, fake-tensor
    propagation, Inductor), and how much compile time lies within the op (all of it for an op
    inside a compile). Run time is ``dur - compile_ns``: torch.compile compiles lazily inside the
    first call that needs a graph, so without this, compiling counts as running."""
    n = len(ops)
    inside = np.zeros(n, dtype=bool)
    compile_ns = np.zeros(n, dtype=np.int64)
    if not n or spans.empty:
        return inside, compile_ns
    ts = ops["ts"].to_numpy()
    end = ts + ops["dur"].to_numpy()
    rank, tid = ops["rank"].to_numpy(), ops["tid"].to_numpy()
    for (r, t), sp in spans.groupby(["rank", "tid"], sort=False):  # the few threads that compiled
        rows = np.flatnonzero((rank == r) & (tid == t))
        if not len(rows):
            continue
        starts, ends = sp["ts"].to_numpy(np.int64), sp["end"].to_numpy(np.int64)
        before = np.concatenate([[0], np.cumsum(ends - starts)])  # compile time before each span

        def compiled_until(x: np.ndarray) -> np.ndarray:
            k = np.searchsorted(starts, x, side="right") - 1
            kk = np.maximum(k, 0)
            return np.where(k >= 0, before[kk] + np.clip(x - starts[kk], 0, ends[kk] - starts[kk]), 0)

        s, e = ts[rows], end[rows]
        k = np.searchsorted(starts, s, side="right") - 1
        inside[rows] = (k >= 0) & (ends[np.maximum(k, 0)] >= e)
        compile_ns[rows] = compiled_until(e) - compiled_until(s)
    return inside, compile_ns


def op_stats(ops: pd.DataFrame, by: tuple[str, ...] = ("name", "module"),
             self_ns: np.ndarray | None = None) -> pd.DataFrame:
    """Calls, total and self time per group, sorted by self time; ``self_pct`` of all self time.
    Self time: ``self_ns`` if given, else the ops' ``self_ns`` column (``run_time_ops``), else
    ``self_time(ops)``. Where ``ops`` has ``recompute``, recomputed ops (activation checkpointing)
    are groups of their own, marked ``recompute``: the same op of the same module runs forward and
    is re-run in the backward pass."""
    recompute = "recompute" in ops.columns
    cols = [*by, "calls", "total_ms", "self_ms", "self_pct", "mean_us", "backward",
            *(["recompute"] if recompute else [])]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    if self_ns is None:
        self_ns = ops["self_ns"].to_numpy() if "self_ns" in ops.columns else self_time(ops)
    keys = [*by, *(["recompute"] if recompute else [])]
    df = ops[keys + ["dur", "bwd"]].assign(self_ns=self_ns)
    g = df.groupby(keys, observed=True, sort=False)
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


RUN_TIME_COLUMNS = ("rank", "step", "tid", "name", "bwd")  # what step breakdowns need


def run_time_rows(ops: pd.DataFrame, in_compile: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Mask of the ops of ``steps`` (``step_kinds`` rows) that ran outside torch.compile's
    compiles (``in_compile`` = ``RunAnalysis.op_compile.inside``): what run-time figures are over."""
    return ~in_compile & in_steps(ops, steps)


def run_time_ops(ops: pd.DataFrame, keep: np.ndarray, compile_ns: np.ndarray, run_self_ns: np.ndarray,
                 columns: tuple[str, ...] = RUN_TIME_COLUMNS, top_level: bool = False) -> pd.DataFrame:
    """The ``keep`` rows (``run_time_rows``) as ``columns`` plus ``dur`` and ``self_ns``: their
    run time and run-time self time (``compile_ns`` = ``RunAnalysis.op_compile.compile_ns``, ``run_self_ns`` =
    ``RunAnalysis.op_compile.run_self_ns``). Index labels are kept. ``top_level``: only depth-0 ops (what the
    busiest thread of a step covered)."""
    if top_level:
        keep = keep & (ops["depth"].to_numpy() == 0)
    out = ops.loc[keep, [c for c in columns if c != "dur"]]
    return out.assign(dur=ops["dur"].to_numpy()[keep] - compile_ns[keep], self_ns=run_self_ns[keep])


def in_steps(df: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Mask of the rows of ``df`` (events with rank and step) that belong to one of ``steps``'
    (rank, step) pairs."""
    return np.isin(step_key(df["rank"], df["step"]), step_key(steps["rank"], steps["step"]))


MODULE_ROOT = "(all ops)"


def module_tree(ops: pd.DataFrame, self_ns: np.ndarray | None = None) -> pd.DataFrame:
    """Self time aggregated along the dot-separated module path (``layers.0.self_attn``) as a tree.

    One row per node: ``id`` (the module path; ``MODULE_ROOT`` for the root), ``parent`` (``""``
    for the root), ``label`` (last path component), ``depth``, ``calls`` and ``self_ms`` of the ops
    whose module is exactly this path, and ``total_ms``: self time of the ops in this module and
    every module below it. Ops outside any module count to the root, so the root's ``total_ms`` is
    all self time. ``self_ns`` (from ``self_time(ops)``) is computed when not given. One groupby
    over the ops; the loop runs over distinct module paths only.
    """
    cols = ["id", "parent", "label", "depth", "calls", "self_ms", "total_ms"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    if self_ns is None:
        self_ns = self_time(ops)
    grp = pd.Series(np.asarray(self_ns, dtype=np.float64), index=ops.index).groupby(ops["module"], observed=True)
    own = pd.DataFrame({"self_ns": grp.sum(), "calls": grp.size()})
    own.index = own.index.astype(str)
    own = own.groupby(level=0).sum()  # category values that print alike
    nodes: dict[str, dict] = {MODULE_ROOT: {"parent": "", "label": MODULE_ROOT, "depth": 0,
                                            "calls": 0, "self_ns": 0.0, "total_ns": 0.0}}
    for path, row in own.iterrows():
        s, calls = float(row["self_ns"]), int(row["calls"])
        nodes[MODULE_ROOT]["total_ns"] += s
        if not path:
            nodes[MODULE_ROOT]["self_ns"] += s
            nodes[MODULE_ROOT]["calls"] += calls
            continue
        parts = path.split(".")
        parent = MODULE_ROOT
        for i in range(1, len(parts) + 1):
            node = ".".join(parts[:i])
            n = nodes.setdefault(node, {"parent": parent, "label": parts[i - 1], "depth": i,
                                        "calls": 0, "self_ns": 0.0, "total_ns": 0.0})
            n["total_ns"] += s
            parent = node
        nodes[path]["self_ns"] += s
        nodes[path]["calls"] += calls
    out = pd.DataFrame.from_dict(nodes, orient="index").rename_axis("id").reset_index()
    out["self_ms"] = out["self_ns"] / 1e6
    out["total_ms"] = out["total_ns"] / 1e6
    out["calls"] = out["calls"].astype(np.int64)
    return out.sort_values(["depth", "total_ms"], ascending=[True, False], ignore_index=True)[cols]


def filter_tree(tree: pd.DataFrame, text: str) -> pd.DataFrame:
    """The nodes of ``module_tree`` whose path contains ``text`` (case-insensitive), with their
    ancestors up to the root and everything below them; all of it for an empty ``text``, nothing
    when no module matches. Values are unchanged (an ancestor keeps its whole total)."""
    text = (text or "").strip().lower()
    if not text or tree.empty:
        return tree
    ids = tree["id"].astype(str)
    hit = [i for i in ids if i != MODULE_ROOT and text in i.lower()]
    if not hit:
        return tree.iloc[0:0]
    keep = {MODULE_ROOT}
    for i in hit:
        parts = i.split(".")
        keep.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    below = tuple(i + "." for i in hit)
    mask = ids.isin(keep) | ids.str.startswith(below)
    return tree[mask.to_numpy()].reset_index(drop=True)
