"""A run's memory as PyTorch's memory snapshot, the pickle ``torch.cuda.memory._dump_snapshot``
writes, so https://pytorch.org/memory_viz and ``torch.cuda._memory_viz`` open it for CPU and
PrivateUse1 runs too, not only CUDA ones.

Layout (``torch.cuda.memory._snapshot``'s ``Snapshot``; what the viewer reads):

``device_traces[i]``
    the allocator's history on device ``i``, oldest first. Each captured allocation gives
    ``segment_alloc`` + ``alloc`` at its allocation and, when freed before the snapshot time,
    ``free_requested`` + ``free_completed`` + ``segment_free`` at its free; an out-of-memory
    error gives ``oom``; the last entry is a ``snapshot`` marker at the snapshot time. Entries
    carry ``addr``, ``size`` (bytes asked for), ``stream`` (0: streams are not captured),
    ``time_us`` (wall-clock microseconds since the Unix epoch, as torch writes them) and
    ``frames``; allocations also carry neuron_prof's ``category``, which the viewer's timeline
    colours and lists in its legend, as it does for ``torch.profiler`` memory profiles.
``segments``
    the state at the snapshot time: one segment per allocation alive then, holding one
    ``active_allocated`` block of the same size. The CPU and most PrivateUse1 allocators are not
    caching allocators: each allocation is its own piece of memory, which is what a segment is
    (reserved == allocated). One segment spanning all live blocks would instead show the gaps of
    the process's address space as free memory, and the trace's ``segment_*`` entries let the
    viewer's "Allocator State History" rebuild the segments at any earlier point (without them
    a block freed before the snapshot has no segment there and the view fails).
``frames``
    innermost first, as torch writes them: the ATen op that allocated (``??:0:aten::empty``, the
    form torch gives native frames without a source file), the top-level op the user called
    when it differs (with its module), then the Python stack from the allocating line outwards.

Devices: an accelerator ``type:N`` is index N; ``cpu`` is 0 on a CPU-only run and otherwise
follows the highest accelerator index, as torch's own profile-to-snapshot conversion does. A
snapshot is per process, so one rank is exported.
"""
from __future__ import annotations

import os
import pickle
import re
from collections import Counter
from typing import Any, Iterable

import numpy as np

from neuron_prof.analysis.memory import NEVER
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import atomic_output
from neuron_prof.units import parse_bytes

PICKLE_PROTOCOL = 4
"""The viewer decodes the pickle itself and accepts protocols 2 to 4 only (Python 3.14 defaults
to 5); plain dicts, lists, tuples, str, int and bool keep to the opcodes it knows."""
LARGE_SEGMENT = 1 << 20
"""CUDA's caching allocator serves requests above 1 MiB from its ``large`` pool."""
NATIVE_FILE = "??"
"""The file of op frames: what torch writes for native frames it has no source file for."""
_FREE_OLDER, _ALLOC, _FREE_SAME, _OOM = 0, 1, 2, 3  # order of trace entries at the same instant
_FREE_TEXT = re.compile(r"of which ([\d.]+ ?(?:bytes|B|KiB|MiB|GiB|TiB)) (?:is )?free", re.I)
RECORD_HINT = ("re-record with the memory collector on: neuron-prof record --collectors eager,compiler,memory -o RUN "
               "-- python train.py, or neuron_prof.profile(RUN, collectors=[\"eager\", \"memory\"])")


def device_indices(devices: Iterable[str]) -> dict[str, int]:
    """Device name -> index in ``device_traces``: an accelerator keeps its index; ``cpu`` (and an
    accelerator whose index is taken) goes after the highest, so a CUDA run's ``cuda:0`` stays
    device 0 in the viewer while its host allocations get their own device."""
    out: dict[str, int] = {}
    rest = []
    for name in sorted(set(devices)):
        kind, _, index = name.partition(":")
        i = int(index) if index.isdigit() else 0
        if kind != "cpu" and i not in out.values():
            out[name] = i
        else:
            rest.append(name)
    following = max(out.values(), default=-1) + 1
    for k, name in enumerate(sorted(rest, key=lambda n: n != "cpu")):
        out[name] = following + k
    return out


