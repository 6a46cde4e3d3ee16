"""Sync points: ops that make the host wait for the device or read a device value.

Detected by what the op is, not by how long it took: on CPU they cost little, but the same line
stalls the host on an asynchronous device (CUDA, Neuron's eager queue). Whether one did stall is
the device's to say (:func:`stalled`): a read the device had ready (a synchronous backend's) is a
read, not a wait. On a run with no device (``analysis.accelerator``) nothing waits: the same rows
are host reads of tensor values that would wait on an accelerator, a porting note. The copies of a
CPU fallback are the fallback's, not reads: callers leave them out (``RunAnalysis.op_time.sync_points``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import has_ancestor, in_steps, parent_index
from neuron_prof.analysis.steps import steps_per_rank

SYNC_OPS: dict[str, str] = {
    "aten::_local_scalar_dense": "read device value (.item(), bool(), int(), float(), print)",
    "aten::is_nonzero": "read device value (tensor in `if`/`while`)",
    "aten::nonzero": "data-dependent output size",
    "aten::masked_select": "data-dependent output size",
    "aten::unique": "data-dependent output size",
    "aten::_unique": "data-dependent output size",
    "aten::_unique2": "data-dependent output size",
    "aten::unique_consecutive": "data-dependent output size",
    "aten::unique_dim": "data-dependent output size",
    "aten::repeat_interleave": "data-dependent output size",
    "aten::equal": "read device value (torch.equal)",
    "aten::tolist": "read device value (.tolist())",
}
_COPY_OPS = ("aten::copy_", "aten::_to_copy")
OPTIMIZER_RANGE = "Optimizer.step#"  # torch.optim wraps step() in a record_function of this name
SYNC_COLUMNS = ["rank", "step", "ts", "dur", "name", "kind", "source", "user_source", "source_full", "module", "thread", "tid",
                "devices"]


def _is_device_to_host(name: str, devices: str) -> bool:
    """A copy whose destination is the CPU and whose source is not (devices lists inputs in order)."""
    if name not in _COPY_OPS:
        return False
    devs = [d.strip() for d in devices.split(",") if d.strip()]
    if name == "aten::copy_":  # copy_(self=dst, src)
        return len(devs) >= 2 and devs[0] == "cpu" and devs[1] != "cpu"
    return len(devs) >= 2 and devs[0] != "cpu" and devs[-1] == "cpu"  # _to_copy(self, ..., device=cpu)


def sync_points(ops: pd.DataFrame, parent: np.ndarray | None = None,
                exclude: np.ndarray | None = None) -> pd.DataFrame:
    """One row per sync op; nested sync ops (``item`` → ``_local_scalar_dense``) count once.
    ``parent``: ``parent_index(ops)``, if the caller has it already. ``exclude``: ops to leave
    out, e.g. those inside torch.compile's compiles (``RunAnalysis.op_compile.inside``): tracing reads
    values that the compiled graph never reads again.

    Not counted: torch.optim's reads of its own CPU step counters (a ``_local_scalar_dense`` on a
    CPU tensor inside ``Optimizer.step``): the optimizer keeps those on the host on every device,
    so they never wait for the device. The same read of a device tensor is counted.
    """
    if ops.empty:
        return pd.DataFrame(columns=SYNC_COLUMNS)
    by_name, name_codes = _categories(ops["name"])
    by_dev, dev_codes = _categories(ops["devices"])

    def per_name(fn) -> np.ndarray:  # fn on each distinct name, spread to the rows
        return np.array([fn(n) for n in by_name])[name_codes]

    def per_device(fn) -> np.ndarray:
        return np.array([fn(d) for d in by_dev], dtype=bool)[dev_codes]

    kind = np.array([SYNC_OPS.get(n) for n in by_name], dtype=object)[name_codes]
    d2h = np.zeros(len(ops), dtype=bool)
    for op in _COPY_OPS:
        d2h |= per_name(lambda n: n == op).astype(bool) & per_device(lambda d: _is_device_to_host(op, d))
    kind[d2h] = "device-to-host copy"
    flagged = kind != None  # noqa: E711 - elementwise on an object array
    parent = parent_index(ops) if parent is None else parent
    max_depth = int(ops["depth"].max())
    keep = flagged & ~has_ancestor(parent, flagged, max_depth)
    in_optimizer = has_ancestor(parent, per_name(lambda n: n.startswith(OPTIMIZER_RANGE)).astype(bool), max_depth)
    host_only = per_device(lambda d: all(x.strip() in ("cpu", "") for x in d.split(",")))
    keep &= ~(in_optimizer & host_only & per_name(lambda n: n == "aten::_local_scalar_dense").astype(bool))
    if exclude is not None:
        keep &= ~exclude
    hit = ops[keep].assign(kind=kind[keep])
    return hit[SYNC_COLUMNS].sort_values(["rank", "ts"], ignore_index=True)


def stalled(sync: pd.DataFrame, wait_ns: np.ndarray, kernels: pd.DataFrame) -> np.ndarray:
    """Per sync point, whether the device's own activity shows the host waiting in it: a host wait
    the backend reported inside it (``wait_ns`` > 0: ``analysis.device.sync_waits``), or a kernel of
    its rank still running at its start (the kernel timeline runs past the read). Elsewhere it is a
    read of a device value the device had ready: a synchronous backend's, or one after a sync."""
    out = np.asarray(wait_ns, dtype=np.int64) > 0
    if sync.empty or kernels.empty:
        return out
    s_rank, s_ts = sync["rank"].to_numpy(), sync["ts"].to_numpy(np.int64)
    for rank in np.unique(s_rank):
        k = kernels[kernels["rank"] == rank]
        if not len(k):
            continue
        order = np.argsort(k["ts"].to_numpy(np.int64), kind="stable")
        kts = k["ts"].to_numpy(np.int64)[order]
        running_end = np.maximum.accumulate((kts + k["dur"].to_numpy(np.int64)[order]))
        mine = np.flatnonzero(s_rank == rank)
        pos = np.searchsorted(kts, s_ts[mine], side="left") - 1  # kernels started before the read
        out[mine] |= (pos >= 0) & (running_end[np.maximum(pos, 0)] > s_ts[mine])
    return out


