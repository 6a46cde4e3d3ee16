"""FLOPs and bytes per op, and what they make: FLOPs per step, achieved FLOP/s, MFU and roofline
positions per op name and per device kernel.

FLOPs are PyTorch's own: each op's recorded input shapes go through the formula
``torch.utils.flop_counter.flop_registry`` holds for it (matmuls, convolutions, attention), and
an op is counted where ``FlopCounterMode`` would count it. That mode sees ops at the Python
dispatch key: below a ``CompositeImplicitAutograd`` op (``aten::linear``, ``aten::matmul``,
``aten::scaled_dot_product_attention``), whose decomposition runs above that key, it sees the
ops it calls; an op with a kernel of its own it sees whole, and nothing that op calls
(``aten::addmm`` calling ``aten::addmm.out`` on a device counts once). So a registry op counts
when no enclosing op is such a whole op (``_dispatched``), as the capture's nesting says.

The capture records each argument's shape and dtype when it is a tensor, and nothing of the
others nor of the output (``collectors/_engine.py``). A formula that reads what was not
recorded (a convolution's ``transposed`` flag, its output's shape) cannot be evaluated: those
ops are FLOPs *unknown*, named, never counted as zero. Ops with a matmul-, convolution- or
attention-like name that the registry has no formula for (``aten::_scaled_dot_product_flash_
attention_for_cpu``: ``FlopCounterMode`` counts it as 0 too) are *uncounted*, also named.

Bytes of a counted op: what its tensor inputs hold (read) and what its output holds (written),
the output's shape and dtype from running the op on the meta device (PyTorch's own shape
functions) with the recorded inputs; NaN where that cannot be done (an argument without a
default was not recorded). A device kernel's FLOPs and bytes are those of the counted ops whose
work it ran (``analysis.device.correlation``; an op's share split evenly among its queued ops).

The formulas, the registry and which ops are composite are those of the torch installed where
this runs, not necessarily the capture's.
"""
from __future__ import annotations

import functools
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import has_ancestor, in_steps, name_mask
from neuron_prof.analysis.precision import op_precision
from neuron_prof.store.keys import backend_key

NONE, COUNTED, UNKNOWN, UNCOUNTED = 0, 1, 2, 3
"""``OpFlops.kind`` of an op: not a FLOP op, counted, a registry op whose FLOPs the recorded
arguments cannot give, a compute op the registry has no formula for."""

COMPUTE_NAME = re.compile(r"mm(?:_|$)|matmul|conv|attention|einsum|gemm")
"""An op named like this (after its namespace) computes; with no formula it is listed as uncounted."""
NOT_IN_REGISTRY = "not in torch.utils.flop_counter's registry (FlopCounterMode counts it as 0)"
MAX_FLOPS = 2**53
"""More FLOPs than this in one call (9e15: a 160k-wide square matmul) is a damaged run's shape, not
a step's work: unknown, so that sums of int64 FLOPs cannot wrap."""

STEP_COLUMNS = ["rank", "step", "flops", "bytes", "step_ms", "tflops"]
RANK_COLUMNS = ["rank", "steps", "flops_per_step", "bytes_per_step", "step_ms", "tflops", "unknown_per_step",
                "uncounted_per_step"]
OP_COLUMNS = ["rank", "name", "calls_per_step", "flops_per_step", "bytes_per_step", "ms_per_step", "tflops",
              "intensity"]
KERNEL_COLUMNS = ["rank", "device", "name", "kernels_per_step", "flops_per_step", "bytes_per_step", "ms_per_step",
                  "tflops", "intensity"]
UNKNOWN_COLUMNS = ["rank", "name", "calls_per_step", "reason"]


@dataclass(frozen=True)
class OpFlops:
    """Per row of ``run.ops`` (``op_flops``): its ``kind`` (``COUNTED``...), FLOPs (counted ops;
    0 elsewhere), bytes read and written (counted ops; NaN: unknown) and, for ``UNKNOWN`` and
    ``UNCOUNTED`` ops, why (a categorical, ``""`` elsewhere)."""

    kind: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    reason: pd.Categorical


# ---------------------------------------------------------------- torch's registry, and its formulas