def device_free(message: str) -> int:
    """What an OOM message says was still free on the device (CUDA's "of which 1.2 GiB is free"),
    else 0: the viewer's OOM line and ``_memory_viz.trace`` show this field."""
    m = _FREE_TEXT.search(message)
    return parse_bytes(m.group(1)) if m else 0


def _pick_rank(run: Run, rank: int | None) -> int:
    ev = run.memory_events
    with_memory = sorted(set(ev["rank"].tolist()) | set(run.memory_ooms["rank"].tolist()))
    if rank is not None and rank not in run.ranks:
        raise NeuronProfError(f"{run.path}: no rank {rank} in this run (ranks: "
                              f"{', '.join(map(str, run.ranks))}); choose one with --rank")
    if not with_memory:
        raise NeuronProfError(f"{run.path}: no memory data in this run (recorded without the memory "
                              f"collector); {RECORD_HINT}")
    if rank is None:
        return with_memory[0]
    if rank not in with_memory:
        raise NeuronProfError(f"{run.path}: rank {rank} has no memory data (ranks with memory data: "
                              f"{', '.join(map(str, with_memory))}); choose one with --rank")
    return rank


def _horizon(run: Run, rank: int, step: int | None) -> int:
    """The snapshot time (monotonic ns): the end of ``step``, or the end of capture (everything)."""
    if step is None:
        return int(NEVER) - 1
    s = run.steps[(run.steps["rank"] == rank) & (run.steps["step"] == step)]
    if s.empty:
        have = run.steps.loc[run.steps["rank"] == rank, "step"]
        span = f"steps {have.min()}-{have.max()}" if len(have) else "no steps"
        raise NeuronProfError(f"{run.path}: rank {rank} has no step {step} ({span}); choose one with --step")
    return int(s["ts"].iloc[0] + s["dur"].iloc[0])


class _Frames:
    """Frame lists per (stack, op, top op, module), built once and shared by every entry that
    uses them, so pickle stores each list once and refers back to it."""

    def __init__(self, run: Run, rank: int) -> None:
        self.run, self.rank = run, rank
        self.cache: dict[tuple, list[dict[str, Any]]] = {}

    def __call__(self, stack: int, op: str, top_op: str, module: str) -> list[dict[str, Any]]:
        key = (stack, op, top_op, module)
        if key not in self.cache:
            ops = [op] if op else []
            if op and top_op and top_op != op:
                ops.append(top_op)
            if ops and module:
                ops[-1] += f" (module {module})"
            self.cache[key] = ([{"filename": NATIVE_FILE, "line": 0, "name": name} for name in ops]
                               + [{"filename": file, "line": line, "name": func}
                                  for file, func, line in self.run.stack(self.rank, stack)])
        return self.cache[key]


def snapshot(run: Run, rank: int | None = None, step: int | None = None) -> dict[str, Any]:
    """The memory snapshot of one rank (default: the first with memory data) as of the end of
    capture, or of the end of ``step``: trace entries up to then, segments for what was live then.
    Raises :class:`NeuronProfError` for a run without memory data or a rank/step it lacks."""
    return _build(run, rank, step)[0]


def write(run: Run, path: str | os.PathLike, rank: int | None = None, step: int | None = None) -> dict[str, Any]:
    """Write :func:`snapshot` to ``path``; returns what went in, for the CLI's summary line:
    rank, devices (trace index -> device name), allocations, frees, ooms, live_blocks, live_bytes."""
    snap, rank, devices = _build(run, rank, step)
    with atomic_output(path) as f:  # replaces a link at ``path``, never writes through it
        pickle.dump(snap, f, protocol=PICKLE_PROTOCOL)
    actions = Counter(e["action"] for trace in snap["device_traces"] for e in trace)
    return {"rank": rank, "devices": {i: name for name, i in sorted(devices.items(), key=lambda kv: kv[1])},
            "allocations": actions["alloc"], "frees": actions["free_completed"], "ooms": actions["oom"],
            "live_blocks": len(snap["segments"]), "live_bytes": sum(seg["allocated_size"] for seg in snap["segments"])}


