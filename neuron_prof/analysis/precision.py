"""Mixed precision: the precision each op computed in, how a step's time divides among them, and
the ops autocast left in fp32.

An op's precision is read off its recorded input dtypes (``ops.dtypes``, with ``ops.shapes``): the
floating dtype its tensor inputs share, or the widest of them where they differ (what the op
computes in after type promotion), 0-dim inputs left out where others are not (a Python number
is a 0-dim float64 tensor by then, and does not promote a tensor's dtype); casts and copies
(``aten::_to_copy``, ``aten::copy_``: autocast's own casts among them) are ``cast``; ops with no
floating input are ``other``. The time is the device's where a device backend reported kernels (a
kernel's time split evenly among the ops it ran), else the host ops' self time."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import name_mask

PRECISIONS = ("bf16", "fp16", "fp32", "fp64", "cast", "other")
LOWER = ("bf16", "fp16")
"""What autocast computes in: a run with time in these ran under autocast (or in low precision)."""
_FLOATS = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_WIDEST_FIRST = ("fp64", "fp32", "fp16", "bf16")
CASTS = ("aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from")
MIX_COLUMNS = ["rank", "precision", "ms_per_step", "pct"]
FP32_COLUMNS = ["rank", "name", "module", "calls", "ms_per_step", "pct", "user_sources"]


def _top_level(text: str) -> list[str]:
    """``text`` split at its commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _precision_of(dtypes: str, shapes: str) -> str:
    entries = _top_level(dtypes)
    dims = _top_level(shapes[1:-1]) if shapes.startswith("[") else []
    if len(dims) == len(entries):  # 0-dim inputs out, where there are others
        sized = [d for d, s in zip(entries, dims) if s.strip() != "[]"]
        entries = sized if any(t in _FLOATS for d in sized for t in re.findall(r"[a-z0-9_]+", d)) else entries
    found = {_FLOATS[t] for d in entries for t in re.findall(r"[a-z0-9_]+", d) if t in _FLOATS}
    return next((p for p in _WIDEST_FIRST if p in found), "other")


def op_precision(ops: pd.DataFrame) -> np.ndarray:
    """Per row of ``ops``: its precision, one of ``PRECISIONS`` (per distinct dtypes and shapes, not
    per row: a step repeats a few hundred of them)."""
    codes, uniq = pd.MultiIndex.from_arrays([ops["dtypes"], ops["shapes"]]).factorize()
    out = np.array([_precision_of(str(d), str(sh)) for d, sh in uniq] + ["other"], dtype=object)[codes]
    out[name_mask(ops, lambda n: n in CASTS)] = "cast"
    return out


def time_basis(kernels: pd.DataFrame) -> str:
    """What precision figures weigh each op by: "device" (the device time of the kernels that ran
    its work) where a device backend reported kernels (``run.device_kernels``), else "host" (its
    run-time self time)."""
    return "device" if len(kernels) else "host"


def device_ns_per_op(n_ops: int, corr: pd.DataFrame) -> np.ndarray:
    """Per row of the run's ops: the device time of the kernels that ran the work it queued, a
    kernel's time split evenly among its ops (``corr``: ``analysis.device.correlation``)."""
    out = np.zeros(n_ops, np.float64)
    ran = corr[(corr["kernel"].to_numpy() >= 0) & (corr["op_index"].to_numpy() >= 0)]
    if ran.empty:
        return out
    key = ran["rank"].to_numpy(np.int64) * (1 << 40) + ran["kernel"].to_numpy(np.int64)
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    share = ran["kernel_dur"].to_numpy(np.float64) / counts[inverse.reshape(-1)]
    np.add.at(out, ran["op_index"].to_numpy(np.int64), share)
    return out


def precision_mix(ops: pd.DataFrame, precision: np.ndarray, time_ns: np.ndarray, keep: np.ndarray,
                  per_rank: int) -> pd.DataFrame:
    """Per rank and precision that had time: ms per step (``per_rank`` steps) and share of the
    ``keep`` rows' time (the facade keeps the forward and backward passes of the steady steps:
    the optimizer updates fp32 master weights in any mixed-precision training)."""
    if not per_rank or not keep.any():
        return pd.DataFrame(columns=MIX_COLUMNS)
    df = pd.DataFrame({"rank": ops["rank"].to_numpy()[keep], "precision": precision[keep], "ns": time_ns[keep]})
    g = df.groupby(["rank", "precision"])["ns"].sum().reset_index()
    g = g[g["ns"] > 0]
    total = g.groupby("rank")["ns"].transform("sum")
    out = g.assign(ms_per_step=g["ns"] / 1e6 / per_rank, pct=100 * g["ns"] / total)
    out["order"] = out["precision"].map(PRECISIONS.index)
    return out.sort_values(["rank", "order"], ignore_index=True)[MIX_COLUMNS]


def left_in_fp32(ops: pd.DataFrame, precision: np.ndarray, time_ns: np.ndarray, keep: np.ndarray,
                 forward: np.ndarray, per_rank: int) -> pd.DataFrame:
    """The forward ops (``forward``: the forward phase, where autocast acts) that computed in fp32
    on a rank whose ``keep`` rows spent time in bf16/fp16: per op name and module, calls, ms per
    step, share of that rank's time and the user's lines. Per rank, costliest first; empty
    for a run with no low-precision time (no autocast: fp32 everywhere is not news)."""
    mixed = precision_mix(ops, precision, time_ns, keep, per_rank)
    ranks = mixed.loc[mixed["precision"].isin(LOWER), "rank"].unique()
    rank = ops["rank"].to_numpy()
    mine = keep & forward & (precision == "fp32") & np.isin(rank, ranks) & (time_ns > 0)
    if not mine.any():
        return pd.DataFrame(columns=FP32_COLUMNS)
    totals = pd.Series(time_ns[keep]).groupby(rank[keep]).sum()
    df = pd.DataFrame({"rank": rank[mine], "name": ops["name"].to_numpy()[mine].astype(str),
                       "module": ops["module"].to_numpy()[mine].astype(str), "ns": time_ns[mine],
                       "source": ops["user_source"].to_numpy()[mine].astype(str)})
    g = df.groupby(["rank", "name", "module"], sort=False).agg(
        calls=("ns", "size"), ns=("ns", "sum"), user_sources=("source", lambda s: sorted({x for x in s if x})))
    g = g.reset_index()
    g["ms_per_step"] = g["ns"] / 1e6 / per_rank
    g["pct"] = 100 * g["ns"] / g["rank"].map(totals)
    return g.sort_values(["rank", "ns"], ascending=[True, False], ignore_index=True)[FP32_COLUMNS]
