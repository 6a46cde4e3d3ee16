"""A torch.profiler trace (Kineto's Chrome JSON, ``export_chrome_trace``; gzip too) as a run.

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
  open on its thread, a free matched to its allocation by address.

GPU kernels, memcpys and runtime calls are counted and left out (not imported yet): the import
says how many.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from neuron_prof.errors import NeuronProfError
from neuron_prof.imported import ImportedRun, check_new, number
from neuron_prof.safefile import read_whole
from neuron_prof.schema import MEMORY_KINDS
from neuron_prof.interner import Interner

MAX_TRACE_BYTES = 8 << 30
_PY_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "gpu_user_annotation")
_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
           "c10::complex<double>": "complex128"}
_NOT_TENSORS = ("", "Scalar", "ScalarList", "TensorList", "GenericList", "None")
_ENGINE = "autograd::engine::evaluate_function"


@dataclass
class Imported:
    """What an import wrote: the run directory and what it counted."""

    run_dir: Path
    ops: int
    steps: int
    memory_events: int
    skipped_device_events: int


def read_trace(path: Path) -> dict[str, Any]:
    """The trace's JSON object; a one-line NeuronProfError naming the file for anything else."""
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
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise NeuronProfError(f"{path}: not JSON ({str(exc)[:80]}); a torch.profiler trace is "
                              "prof.export_chrome_trace(\"trace.json\")'s output") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NeuronProfError(f"{path}: JSON without a traceEvents list: not a torch.profiler (Kineto) trace")
    return doc


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000))


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


def _memory_device(args: dict[str, Any]) -> str:
    kind, index = number(args.get("Device Type"), 0), number(args.get("Device Id"), 0)
    if kind == 0:
        return "cpu"
    return f"{'cuda' if kind == 1 else f'device{kind}'}:{max(index, 0)}"


class _Tables:
    """Rows of one rank, interned as the session interns them."""

    def __init__(self) -> None:
        self.interner = Interner()
        self.ops: dict[str, list] = {k: [] for k in ("ts", "dur", "tid", "name", "module", "stack", "shapes",
                                                     "dtypes", "devices", "seq", "fwd_tid", "bwd", "depth",
                                                     "recompute")}
        self.memory: dict[str, list] = {k: [] for k in ("ts", "alloc_ts", "addr", "bytes", "device", "tid", "op",
                                                        "top_op", "module", "stack", "shape", "dtype", "bwd",
                                                        "kind", "total_allocated", "total_reserved", "grad")}
        self.steps: dict[str, list] = {k: [] for k in ("step", "ts", "dur", "active", "complete")}
        self.threads: dict[int, str] = {}


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
            nbytes, addr, device = number(args.get("Bytes"), 0), number(args.get("Addr"), 0), _memory_device(args)
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


def _tid(value: Any) -> int:
    tid = number(value, -1)
    return tid if tid >= 0 else zlib.crc32(str(value).encode())  # Kineto names some tracks ("Spans")


PHASES = ("reading", "nesting ops", "writing")
"""What ``import_trace`` reports to its ``progress`` callback, in order."""


def import_trace(trace: str | os.PathLike, run_dir: str | os.PathLike,
                 progress: Callable[[str], None] = lambda phase: None) -> Imported:
    """Write the torch.profiler trace ``trace`` into the new run ``run_dir`` (rank 0); ``progress``
    is told each of ``PHASES`` as it begins."""
    trace, run_dir = Path(trace), Path(run_dir)
    check_new(run_dir)
    progress(PHASES[0])
    doc = read_trace(trace)
    t = _Tables()
    by_thread: dict[int, list[dict[str, Any]]] = {}
    skipped = 0
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            continue
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "M" and e.get("name") == "thread_name":
            t.threads[_tid(e.get("tid"))] = str(_args(e).get("name", ""))
            continue
        if cat in _DEVICE_CATS:
            skipped += 1
            continue
        try:
            ts, dur = _ns(e["ts"]), _ns(e.get("dur", 0))
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
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
    progress(PHASES[1])
    for events in by_thread.values():
        _walk_thread(events, t, alloc_ts)
    progress(PHASES[2])
    _write(run_dir, trace, doc, t)
    return Imported(run_dir, len(t.ops["ts"]), len(t.steps["ts"]), len(t.memory["ts"]), skipped)


def _write(run_dir: Path, trace: Path, doc: dict[str, Any], t: _Tables) -> None:
    run = ImportedRun(run_dir, trace, "torch.profiler trace", host=str(doc.get("host_name") or socket.gethostname()),
                      device="cuda" if doc.get("deviceProperties") else "cpu")
    base = doc.get("baseTimeNanoseconds")
    offset = base if type(base) is int and base >= 0 else 0  # the trace's clock + this = wall-clock ns
    start = min([*t.ops["ts"], *t.steps["ts"]], default=0)
    run.write_meta(start + offset if offset and start + offset >= 0 else None)
    writer = run.rank(0, start, offset)
    threads = {"tid": np.array(list(t.threads), dtype=np.int64),
               "name": np.array([t.interner.string(n) for n in t.threads.values()], dtype=np.int32)}
    for table, rows in t.interner.take_new().items():
        writer.append(table, rows)
    for table, cols in (("threads", threads), ("steps", t.steps), ("ops", t.ops), ("memory_events", t.memory)):
        if len(next(iter(cols.values()))):
            writer.append(table, {k: np.asarray(v) for k, v in cols.items()})
    last = max(t.steps["step"], default=0)
    writer.close(last + 1, {"dropped": {}, "written": {"ops": len(t.ops["ts"])}, "cap_reached_at_step": None})