def _build(run: Run, rank: int | None, step: int | None) -> tuple[dict[str, Any], int, dict[str, int]]:
    """The snapshot, the rank it is of, and its device indices."""
    rank = _pick_rank(run, rank)
    horizon = _horizon(run, rank, step)
    allocs = analyze(run).memory_allocations
    a = allocs[(allocs["rank"] == rank) & (allocs["alloc_ts"] <= horizon)].reset_index(drop=True)
    ooms = run.memory_ooms
    ooms = ooms[(ooms["rank"] == rank) & (ooms["ts"] <= horizon)].reset_index(drop=True)
    devices = device_indices(a["device"].astype(str).tolist() + ooms["device"].astype(str).tolist() or ["cpu"])
    meta = next(rd.meta for rd in run.rank_data if rd.rank == rank)
    offset = int(meta.get("clock_offset_ns", 0))
    frames_of = _Frames(run, rank)

    dev = [devices[d] for d in a["device"].astype(str)]
    addr, size, category = a["addr"].tolist(), a["bytes"].tolist(), a["category"].astype(str).tolist()
    alloc_ts, free_ts = a["alloc_ts"].to_numpy(np.int64), a["free_ts"].to_numpy(np.int64)
    frames = [frames_of(s, o, t, m) for s, o, t, m in zip(a["stack"].tolist(), a["op"].astype(str),
                                                          a["top_op"].astype(str), a["module"].astype(str))]
    freed = free_ts <= horizon

    # one sort for the whole history: by time; at equal times a free of an older block first (its
    # address may be reused), then allocations, then frees of blocks made that instant, then OOMs
    n, f_idx = len(a), np.flatnonzero(freed)
    times = np.concatenate([alloc_ts, free_ts[f_idx], ooms["ts"].to_numpy(np.int64)])
    phase = np.concatenate([np.full(n, _ALLOC), np.where(free_ts[f_idx] == alloc_ts[f_idx], _FREE_SAME, _FREE_OLDER),
                            np.full(len(ooms), _OOM)])
    which = np.concatenate([np.arange(n), f_idx, np.arange(len(ooms))])
    order = np.lexsort((which, phase, times))

    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(devices.values()) + 1)]
    for t, p, i in zip(times[order].tolist(), phase[order].tolist(), which[order].tolist()):
        time_us = (t + offset) // 1000
        if p == _OOM:
            traces[devices[str(ooms["device"].iloc[i])]].append({
                "action": "oom", "device_free": device_free(str(ooms["message"].iloc[i])),
                "size": int(ooms["bytes"].iloc[i]), "stream": 0, "time_us": time_us, "frames": []})
        elif p == _ALLOC:
            common = {"addr": addr[i], "size": size[i], "stream": 0, "time_us": time_us, "frames": frames[i],
                      "category": category[i]}
            traces[dev[i]] += [{"action": "segment_alloc", **common}, {"action": "alloc", **common}]
        else:
            common = {"addr": addr[i], "size": size[i], "stream": 0, "time_us": time_us, "frames": frames[i]}
            traces[dev[i]] += [{"action": act, **common}
                               for act in ("free_requested", "free_completed", "segment_free")]

    end = horizon if step is not None else int(max(times.max(initial=0), meta.get("start_ns", 0)))
    for trace in traces:
        # torch's marker of when the snapshot was taken. Its "unknown" category is the viewer's
        # fallback, which MemoryViz.js otherwise adds itself through a misspelt field and fails.
        trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": (end + offset) // 1000,
                      "frames": [], "category": "unknown"})

    segments = []
    for i in sorted(np.flatnonzero(~freed).tolist(), key=lambda i: (dev[i], addr[i])):
        block = {"address": addr[i], "size": size[i], "requested_size": size[i], "state": "active_allocated",
                 "frames": frames[i]}
        segments.append({"device": dev[i], "address": addr[i], "total_size": size[i], "allocated_size": size[i],
                         "active_size": size[i], "requested_size": size[i], "stream": 0,
                         "segment_type": "large" if size[i] > LARGE_SEGMENT else "small", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": frames[i], "blocks": [block]})
    return {"segments": segments, "device_traces": traces}, rank, devices
