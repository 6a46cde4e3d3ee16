"""A torch.profiler trace (Kineto's Chrome JSON, ``export_chrome_trace``; gzip too) as a run, or a
folder of them, one per rank of a distributed job, as one run.

The usual migration baseline is a torch.profiler trace from the existing fleet: imported, it
opens in every reader and compares (``neuron-prof compare``) with a neuron_prof run of the same
job on the new device. What the trace holds becomes the run's tables:

* ``cpu_op`` and ``user_annotation`` events (``record_function`` ranges, the optimizer's) are
  ``ops``, with their nesting depth, input shapes and dtypes (``record_shapes``), autograd sequence
  number, ``bwd`` for what ran inside the autograd engine's ``evaluate_function`` ranges, the
  module path from the enclosing ``nn.Module: Class_i`` ranges (``with_modules``; names are
  torch.profiler's, ``Sequential_0.Linear_1``, not neuron_prof's attribute paths) and the Python
  stack from the enclosing ``python_function`` events (``with_stack``; torch's own frames left out);
* ``ProfilerStep#N`` ranges are the ``steps`` (N, as torch.profiler numbers them: iteration N);
* ``[memory]`` events (``profile_memory``) are ``memory_events``, each charged to the innermost op
  open on its thread, a free matched to its allocation by address;
* the device's activity (kernels, copies and sets, runtime and driver calls, their flows, stream
  waits) is the device tables, as a capture's is (``neuron_prof.backends.device_activity``), the device
  named as the trace names it (``device_backend``: its device tracks' labels, ``cuda``, ``xpu``);
* a top-level ``torch_version`` (torch.profiler writes none; a job may add it) is the run's;
* ``distributedInfo`` is the rank, the world size and the process groups (``groups``); the
  collectives are ``collectives`` rows: from ``record_param_comms`` (collective, group, sequence
  number, element counts and dtype, as NCCL traces hold them), else from the ``c10d::`` ops, whose
  sequence number in their group is then their order on the rank.

A folder's traces are one run, each its ``distributedInfo`` rank (else its place in name order),
on one clock: each trace's times plus its ``baseTimeNanoseconds``, less the earliest trace's. What
a trace holds that no table takes is counted by what it is (``Imported.left_out``).
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import socket
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import numpy as np

from neuron_prof.backends.device_activity import DeviceTables, device_tables, trace_ns
from neuron_prof.errors import NeuronProfError
from neuron_prof.importers.imported import ImportedRun, check_new, number
from neuron_prof.store.interner import Interner
from neuron_prof.store.safefile import read_whole
from neuron_prof.store.schema import COLLECTIVE_STATUS, MEMORY_KINDS

MAX_TRACE_BYTES = 8 << 30
TRACE_SUFFIXES = (".json", ".json.gz")
"""What a folder's trace files are named (``trace.json``, ``rank0.pt.trace.json.gz``)."""
_PY_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
           "c10::complex<double>": "complex128"}
_NOT_TENSORS = ("", "Scalar", "ScalarList", "TensorList", "GenericList", "None")
_ENGINE = "autograd::engine::evaluate_function"
_DEVICE_LABEL = re.compile(r"^(\S+) \d+$")  # a device track's label: "neuron 0", "GPU 0"
_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, a [memory] event's "Device Type"
_PRIVATEUSE1_NAME = "privateuseone"  # PyTorch's name for a PrivateUse1 backend not renamed
_COLLECTIVE_KINDS = {  # c10d op (its name less "c10d::") or record_param_comms's "Collective name" -> kind
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
    "allgather_base": "all_gather", "allgather_coalesced": "all_gather", "allgather_into_tensor": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce": "reduce", "broadcast": "broadcast",
    "gather": "gather", "scatter": "scatter", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all": "all_to_all", "barrier": "barrier", "monitored_barrier": "barrier", "send": "send", "recv": "recv",
    "recv_any_source": "recv", "all_reduce": "all_reduce", "all_gather": "all_gather"}
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
                "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                "int8": 1, "uint8": 1, "bool": 1}


@dataclass
class ImportedRank:
    """What an import wrote of one rank (one trace)."""

    rank: int
    source: Path
    ops: int
    steps: int
    memory_events: int
    device_kernels: int
    device_copies: int
    collectives: int