@functools.cache
def _registry() -> dict[str, Any]:
    """``flop_registry`` by qualified op name (``aten::mm``): the OpOverloadPacket keys only
    (Triton kernels and higher-order ops are never ATen ops of a capture)."""
    import torch
    from torch.utils.flop_counter import flop_registry
    return {k._qualified_op_name: k for k in flop_registry if isinstance(k, torch._ops.OpOverloadPacket)}


@functools.cache
def _dispatched(name: str) -> bool:
    """Whether FlopCounterMode would see ``name`` whole (so nothing it calls): a registered
    operator none of whose overloads is ``CompositeImplicitAutograd``. Ranges
    (``autograd::engine::evaluate_function: ...``, ``Optimizer.step#...``) are not operators."""
    import torch
    try:
        schemas = torch._C._jit_get_schemas_for_operator(name)
    except Exception:  # noqa: BLE001 - not "namespace::name" (a range's name, a damaged run's)
        return False

    def composite(overload: str) -> bool:
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(f"{name}.{overload}" if overload else name,
                                                                   "CompositeImplicitAutograd")
        except RuntimeError:  # an overload only TorchScript knows (aten::add.t)
            return False

    return bool(schemas) and not any(composite(s.overload_name) for s in schemas)


class _Missing(Exception):
    """A formula used an argument the capture does not record (its message names it)."""


class _Unrecorded:
    """Stands for an argument the capture did not record (a non-tensor's value, the output):
    any use of it raises :class:`_Missing` naming it, so a formula that needs it fails loudly
    instead of counting something else. Identity tests (``is None``) are not uses."""

    def __init__(self, what: str) -> None:
        self.what = what

    def _use(self, *args: Any, **kwargs: Any) -> Any:
        raise _Missing(self.what)

    __bool__ = __len__ = __iter__ = __getitem__ = __index__ = __int__ = __float__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = _use
    __lt__ = __le__ = __gt__ = __ge__ = _use

    def __getattr__(self, attr: str) -> Any:  # only attributes it lacks: a shape's, a tensor's
        raise _Missing(self.what)


def _dtype(name: str) -> Any:
    """The torch dtype a capture spells ``name`` (``float32``), None if it is not one."""
    import torch
    d = getattr(torch, name, None) if re.fullmatch(r"[a-z][a-z0-9_]*", name) else None
    return d if isinstance(d, torch.dtype) else None


def _meta(shape: Any, dtype_text: str) -> Any:
    """The recorded tensor (or tensor list) as meta tensors; None if the entry is not one."""
    import torch
    if not dtype_text or not isinstance(shape, list):
        return None
    if all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        dtype = _dtype(dtype_text)
        return None if dtype is None else torch.empty(shape, dtype=dtype, device="meta")
    if all(isinstance(s, list) for s in shape):
        names = dtype_text.split("|")
        names = names if len(names) == len(shape) else [names[0]] * len(shape)
        items = [_meta(s, d) for s, d in zip(shape, names)]
        return None if any(t is None for t in items) else items
    return None


def _tensors(value: Any) -> list:
    """The tensors in an op's output (a tensor, or tuples and lists of them)."""
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _tensor_typed(arg: Any) -> bool:
    """Whether a schema argument takes tensors (``Tensor``, ``Optional[Tensor]``, ``List[Tensor]``)."""
    return "Tensor" in str(arg.type)


def _schema(packet: Any, values: list) -> Any:
    """The overload of ``packet`` the recorded arguments fit: a tensor where the schema has one,
    no more arguments than it takes (the default overload first); None if none fits."""
    for overload in sorted(packet.overloads(), key=lambda o: o != "default"):
        schema = getattr(packet, overload)._schema
        args = schema.arguments
        if len(values) <= len(args) and all(v is None or _tensor_typed(a) for v, a in zip(values, args)):
            return getattr(packet, overload), schema
    return None