def _categories(col: pd.Series) -> tuple[list[str], np.ndarray]:
    """Distinct values and per-row codes (ops columns are categorical: no per-row work)."""
    cat = col.astype("category")
    return [str(c) for c in cat.cat.categories], cat.cat.codes.to_numpy()


def sync_summary(sync: pd.DataFrame, steps: pd.DataFrame, wait_ns: np.ndarray | None = None,
                 stalls: np.ndarray | None = None) -> pd.DataFrame:
    """Sync points grouped by source line and op: ``count`` and ``total_ms`` over the run,
    ``in_steps`` (how many fell in ``steps``: the steady steps) and ``per_step`` (``in_steps``
    per such step, None when there are none). A sync point outside them (start-up, the first
    step, DDP or data set-up) is one-off: ``count - in_steps``, never a per-step rate.

    ``wait_ns``: per sync point, the host's measured wait for the device inside it
    (``analysis.device.sync_waits``), on devices whose backend reports it: adds what each sync
    point costs, ``wait_ms`` over the run and ``wait_ms_per_step`` over ``steps``, and orders
    the lines by it (else: by how often they sync in ``steps``). ``stalls``: per sync point,
    whether the device showed the host waiting in it (:func:`stalled`): adds ``stalls``, how many
    did."""
    cols = ["source", "name", "kind", "count", "total_ms", "in_steps", "per_step"]
    if wait_ns is not None:
        cols += ["wait_ms", "wait_ms_per_step"]
    if stalls is not None:
        cols += ["stalls"]
    if sync.empty:
        return pd.DataFrame(columns=cols)
    n = steps_per_rank(steps)
    hit = in_steps(sync, steps) if n else np.zeros(len(sync), dtype=bool)
    waits = np.zeros(len(sync), dtype=np.int64) if wait_ns is None else np.asarray(wait_ns, dtype=np.int64)
    stall = np.zeros(len(sync), dtype=bool) if stalls is None else np.asarray(stalls, dtype=bool)
    g = sync.assign(hit=hit, wait=waits, hit_wait=np.where(hit, waits, 0), stall=stall).groupby(
        ["source", "name", "kind"], observed=True)
    out = pd.DataFrame({"count": g.size(), "total_ms": g["dur"].sum() / 1e6, "in_steps": g["hit"].sum(),
                        "wait_ms": g["wait"].sum() / 1e6, "wait_ms_per_step": g["hit_wait"].sum() / 1e6 / max(n, 1),
                        "stalls": g["stall"].sum()}).reset_index()
    out = out[out["count"] > 0]
    out["per_step"] = (out["in_steps"] / n).where(out["in_steps"] > 0) if n else np.nan
    out["per_step"] = out["per_step"].astype(object).where(out["per_step"].notna(), None)
    out["wait_ms_per_step"] = out["wait_ms_per_step"].astype(object).where(out["in_steps"] > 0, None)
    order = (["stalls"] if stalls is not None else []) + (["wait_ms"] if wait_ns is not None else []) \
        + ["in_steps", "count", "total_ms"]
    return out.sort_values(order, ascending=False, ignore_index=True)[cols]