@dataclass
class Imported:
    """What an import wrote: the run directory, its device and world size, each rank's counts,
    and what the traces held that no table takes (by what it is, over the ranks)."""

    run_dir: Path
    device: str
    world_size: int
    ranks: list[ImportedRank]
    left_out: dict[str, int] = field(default_factory=dict)


def read_trace(path: Path) -> dict[str, Any]:
    """The trace's JSON object (numbers with decimals read exactly); a one-line NeuronProfError
    naming the file for anything else."""
    try:  # a path the user typed: a link of theirs is followed
        data = read_whole(path, MAX_TRACE_BYTES, "is it a torch.profiler trace (export_chrome_trace)?",
                          follow_links=True)
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: no such file; give the trace prof.export_chrome_trace() wrote") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise NeuronProfError(f"{path}: not a readable gzip file ({exc}); export the trace again") from None
    try:
        doc = json.loads(data, parse_float=Decimal)
    except (ValueError, RecursionError) as exc:
        raise NeuronProfError(f"{path}: not JSON ({str(exc)[:80]}); a torch.profiler trace is "
                              "prof.export_chrome_trace(\"trace.json\")'s output") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NeuronProfError(f"{path}: JSON without a traceEvents list: not a torch.profiler (Kineto) trace")
    return doc


def trace_files(folder: Path) -> list[Path]:
    """A folder's torch.profiler traces (``TRACE_SUFFIXES``), in name order."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def _ns(us: Any) -> int:
    ns = trace_ns(us)
    if ns is None:
        raise ValueError(f"not a time: {us!r}")
    return ns


def _args(e: dict[str, Any]) -> dict[str, Any]:
    args = e.get("args")
    return args if isinstance(args, dict) else {}


def _frame(name: str) -> tuple[str, str, int] | None:
    m = _PY_FRAME.match(name)
    if m is None or m.group(1).startswith(("torch/", "<")):
        return None
    return m.group(1), m.group(3), int(m.group(2))


def _inputs(args: dict[str, Any]) -> tuple[str, str]:
    """(shapes, dtypes) of the op's tensor inputs, in neuron_prof's text form."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return "", ""
    keep = [(d, t) for d, t in zip(dims, types) if isinstance(t, str) and t not in _NOT_TENSORS]
    shapes = "[" + ", ".join(str(list(d)) if isinstance(d, list) else "[]" for d, _ in keep) + "]" if keep else ""
    return shapes, ",".join(_DTYPES.get(t, t) for _, t in keep)


def device_backend(doc: dict[str, Any]) -> str:
    """The device a trace's job ran on, as the trace names it. Kineto labels a device's track
    with the name its backend's profiler gives it (``neuron 0``; ``GPU 0`` when the backend names
    none), whether or not the backend reported any activity (OpenReg's plugin reports none, many
    backends kernels only), so a label names the device; then CUDA's, XPU's or MTIA's runtime
    activity; ``profile_memory``'s allocations on a device (a PrivateUse1 one the trace never
    names is ``privateuseone``, PyTorch's name for it, never ``cpu``); ``device`` for activity
    no label names; ``cpu`` only when the trace holds nothing of a device."""
    cats, labels, memory = set(), [], set()
    for e in doc["traceEvents"]:
        if not isinstance(e, dict):
            continue
        cat = e.get("cat")
        if isinstance(cat, str):
            cats.add(cat)
        if e.get("ph") == "M" and e.get("name") == "process_labels":
            m = _DEVICE_LABEL.match(str(_args(e).get("labels", "")))
            if m and m.group(1) not in ("GPU", "CPU"):
                labels.append(m.group(1).lower())
        elif e.get("name") == "[memory]":
            memory.add(number(_args(e).get("Device Type"), 0))
    if labels:
        return labels[0]
    if cats & {"privateuse1_runtime", "privateuse1_driver"}:
        return _PRIVATEUSE1_NAME
    for prefix, name in (("cuda_", "cuda"), ("xpu_", "xpu"), ("mtia_", "mtia")):
        if any(c.startswith(prefix) for c in cats):
            return name
    kinds = sorted(memory - {0})
    if kinds:
        return _device_type(_PRIVATEUSE1 if _PRIVATEUSE1 in kinds else kinds[0], _PRIVATEUSE1_NAME)
    if cats & {"kernel", "gpu_memcpy", "gpu_memset"}:
        return "device"
    return "cpu"