def _arguments(values: list, schema: Any) -> tuple[list, dict[str, Any], dict[str, Any] | None]:
    """The call ``FlopCounterMode`` saw, rebuilt from the recorded ``values`` (meta tensors, None
    where no tensor was recorded): positional and keyword-only arguments as the ``schema`` has
    them (every argument: the capture leaves trailing non-tensors out), a tensor argument not
    recorded being None and any other an :class:`_Unrecorded`; and the keyword arguments to run
    the op with on the meta device, None when an argument it needs was not recorded. Without a
    schema, the recorded values in order, and no run."""
    if schema is None:
        return [v if v is not None else _Unrecorded(f"argument {i} (its value is not recorded)")
                for i, v in enumerate(values)], {}, None
    args: list = []
    kwargs: dict[str, Any] = {}
    call: dict[str, Any] | None = {}
    for i, arg in enumerate(schema.arguments):
        value = values[i] if i < len(values) else None
        if value is None and not _tensor_typed(arg):
            value = _Unrecorded(f"argument {arg.name!r} (not a tensor: its value is not recorded)")
            if not arg.has_default_value():
                call = None
        elif call is not None:
            call[arg.name] = value
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs, call


def _evaluate(name: str, shapes_text: str, dtypes_text: str) -> tuple[int, int, float, str]:
    """(kind, FLOPs, bytes, reason) of one registry op's recorded call."""
    from torch.utils.flop_counter import flop_registry
    packet = _registry()[name]
    if not shapes_text:
        return UNKNOWN, 0, math.nan, "no shapes were recorded (torch.profiler records them with record_shapes=True)"
    try:
        shapes = json.loads(shapes_text)
        dtypes = dtypes_text.split(",") if dtypes_text else []  # dtype names hold no commas
        if not isinstance(shapes, list) or len(dtypes) != len(shapes):
            raise ValueError
        values = [_meta(s, d.strip()) for s, d in zip(shapes, dtypes)]
    except (ValueError, TypeError, RuntimeError):  # not JSON, nested too deep, sizes torch cannot hold
        return UNKNOWN, 0, math.nan, (f"the recorded shapes {shapes_text[:80]!r} and dtypes {dtypes_text[:80]!r} are "
                                      "not concrete tensors")
    found = _schema(packet, values)
    args, kwargs, call = _arguments(values, found[1] if found else None)
    outs = [v for v, a in zip(values, found[1].arguments) if a.is_out] if found else []
    read = sum(_nbytes(v) for v in values) - sum(_nbytes(v) for v in outs)
    out: Any = _Unrecorded("the output (its shape is not recorded)")
    written = sum(_nbytes(v) for v in outs) or math.nan
    if call is not None:
        try:
            out = found[0](**call)  # PyTorch's own shape function, on the meta device
            written = _nbytes(out)
        except Exception:  # noqa: BLE001 - shapes the op rejects: the output stays unknown
            pass
    try:
        flops = flop_registry[packet](*args, **kwargs, out_val=out)
    except _Missing as missing:
        return UNKNOWN, 0, math.nan, f"its FLOP formula needs {missing}"
    except Exception as exc:  # noqa: BLE001 - a run is untrusted: shapes no formula accepts
        return UNKNOWN, 0, math.nan, f"its FLOP formula failed on the recorded shapes ({type(exc).__name__})"
    if not 0 <= flops <= MAX_FLOPS:
        return UNKNOWN, 0, math.nan, f"its FLOP formula gives {flops:.3g} for the recorded shapes"
    return COUNTED, int(flops), read + written, ""


def op_flops(ops: pd.DataFrame, parent: np.ndarray) -> OpFlops:
    """Each op's FLOPs and bytes, counted as ``FlopCounterMode`` counts (module docstring);
    ``parent``: ``analysis.ops.parent_index(ops)``. Formulas run once per distinct (name, shapes,
    dtypes) of the registry ops."""
    n = len(ops)
    kind = np.zeros(n, np.int8)
    flops = np.zeros(n, np.int64)
    nbytes = np.full(n, np.nan)
    reason_code = np.full(n, -1, np.int64)
    reasons: list[str] = []
    if not n:
        return OpFlops(kind, flops, nbytes, pd.Categorical.from_codes(reason_code, reasons))
    registry = _registry()
    depth = int(ops["depth"].to_numpy().max(initial=0))
    outermost = ~has_ancestor(parent, name_mask(ops, _dispatched), depth)
    in_registry = name_mask(ops, lambda x: x in registry) & outermost
    compute = name_mask(ops, lambda x: "::" in x and x not in registry and _dispatched(x)
                        and bool(COMPUTE_NAME.search(x.rsplit("::", 1)[1]))) & outermost
    rows = np.flatnonzero(in_registry)
    if len(rows):
        sub = ops.iloc[rows]
        codes, signatures = pd.MultiIndex.from_arrays(
            [sub["name"].astype(str), sub["shapes"].astype(str), sub["dtypes"].astype(str)]).factorize()
        found = [_evaluate(*sig) for sig in signatures]
        k = np.array([f[0] for f in found], np.int8)
        kind[rows] = k[codes]
        flops[rows] = np.array([f[1] for f in found], np.int64)[codes]
        nbytes[rows] = np.array([f[2] for f in found], np.float64)[codes]
        why = [f[3] for f in found]
        reasons = sorted({w for w in why if w})
        code_of = np.array([reasons.index(w) if w else -1 for w in why], np.int64)
        reason_code[rows] = code_of[codes]
    if compute.any():
        kind[compute] = UNCOUNTED
        reasons.append(NOT_IN_REGISTRY)
        reason_code[compute] = len(reasons) - 1
    return OpFlops(kind, flops, nbytes, pd.Categorical.from_codes(reason_code, reasons))


# ---------------------------------------------------------------- per step, op name, kernel

KNOWN_BYTES = {"bytes": ("bytes", "sum"), "bytes_unknown": ("bytes_unknown", "any")}
"""Named aggregations of byte counts over rows ``_unknown_marked``; ``_known_bytes`` finishes them."""


def _unknown_marked(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``bytes_unknown``: whether a row's byte count is unknown (NaN)."""
    return df.assign(bytes_unknown=df["bytes"].isna())


def _known_bytes(g: pd.DataFrame) -> pd.DataFrame:
    """Grouped rows' byte sums (``KNOWN_BYTES``), NaN where any row's is unknown: a partial sum
    would read as the whole. Vectorized: a Python function per group took 27 s over 200k kernels."""
    g["bytes"] = g["bytes"].mask(g.pop("bytes_unknown").astype(bool))
    return g


def flop_precision(ops: pd.DataFrame, f: OpFlops, keep: np.ndarray) -> str:
    """The precision (``analysis.precision.PRECISIONS``) most of the ``keep`` ops' FLOPs were
    computed in: which of a device's peaks they are measured against. ``"fp32"`` when none."""
    rows = np.flatnonzero(keep & (f.kind == COUNTED))
    if not len(rows):
        return "fp32"
    by = pd.Series(f.flops[rows].astype(np.float64)).groupby(op_precision(ops.iloc[rows])).sum()
    return str(by.idxmax())


def step_flops(ops: pd.DataFrame, f: OpFlops, keep: np.ndarray, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step of ``steps`` (``step_kinds`` rows: the basis steps): the FLOPs and bytes
    of its ``keep`` ops, its wall time and the FLOP/s achieved over it (TFLOP/s)."""
    if steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    mine = keep & (f.kind == COUNTED)
    df = pd.DataFrame({"rank": ops["rank"].to_numpy()[mine], "step": ops["step"].to_numpy()[mine],
                       "flops": f.flops[mine], "bytes": f.bytes[mine]})
    g = _known_bytes(_unknown_marked(df).groupby(["rank", "step"]).agg(flops=("flops", "sum"), **KNOWN_BYTES))
    out = steps[["rank", "step", "dur"]].join(g, on=["rank", "step"])
    none = out["flops"].isna()  # no counted op: no FLOPs, no bytes (NaN bytes: some op's are unknown)
    out["flops"] = out["flops"].fillna(0).astype(np.int64)
    out["bytes"] = out["bytes"].mask(none, 0.0)
    out["step_ms"] = out["dur"] / 1e6
    out["tflops"] = out["flops"] / (out["dur"] / 1e9) / 1e12
    return out.sort_values(["rank", "step"], ignore_index=True)[STEP_COLUMNS]


def rank_flops(step_rows: pd.DataFrame, ops: pd.DataFrame, f: OpFlops, keep: np.ndarray) -> pd.DataFrame:
    """Per rank, means over its basis steps (``step_flops`` rows): FLOPs and bytes per step, step
    time, achieved TFLOP/s (the mean FLOPs over the mean step time), and the ``keep`` ops per step
    whose FLOPs are unknown or uncounted (the FLOPs are a lower bound where they are not 0)."""
    if step_rows.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    g = _known_bytes(_unknown_marked(step_rows).groupby("rank").agg(
        steps=("step", "size"), flops=("flops", "sum"), step_ms=("step_ms", "mean"), **KNOWN_BYTES))
    left_out = pd.DataFrame({"rank": ops["rank"].to_numpy()[keep], "unknown": f.kind[keep] == UNKNOWN,
                             "uncounted": f.kind[keep] == UNCOUNTED}).groupby("rank").sum()
    left_out = left_out.reindex(g.index, fill_value=0)
    per_step = g["flops"] / g["steps"]
    return pd.DataFrame({"rank": g.index, "steps": g["steps"], "flops_per_step": per_step,
                         "bytes_per_step": g["bytes"] / g["steps"], "step_ms": g["step_ms"],
                         "tflops": per_step / (g["step_ms"] / 1e3) / 1e12,
                         "unknown_per_step": left_out["unknown"] / g["steps"],
                         "uncounted_per_step": left_out["uncounted"] / g["steps"]}).reset_index(drop=True)[RANK_COLUMNS]


def _rates(out: pd.DataFrame, ns: pd.Series) -> pd.DataFrame:
    """``tflops`` (FLOPs over ``ns``) and ``intensity`` (FLOPs per byte) of grouped rows."""
    out["tflops"] = (out["flops_per_step"] / (ns / 1e9) / 1e12).where(ns > 0)
    out["intensity"] = (out["flops_per_step"] / out["bytes_per_step"]).where(out["bytes_per_step"] > 0)
    return out


def op_efficiency(ops: pd.DataFrame, f: OpFlops, run_ns: np.ndarray, keep: np.ndarray, per_rank: int) -> pd.DataFrame:
    """Per rank and op name of the counted ``keep`` ops: calls, FLOPs, bytes and time per step
    (``per_rank`` steps), achieved TFLOP/s and FLOPs per byte. The time is each op's (``run_ns``:
    its run time, what it ran inside it included, or on a device the time of the kernels that ran
    its work: ``op_device_ns``). Bytes NaN where some call's are unknown. Most FLOPs first."""
    mine = keep & (f.kind == COUNTED)
    if not per_rank or not mine.any():
        return pd.DataFrame(columns=OP_COLUMNS)
    df = pd.DataFrame({"rank": ops["rank"].to_numpy()[mine], "name": ops["name"].to_numpy()[mine].astype(str),
                       "flops": f.flops[mine].astype(np.float64), "bytes": f.bytes[mine], "ns": run_ns[mine]})
    g = _known_bytes(_unknown_marked(df).groupby(["rank", "name"]).agg(
        calls=("ns", "size"), flops=("flops", "sum"), ns=("ns", "sum"), **KNOWN_BYTES)).reset_index()
    out = pd.DataFrame({"rank": g["rank"], "name": g["name"], "calls_per_step": g["calls"] / per_rank,
                        "flops_per_step": g["flops"] / per_rank, "bytes_per_step": g["bytes"] / per_rank,
                        "ms_per_step": g["ns"] / 1e6 / per_rank})
    out = _rates(out, g["ns"] / per_rank)
    return out.sort_values(["rank", "flops_per_step"], ascending=[True, False], ignore_index=True)[OP_COLUMNS]


def _owner(f: OpFlops, parent: np.ndarray, depth: int) -> np.ndarray:
    """Per op: the row of the counted op it is or lies in (-1: none), whose FLOPs its work is."""
    owner = np.where(f.kind == COUNTED, np.arange(len(parent)), -1)
    up = np.maximum(parent, 0)
    for _ in range(depth):
        inherit = (owner < 0) & (parent >= 0)
        if not inherit.any():
            break
        owner = np.where(inherit, owner[up], owner)
    return owner


def op_device_ns(corr: pd.DataFrame, f: OpFlops, parent: np.ndarray, depth: int, n_ops: int) -> np.ndarray:
    """Per op row, the device time of its counted work (``corr``: ``analysis.device.correlation``):
    each kernel's duration shared among the counted ops whose queued work it ran, in proportion to
    their FLOPs in it (equally where it ran none); -1 for an op whose work ran in no captured
    kernel. On an asynchronous device an op's own (host) time is its launch, not its work: its
    FLOP/s are rated on this instead."""
    out = np.full(n_ops, -1.0)
    if corr.empty or not n_ops:
        return out
    owner = _owner(f, parent, depth)
    op = corr["op_index"].to_numpy(np.int64)
    ran = (corr["kernel"].to_numpy() >= 0) & (op >= 0)
    ran[ran] = owner[op[ran]] >= 0
    c = corr[ran]
    if c.empty:
        return out
    own = owner[c["op_index"].to_numpy(np.int64)]
    share = pd.Series(own).groupby(own).transform("size").to_numpy()
    weight = f.flops[own].astype(np.float64) / share
    key = backend_key(c["rank"].to_numpy(), c["kernel"].to_numpy())
    per_kernel = pd.DataFrame({"key": key, "w": weight})
    total = per_kernel.groupby("key")["w"].transform("sum").to_numpy()
    count = per_kernel.groupby("key")["w"].transform("size").to_numpy()
    part = np.where(total > 0, weight / np.where(total > 0, total, 1), 1.0 / count)
    ns = pd.Series(c["kernel_dur"].to_numpy(np.float64) * part).groupby(own).sum()
    out[ns.index.to_numpy()] = ns.to_numpy()
    return out


def kernel_efficiency(corr: pd.DataFrame, f: OpFlops, parent: np.ndarray, depth: int, basis: pd.DataFrame,
                      per_rank: int) -> pd.DataFrame:
    """Per rank, device and kernel name, the kernels of the ``basis`` steps that ran work of
    counted ops (``corr``: ``analysis.device.correlation``): kernels, FLOPs, bytes and device time
    per step, achieved TFLOP/s and FLOPs per byte. A counted op's FLOPs and bytes are split evenly
    among the ops it queued (a matmul that queued its ``addmm.out``); a kernel's are the sum of
    its shares. Per rank, most FLOPs first (every kernel name: the report cuts the list)."""
    if corr.empty or not per_rank:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    owner = _owner(f, parent, depth)
    op = corr["op_index"].to_numpy(np.int64)
    ran = (corr["kernel"].to_numpy() >= 0) & (op >= 0)
    ran[ran] = owner[op[ran]] >= 0
    c = corr[ran & in_steps(corr, basis)]
    if c.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    c = c.assign(owner=owner[c["op_index"].to_numpy(np.int64)])
    share = c.groupby("owner")["owner"].transform("size").to_numpy()
    own = c["owner"].to_numpy()
    c = c.assign(flops=f.flops[own] / share, bytes=f.bytes[own] / share,
                 key=backend_key(c["rank"].to_numpy(), c["kernel"].to_numpy()))
    per_kernel = _known_bytes(_unknown_marked(c).groupby("key").agg(
        rank=("rank", "first"), device=("device", "first"), name=("kernel_name", "first"),
        dur=("kernel_dur", "first"), flops=("flops", "sum"), **KNOWN_BYTES))
    per_kernel["device"] = per_kernel["device"].astype(str)
    per_kernel["name"] = per_kernel["name"].astype(str)
    g = _known_bytes(_unknown_marked(per_kernel).groupby(["rank", "device", "name"]).agg(
        kernels=("dur", "size"), flops=("flops", "sum"), ns=("dur", "sum"), **KNOWN_BYTES)).reset_index()
    out = pd.DataFrame({"rank": g["rank"], "device": g["device"], "name": g["name"],
                        "kernels_per_step": g["kernels"] / per_rank, "flops_per_step": g["flops"] / per_rank,
                        "bytes_per_step": g["bytes"] / per_rank, "ms_per_step": g["ns"] / 1e6 / per_rank})
    out = _rates(out, g["ns"] / per_rank)
    return out.sort_values(["rank", "flops_per_step"], ascending=[True, False], ignore_index=True)[KERNEL_COLUMNS]


def unknown_ops(ops: pd.DataFrame, f: OpFlops, keep: np.ndarray, per_rank: int) -> pd.DataFrame:
    """Per rank, op name and reason, the ``keep`` ops whose FLOPs are not in the figures
    (``UNKNOWN`` and ``UNCOUNTED``): calls per step, most first."""
    mine = keep & np.isin(f.kind, (UNKNOWN, UNCOUNTED))
    if not per_rank or not mine.any():
        return pd.DataFrame(columns=UNKNOWN_COLUMNS)
    df = pd.DataFrame({"rank": ops["rank"].to_numpy()[mine], "name": ops["name"].to_numpy()[mine].astype(str),
                       "reason": np.asarray(f.reason)[mine].astype(str)})
    g = df.groupby(["rank", "name", "reason"]).size().rename("calls").reset_index()
    g["calls_per_step"] = g["calls"] / per_rank
    return g.sort_values(["rank", "calls"], ascending=[True, False], ignore_index=True)[UNKNOWN_COLUMNS]


# ---------------------------------------------------------------- peaks, MFU, roofline

class DevicePeak(NamedTuple):
    """A device's published peaks: dense TFLOP/s in bf16/fp16 and in fp32, memory GB/s (None: no
    published figure), and the page that publishes them."""
    bf16_tflops: float
    fp32_tflops: float
    gbps: float | None
    source: str


_TRN1 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html"
_TRN2 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html"

DEVICE_PEAKS: dict[str, DevicePeak] = {
    # "Two NeuronCore-v2 delivering ... 190 FP16/BF16/cFP8/TF32 TFLOPS, and 47.5 FP32 TFLOP";
    # "32 GiB of device memory ..., with 820 GiB/sec of bandwidth" (earlier editions: 820 GB/sec)
    "trainium1": DevicePeak(190.0, 47.5, 820 * 2**30 / 1e9, _TRN1),
    # "Eight NeuronCore-v3 that collectively deliver ... 667 BF16/FP16/TF32 TFLOPS ... 181 FP32 TFLOPS"
    # (dense; an earlier edition said 655); "96 GiB of device memory with 2.9 TB/sec of bandwidth"
    "trainium2": DevicePeak(667.0, 181.0, 2900.0, _TRN2),
    # one NeuronCore: the chip's compute over its cores, as the pages give the chip's as its cores'
    # together; no bandwidth: the cores share the chip's memory and no per-core figure is published
    "trainium1-core": DevicePeak(190.0 / 2, 47.5 / 2, None, _TRN1),
    "trainium2-core": DevicePeak(667.0 / 8, 181.0 / 8, None, _TRN2),
}
"""Known devices' peaks, by the name ``report --peak-device`` takes: a run records its device's
type (``neuron``), not its chip, so the table is chosen by name (docs/report.md lists it)."""

NO_PEAK = "none known"
"""The peak's source where no figure is known: what the summary holds (a peak is the reader's)."""
CALIBRATION_N, CALIBRATION_MIB = 1024, 64
CALIBRATION = "measured on this machine at read time: a {n}x{n} {dtype} matmul and a {mib} MiB copy"


@functools.cache
def calibrate_cpu(precision: str = "fp32", n: int = CALIBRATION_N, mib: int = CALIBRATION_MIB,
                  repeats: int = 5) -> tuple[float, float]:
    """(TFLOP/s, GB/s) this machine's CPU reaches with torch, as it is set up now: the best of
    ``repeats`` ``n``x``n`` matmuls in ``precision``'s dtype, and of ``mib`` MiB copies (read and
    written). A short measurement (about 0.1 s), not a datasheet: a loaded machine reads lower.
    Measured once per process."""
    import torch
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}.get(precision, torch.float32)
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    src = torch.empty(mib << 18)  # float32: 4 bytes each
    dst = torch.empty_like(src)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    matmul_s = best(lambda: torch.mm(a, b))
    copy_s = best(lambda: dst.copy_(src))
    return 2 * n**3 / matmul_s / 1e12, 2 * src.numel() * src.element_size() / copy_s / 1e9