def _device_type(kind: int, backend: str) -> str:
    """The name of a c10 ``DeviceType`` code other than the CPU's (``backend``: PrivateUse1's)."""
    return {1: "cuda", 12: "xpu", 19: "mtia", _PRIVATEUSE1: backend}.get(kind, f"device{kind}")


def torch_version(docs: list[dict[str, Any]]) -> str:
    """The torch version the traces carry, else ``unknown``: torch.profiler writes none of its own,
    so it is the top-level ``torch_version`` a job adds (``prof.add_metadata("torch_version",
    torch.__version__)``) that the report's header shows."""
    found = (d.get("torch_version") for d in docs)
    return next((v.strip() for v in found if isinstance(v, str) and v.strip()), "unknown")


def _memory_device(args: dict[str, Any], backend: str) -> str:
    kind, index = number(args.get("Device Type"), 0), number(args.get("Device Id"), 0)
    return "cpu" if kind == 0 else f"{_device_type(kind, backend)}:{max(index, 0)}"


class _Tables:
    """Rows of one rank, interned as the session interns them."""

    def __init__(self, backend: str) -> None:
        self.interner = Interner()
        self.backend = backend
        self.ops: dict[str, list] = {k: [] for k in ("ts", "dur", "tid", "name", "module", "stack", "shapes",
                                                     "dtypes", "devices", "seq", "fwd_tid", "bwd", "depth",
                                                     "recompute")}
        self.memory: dict[str, list] = {k: [] for k in ("ts", "alloc_ts", "addr", "bytes", "device", "tid", "op",
                                                        "top_op", "module", "stack", "shape", "dtype", "bwd",
                                                        "kind", "total_allocated", "total_reserved", "grad")}
        self.steps: dict[str, list] = {k: [] for k in ("step", "ts", "dur", "active", "complete")}
        self.collectives: dict[str, list] = {k: [] for k in (
            "ts", "dur", "done", "tid", "op", "call", "group", "seq", "count", "bytes", "out_bytes", "dtype", "peer",
            "async_op", "status", "module", "stack", "bwd")}
        self.threads: dict[int, str] = {}
        self.groups: list[dict[str, Any]] = []  # distributedInfo's process groups
        self.default_group = ""  # the job's default process group, for c10d ops
        self._issued: list[tuple[int, dict[str, Any]]] = []  # (ts, row) of each collective, any thread

    def collective(self, e: dict[str, Any], args: dict[str, Any], ts: int) -> None:
        """A collective's issue: a ``record_param_comms`` range (its args name the collective), or
        a ``c10d::`` op where the trace has no such range."""
        name = e["name"]
        if name == "record_param_comms":
            raw = str(args.get("Collective name", ""))
            group = str(args.get("Process Group Name", self.default_group))
        else:
            raw, group = name[len("c10d::"):], self.default_group
        kind = _COLLECTIVE_KINDS.get(raw.strip("_").removesuffix("_"))
        if kind is None:
            return
        dtype = str(args.get("dtype", ""))
        width = _DTYPE_BYTES.get(dtype, 0)
        n_in, n_out = number(args.get("In msg nelems"), 0), number(args.get("Out msg nelems"), -1)
        s = self.interner.string
        self._issued.append((ts, {
            "ts": ts, "dur": e["_dur"], "done": -1, "tid": e["_tid"], "op": s(kind),
            "call": s(name if name != "record_param_comms" else f"record_param_comms: {raw}"), "group": group,
            "seq": number(args.get("Seq"), -1), "count": n_in, "bytes": n_in * width,
            "out_bytes": n_out * width if n_out >= 0 else -1, "dtype": s(dtype),
            "peer": number(args.get("Src Rank", args.get("Dst Rank")), -1), "async_op": False,
            "status": COLLECTIVE_STATUS.index("unknown"), "module": e["_module"], "stack": e["_stack"],
            "bwd": bool(e["_bwd"]), "call_is_op": name != "record_param_comms"}))

    def finish_collectives(self) -> None:
        """The collectives in issue order (over threads); one without the trace's sequence number
        gets its order in its group on this rank (each rank issues a group's collectives in the
        same order: how they are matched across ranks). A ``c10d::`` op whose backend reported
        the collective inside it (a ``record_param_comms`` range on its thread) is that one
        collective, counted once."""
        reported: dict[int, list[int]] = {}  # thread -> times of its record_param_comms
        for ts, row in sorted(self._issued, key=lambda x: x[0]):
            if not row["call_is_op"]:
                reported.setdefault(row["tid"], []).append(ts)

        def inside(ts: int, row: dict[str, Any]) -> bool:
            times = reported.get(row["tid"], [])
            i = bisect.bisect_left(times, ts)
            return i < len(times) and times[i] <= ts + row["dur"]

        issued = [(ts, row) for ts, row in self._issued if not (row["call_is_op"] and inside(ts, row))]
        order: dict[str, int] = {}
        for _, row in sorted(issued, key=lambda x: x[0]):
            del row["call_is_op"]
            group = row["group"]
            if row["seq"] < 0:
                row["seq"] = order.get(group, 0)
            order[group] = row["seq"] + 1
            row["group"] = self.interner.string(group)
            for k, v in row.items():
                self.collectives[k].append(v)
        self._issued = []