def mfu_pct(tflops: float | None, peak_tflops: float | None) -> float | None:
    """Achieved over peak FLOP/s, in %; None when either is unknown."""
    if tflops is None or not peak_tflops:
        return None
    return 100 * tflops / peak_tflops


def roofline(intensity: float | None, tflops: float | None, peak_tflops: float | None,
             peak_gbps: float | None) -> tuple[str | None, float | None]:
    """Where a point (FLOPs per byte, achieved TFLOP/s) lies under the roofline of the peaks:
    ``"compute"``-bound at or past the ridge point (peak FLOP/s over peak bytes/s), else
    ``"memory"``-bound; and its achieved FLOP/s in % of the roof there (the lower of the peak
    FLOP/s and intensity x bandwidth). (None, None) without both peaks or an intensity."""
    if intensity is None or tflops is None or not peak_tflops or not peak_gbps or not intensity > 0:
        return None, None
    ridge = peak_tflops * 1e12 / (peak_gbps * 1e9)
    roof = min(peak_tflops * 1e12, intensity * peak_gbps * 1e9)
    return ("compute" if intensity >= ridge else "memory"), 100 * tflops * 1e12 / roof


@dataclass(frozen=True)
class PeakRequest:
    """The peaks a reader asks efficiency to be read against (``report``'s ``--peak-tflops``,
    ``--peak-gbps``, ``--peak-device``, ``--calibrate``; :func:`resolve_peak` takes each figure from
    the first of them that has it). The default asks for none: the summary stored in the run is
    the one of this request."""

    tflops: float | None = None
    gbps: float | None = None
    device: str | None = None
    calibrate: bool = False


def _plain(values: pd.Series) -> list[float | None]:
    """``values`` as Python floats, NaN as None: what :func:`mfu_pct` and :func:`roofline` take."""
    return [None if pd.isna(v) else float(v) for v in values]


def with_mfu(rows: pd.DataFrame, peak_tflops: float | None) -> pd.DataFrame:
    """``rows`` (``rank_flops`` or ``step_flops``) with ``mfu_pct`` against ``peak_tflops``."""
    return rows.assign(mfu_pct=[mfu_pct(t, peak_tflops) for t in _plain(rows["tflops"])])


def with_roofline(rows: pd.DataFrame, peak_tflops: float | None, peak_gbps: float | None) -> pd.DataFrame:
    """``rows`` (``op_efficiency`` or ``kernel_efficiency``) with each row's ``bound`` and
    ``roof_pct`` under the roofline of the peaks (:func:`roofline`)."""
    points = [roofline(i, t, peak_tflops, peak_gbps) for i, t in zip(_plain(rows["intensity"]), _plain(rows["tflops"]))]
    return rows.assign(bound=pd.Series([b for b, _ in points], index=rows.index, dtype=object),
                       roof_pct=pd.Series([p for _, p in points], index=rows.index, dtype=object))


def resolve_peak(precision: str, run_device: str | None, tflops: float | None = None, gbps: float | None = None,
                 device: str | None = None, calibrate: bool = False) -> tuple[float | None, float | None, str]:
    """(TFLOP/s, GB/s, where they came from) to measure a run against, each figure from the first
    source that has it: given (``tflops``, ``gbps``); the ``device`` entry of ``DEVICE_PEAKS`` (its
    bf16/fp16 figure for FLOPs mostly in bf16 or fp16, else its fp32 one); for a CPU run
    (``run_device`` ``"cpu"``) with ``calibrate``, :func:`calibrate_cpu` in ``precision``. None
    where none has it."""
    origin: dict[str, str] = {}
    if tflops is not None:
        origin["TFLOP/s"] = "given"
    if gbps is not None:
        origin["GB/s"] = "given"
    if device is not None:
        entry = DEVICE_PEAKS[device]
        which = "bf16" if precision in ("bf16", "fp16") else "fp32"
        took = []
        if tflops is None:
            tflops = entry.fp32_tflops if which == "fp32" else entry.bf16_tflops
            took.append("TFLOP/s")
        if gbps is None and entry.gbps is not None:
            gbps = entry.gbps
            took.append("GB/s")
        what = " and ".join({"TFLOP/s": f"{which} peak", "GB/s": "bandwidth"}[k] for k in took)
        origin.update({k: f"{device}'s published {what}, {entry.source}" for k in took})
    if calibrate and run_device == "cpu" and (tflops is None or gbps is None):
        measured_tflops, measured_gbps = calibrate_cpu(precision)
        how = CALIBRATION.format(n=CALIBRATION_N, dtype=precision, mib=CALIBRATION_MIB)
        if tflops is None:
            tflops, origin["TFLOP/s"] = measured_tflops, how
        if gbps is None:
            gbps, origin["GB/s"] = measured_gbps, how
    origins = set(origin.values())
    source = (next(iter(origins)) if len(origins) == 1 else "; ".join(f"{k}: {v}" for k, v in origin.items())
              if origins else NO_PEAK)
    return tflops, gbps, source