def _walk_thread(events: list[dict[str, Any]], t: _Tables, alloc_ts: dict[tuple[str, int], int]) -> None:
    """One thread's events in time order, nested as they ran: each op with its ancestors."""
    s = t.interner.string
    # (ts, order, -dur): a range opens before an instant at the same time, an outer range first
    events.sort(key=lambda e: (e["_ts"], 0 if e["ph"] == "X" else 1, -e["_dur"]))
    open_: list[tuple[int, dict[str, Any]]] = []  # (end, event)
    for e in events:
        ts = e["_ts"]
        while open_ and open_[-1][0] <= ts and not (open_[-1][0] == ts and e["ph"] == "i"):
            open_.pop()
        ops = [x for _, x in open_ if x["_op"]]
        inner = ops[-1] if ops else None
        if e["ph"] == "i":  # a [memory] event, charged to the op open on its thread
            args = _args(e)
            device = _memory_device(args, t.backend)
            nbytes, addr = number(args.get("Bytes"), 0), number(args.get("Addr"), 0)
            if nbytes >= 0:
                alloc_ts[(device, addr)] = ts
            m = t.memory
            m["ts"].append(ts)
            m["alloc_ts"].append(ts if nbytes >= 0 else alloc_ts.pop((device, addr), -1))
            m["addr"].append(addr)
            m["bytes"].append(nbytes)
            m["device"].append(s(device))
            m["tid"].append(e["_tid"])
            m["op"].append(s(inner["name"]) if inner else 0)
            m["top_op"].append(s(ops[0]["name"]) if ops else 0)
            m["module"].append(inner["_module"] if inner else 0)
            m["stack"].append(inner["_stack"] if inner else 0)
            m["shape"].append(0)
            m["dtype"].append(0)
            m["bwd"].append(bool(inner and inner["_bwd"]))
            m["kind"].append(MEMORY_KINDS.index("alloc" if nbytes >= 0 else "free"))
            m["total_allocated"].append(number(args.get("Total Allocated"), 0))
            m["total_reserved"].append(number(args.get("Total Reserved"), 0))
            m["grad"].append(False)
            continue
        open_.append((ts + e["_dur"], e))
        if not e["_op"]:
            continue
        frames = [f for _, x in reversed(open_) if x.get("cat") == "python_function" and (f := _frame(x["name"]))]
        modules = [x["name"][len("nn.Module: "):] for _, x in open_ if x["name"].startswith("nn.Module: ")]
        e["_module"] = s(".".join(modules))
        e["_stack"] = t.interner.stack(frames)
        e["_bwd"] = any(x["name"].startswith(_ENGINE) for x in ops) or e["name"].startswith(_ENGINE)
        args = _args(e)
        shapes, dtypes = _inputs(args)
        o = t.ops
        o["ts"].append(ts)
        o["dur"].append(e["_dur"])
        o["tid"].append(e["_tid"])
        o["name"].append(s(e["name"]))
        o["module"].append(e["_module"])
        o["stack"].append(e["_stack"])
        o["shapes"].append(s(shapes))
        o["dtypes"].append(s(dtypes))
        o["devices"].append(0)
        o["seq"].append(number(args.get("Sequence number"), -1))
        o["fwd_tid"].append(e["_tid"])
        o["bwd"].append(e["_bwd"])
        o["depth"].append(len(ops))
        o["recompute"].append(False)  # a Kineto trace does not say which ops checkpointing re-ran
        name = e["name"]
        if name == "record_param_comms" or (name.startswith("c10d::") and not any(
                x["name"].startswith("c10d::") for x in ops)):
            t.collective(e, args, ts)


def _tid(value: Any) -> int:
    tid = number(value, -1)
    return tid if tid >= 0 else zlib.crc32(str(value).encode())  # Kineto names some tracks ("Spans")


PHASES = ("reading", "nesting ops", "writing")
"""What ``import_trace`` reports to its ``progress`` callback, in order."""


@dataclass
class _Rank:
    """One trace, read: its rank, where it came from, its tables and device tables."""

    rank: int
    world_size: int
    source: Path
    doc: dict[str, Any]
    tables: _Tables
    device: DeviceTables
    base_ns: int


def import_trace(trace: str | os.PathLike, run_dir: str | os.PathLike,
                 progress: Callable[[str], None] = lambda phase: None) -> Imported:
    """Write the torch.profiler trace ``trace`` (or a folder of one trace per rank) into the new
    run ``run_dir``; ``progress`` is told each of ``PHASES`` as it begins."""
    trace, run_dir = Path(trace), Path(run_dir)
    check_new(run_dir)
    progress(PHASES[0])
    paths = trace_files(trace) if trace.is_dir() else [trace]
    if not paths:
        raise NeuronProfError(f"{trace}: no torch.profiler trace in it (*.json, *.json.gz) and no "
                              "dedicated_log_torch_trace_*.log (TORCH_TRACE's compile logs); give the folder the "
                              "job's ranks wrote either to")
    docs = [read_trace(p) for p in paths]
    bases = [d.get("baseTimeNanoseconds") for d in docs]
    bases = [b if type(b) is int and b >= 0 else 0 for b in bases]
    first = min(bases)
    progress(PHASES[1])
    ranks: dict[int, _Rank] = {}
    for index, (path, doc, base) in enumerate(zip(paths, docs, bases)):
        r = _read_rank(path, doc, index, len(paths), base - first)
        if r.rank in ranks:
            raise NeuronProfError(f"{path}: rank {r.rank} again (also {ranks[r.rank].source.name}); give a folder "
                                  "of one trace per rank of one job")
        ranks[r.rank] = r
    progress(PHASES[2])
    world = max(max(r.world_size for r in ranks.values()), max(ranks) + 1)
    devices = [device_backend(r.doc) for r in ranks.values()]
    device = next((d for d in devices if d != "cpu"), "cpu")
    run = ImportedRun(run_dir, trace, "torch.profiler trace", world_size=world, device=device,
                      host=str(docs[0].get("host_name") or socket.gethostname()), torch_version=torch_version(docs))
    starts = [min([*r.tables.ops["ts"], *r.tables.steps["ts"]], default=0) for r in ranks.values()]
    start = min(starts, default=0)
    run.write_meta(start + first if first and start + first >= 0 else None)
    out = Imported(run_dir, device, world, [])
    for rank in sorted(ranks):
        r = ranks[rank]
        _write(run, r, first)
        t, dev = r.tables, r.device
        out.ranks.append(ImportedRank(rank, r.source, len(t.ops["ts"]), len(t.steps["ts"]), len(t.memory["ts"]),
                                      len(dev.kernels), len(dev.copies), len(t.collectives["ts"])))
        for what, n in dev.left_out.items():
            out.left_out[what] = out.left_out.get(what, 0) + n
    return out


def _read_rank(path: Path, doc: dict[str, Any], index: int, files: int, shift_ns: int) -> _Rank:
    """One trace's tables, its times ``shift_ns`` later (onto the run's clock)."""
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank, world = number(dist.get("rank"), index), number(dist.get("world_size"), files)
    if rank < 0 or world < 1:
        raise NeuronProfError(f"{path}: distributedInfo says rank {rank} of {world}; export the trace again")
    backend = device_backend(doc)
    t = _Tables(backend)
    pgs = dist.get("pg_config")
    t.groups = [g for g in pgs if isinstance(g, dict)] if isinstance(pgs, list) else []
    t.default_group = next((str(g.get("pg_name", "")) for g in t.groups if g.get("pg_desc") == "default_pg"),
                           str(t.groups[0].get("pg_name", "")) if t.groups else "")
    by_thread: dict[int, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            continue
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "M" and e.get("name") == "thread_name":
            t.threads[_tid(e.get("tid"))] = str(_args(e).get("name", ""))
            continue
        ts, dur = trace_ns(e.get("ts")), trace_ns(e.get("dur", 0))
        if ts is None or dur is None:
            continue
        ts += shift_ns
        if ph == "X" and cat == "user_annotation" and (m := _STEP.match(e["name"])):
            for k, v in (("step", int(m.group(1))), ("ts", ts), ("dur", dur), ("active", True), ("complete", True)):
                t.steps[k].append(v)
            continue
        memory = ph == "i" and e["name"] == "[memory]"
        if not (memory or (ph == "X" and cat in ("cpu_op", "user_annotation", "python_function"))):
            continue
        e.update(_ts=ts, _dur=max(dur, 0), _tid=_tid(e.get("tid")), _op=ph == "X" and cat != "python_function")
        by_thread.setdefault(e["_tid"], []).append(e)
    alloc_ts: dict[tuple[str, int], int] = {}
    for events in by_thread.values():
        _walk_thread(events, t, alloc_ts)
    t.finish_collectives()
    device = device_tables(doc["traceEvents"], label=lambda i: backend if i < 0 else f"{backend}:{i}",
                           shift_ns=shift_ns)
    return _Rank(rank, world, path, doc, t, device, shift_ns)


def _groups(t: _Tables, rank: int) -> dict[str, Any]:
    """The ``groups`` rows of ``distributedInfo``'s process groups (members as global ranks)."""
    rows = {k: [] for k in ("group", "desc", "backend", "size", "group_rank", "ranks")}
    s = t.interner.string
    for g in t.groups:
        members = g.get("ranks")
        if isinstance(members, str):  # Kineto writes the list as text
            members = [int(x) for x in re.findall(r"-?\d+", members)]
        members = [number(x, -1) for x in members] if isinstance(members, list) else []
        for k, v in (("group", s(str(g.get("pg_name", "")))), ("desc", s(str(g.get("pg_desc", "")))),
                     ("backend", s(str(g.get("backend_config", "")))), ("size", number(g.get("pg_size"), 0)),
                     ("group_rank", members.index(rank) if rank in members else -1), ("ranks", members)):
            rows[k].append(v)
    return rows


def _write(run: ImportedRun, r: _Rank, first_base: int) -> None:
    t = r.tables
    start = min([*t.ops["ts"], *t.steps["ts"]], default=0)
    writer = run.rank(r.rank, start, first_base)
    threads = {"tid": np.array(list(t.threads), dtype=np.int64),
               "name": np.array([t.interner.string(n) for n in t.threads.values()], dtype=np.int32)}
    device_rows = {}
    s = t.interner.string
    for table, df in r.device.tables().items():
        if not len(df):
            continue
        cols = {c: df[c].to_numpy() for c in df.columns}
        for c, v in cols.items():
            if v.dtype == object:
                cols[c] = np.array([s(str(x)) for x in v], dtype=np.int32)
        device_rows[table] = cols
    groups = _groups(t, r.rank)
    tables = [("threads", threads), ("steps", t.steps), ("ops", t.ops), ("memory_events", t.memory),
              ("collectives", t.collectives), ("groups", groups), *device_rows.items()]
    for table, rows in t.interner.take_new().items():
        writer.append(table, rows)
    for table, cols in tables:
        if len(next(iter(cols.values()))):
            writer.append(table, {k: (v if isinstance(v, np.ndarray) or table == "groups" and k == "ranks"
                                      else np.asarray(v)) for k, v in cols.items()})
    last = max(t.steps["step"], default=0)
    writer.close(last + 1, {"dropped": {}, "written": {"ops": len(t.ops["ts"])}, "cap_reached_at_step": None})
