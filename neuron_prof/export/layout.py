"""What goes where in a trace: a Run mapped onto any TraceWriter (Perfetto or Chrome JSON).

One process per rank, a thread track per thread with nested op and mark slices, a Steps track,
a Sync points track of instants, a Compile track (frame compiles with their phases nested, graph
breaks and recompiles as instants carrying reason and user line, a flow from each compile to the
first run of the graph it produced) and, where the memory collector ran, memory tracks: live bytes
per device (total and per category) as counters (a device read from its backend's counters: its
allocated bytes at each step boundary), a Memory events track with each step's peak and any
out-of-memory error, and allocations of at least ``LARGE_ALLOCATION_BYTES`` as slices spanning their
lifetime; where the collectives collector ran, collective tracks per process group with flows
across ranks (``layout_collectives``); where a device backend reported its queue, a track per
device stream with its kernels, flows from the host ops that queued them, the host's waits for
the queue and its CPU fallbacks on the thread tracks, a queue-depth counter, and flows across
ranks joining the kernels of each collective the device ran (``layout_device``). Every rank's
events are on rank 0's clock (``clock``: the offsets measured at capture start and end), shown
as rank 0's time of day, so ranks on different hosts line up.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from neuron_prof.analysis.compile import first_region_runs, normalize_compile_id
from neuron_prof.analysis.memory import CATEGORIES, NEVER, figures_from, timeline
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.steps import own_work
from neuron_prof.export.clock import RankClock, TraceClock
from neuron_prof.export.event_columns import lanes, string_args
from neuron_prof.export.layout_collectives import CollectiveTracks
from neuron_prof.export.layout_device import DeviceTracks
from neuron_prof.export.writer import TraceWriter
from neuron_prof.store.run import Run
from neuron_prof.store.schema import MEMORY_FIGURES
from neuron_prof.units import format_bytes

OP_ARGS = {"module": "module", "source": "source_full", "shapes": "shapes", "dtypes": "dtypes", "devices": "devices"}
"""Annotation -> ``Run.ops`` column. Source lines carry full paths here (the report and viewer
show them short): a trace is read outside the project, where only a full path finds the file."""
LARGE_ALLOCATION_BYTES = 1 << 20
"""Allocations this big or bigger become slices: few enough to draw one by one, big enough to matter."""
OWN_WORK = "neuron_prof (step-boundary flush)"
"""Steps-track label of the session's own work between steps (``analysis.steps.own_work``)."""
EXPORT_TIMELINE_POINTS = 200_000
"""Counter samples per device: the analysis default (sized for plots) would thin out a zoomed-in trace."""


def _thread_tracks(writer: TraceWriter, proc: int, tids: np.ndarray, names: dict[int, str]):
    """One track per thread; returns a vectorised tid -> track handle lookup."""
    uniq = np.unique(tids)
    handles = np.array([writer.thread_track(proc, int(t), names.get(int(t), f"thread {t}")) for t in uniq],
                       dtype=np.int64)
    return lambda t: handles[np.searchsorted(uniq, t)]


def write_run(run: Run, writer: TraceWriter, progress: Callable[[str], None] = lambda phase: None) -> dict[str, Any]:
    """Write every rank of ``run`` into ``writer`` (closing it); returns counts for the CLI.
    ``progress`` is told each phase as it begins (loading, the analyses, each rank, the flows)."""
    progress("loading ops and steps")
    analysis = analyze(run)
    ops, marks, steps, threads = run.ops, run.marks, analysis.step_kinds, run.threads
    sync = analysis.op_time.sync_points
    spans = pd.concat([run.spans.assign(name=run.spans["name"].astype(str)),
                       own_work(steps).assign(name=OWN_WORK)], ignore_index=True)
    counts = {"ranks": 0, "op_slices": 0, "mark_slices": 0, "steps": 0, "sync_points": 0, "compiles": 0,
              "memory_samples": 0, "memory_events": 0, "large_allocations": 0, "collectives": 0,
              "device_kernels": 0, "device_copies": 0, "queue_flushes": 0, "fallbacks": 0, "queue_depth_samples": 0,
              "stream_waits": 0, "event_completions": 0, "event_flows": 0}
    trace_clock = TraceClock.of_run(run)
    collectives = CollectiveTracks(run, trace_clock)
    device = DeviceTracks(run, trace_clock)
    progress("memory and analyses")
    allocs = analysis.memory_allocations
    # timeline() keeps every bucket's min and max, so the exported peak is the exact peak
    mem_timeline = timeline(allocs, max_points=EXPORT_TIMELINE_POINTS)
    peaks, ooms = analysis.memory_peaks, run.memory_ooms
    counted = figures_from(run.memory_steps, run.memory_sources)
    counted = counted[counted["figures_from"] == MEMORY_FIGURES[1]]
    counted_steps = run.memory_steps.astype({"device": str}).merge(counted[["rank", "device"]], on=["rank", "device"])
    used_pids: set[int] = set()
    for rd in run.rank_data:
        rank = rd.rank
        progress(f"rank {rank}")
        clock = trace_clock.of(rank)
        pid = int(rd.meta.get("pid", rank + 1))
        if pid in used_pids:  # two hosts, same pid: keep processes apart
            pid = 1_000_000 + rank
        used_pids.add(pid)
        proc = writer.process(pid, f"rank {rank} ({rd.meta.get('hostname', '?')}, pid {rd.meta.get('pid', '?')})")
        names = {int(t): str(n) for t, n in zip(threads.loc[threads["rank"] == rank, "tid"],
                                                threads.loc[threads["rank"] == rank, "name"])}
        op_rows = np.flatnonzero(ops["rank"].to_numpy() == rank)
        r_ops = ops.iloc[op_rows]
        r_marks = marks[marks["rank"] == rank]
        lookup = _thread_tracks(writer, proc, np.concatenate([r_ops["tid"].to_numpy(), r_marks["tid"].to_numpy()]),
                                names)
        op_ids = np.empty(0, dtype=np.int64)
        if len(r_ops):
            args = {name: r_ops[col] for name, col in OP_ARGS.items()}
            args["pass"] = pd.Categorical.from_codes(r_ops["bwd"].to_numpy().astype(np.int8), ["", "backward"])
            op_ids = writer.slices(lookup(r_ops["tid"].to_numpy()), *clock.span(r_ops["ts"], r_ops["dur"]),
                                   r_ops["name"], args)
        counts["compiles"] += _write_compile_track(run, rank, writer, proc, clock, r_ops, op_ids)
        if len(r_marks):
            writer.slices(lookup(r_marks["tid"].to_numpy()), *clock.span(r_marks["ts"], r_marks["dur"]),
                          r_marks["name"], {"source": r_marks["source_full"]})
        r_steps = steps[steps["rank"] == rank]
        if len(r_steps):
            _write_steps(writer, writer.track(proc, "Steps"), clock, r_steps, spans[spans["rank"] == rank])
        r_allocs = allocs[allocs["rank"] == rank]
        r_ooms = ooms[ooms["rank"] == rank]
        last_event = _last_event(r_ops, r_marks, r_steps, r_allocs, r_ooms)
        counts["collectives"] += collectives.write(writer, proc, rank, last_event)
        for name, n in device.write(writer, proc, rank, op_rows, op_ids).items():
            counts[name] += n
        r_sync = sync[sync["rank"] == rank]
        if len(r_sync):
            writer.instants(writer.track(proc, "Sync points"), clock.at(r_sync["ts"]),
                            r_sync["name"].astype(str).to_numpy(dtype=object),
                            {"source": r_sync["source_full"].astype(str).to_numpy(dtype=object),
                             "why": r_sync["kind"].astype(str).to_numpy(dtype=object)})
        counts["memory_samples"] += _write_memory_counters(writer, proc, clock,
                                                           mem_timeline[mem_timeline["rank"] == rank])
        counts["memory_samples"] += _write_counted_memory(writer, proc, clock,
                                                          counted_steps[counted_steps["rank"] == rank])
        counts["memory_events"] += _write_memory_events(writer, proc, clock, peaks[peaks["rank"] == rank], r_ooms)
        counts["large_allocations"] += _write_large_allocations(
            writer, proc, clock, r_allocs, last_event)
        counts["ranks"] += 1
        counts["op_slices"] += len(r_ops)
        counts["mark_slices"] += len(r_marks)
        counts["steps"] += len(r_steps)
        counts["sync_points"] += len(r_sync)
    progress("flows")
    counts["collective_flows"] = collectives.write_flows(writer)
    counts["device_flows"] = device.write_flows(writer)
    counts["device_collective_flows"] = device.write_collective_flows(writer)
    writer.close()
    return counts


def _write_steps(writer: TraceWriter, track: int, clock: RankClock, steps: pd.DataFrame, spans: pd.DataFrame) -> None:
    """Steps (labelled partial / warm-up, with their compile time) and, between them on the same
    track, the spans that are not steps: start-up and neuron_prof's own step-boundary work."""
    label = np.array([f"step {s}" + ("" if c else " (partial)") + (" (warm-up)" if w else "")
                      for s, c, w in zip(steps["step"], steps["complete"], steps["warmup"])], dtype=object)
    ts, dur = clock.span(np.concatenate([steps["ts"].to_numpy(), spans["ts"].to_numpy()]),
                         np.concatenate([steps["dur"].to_numpy(), spans["dur"].to_numpy()]))
    names = np.concatenate([label, spans["name"].to_numpy(dtype=object)])
    n = len(spans)
    writer.slices(track, ts, dur, names, {
        "captured": np.concatenate([np.where(steps["active"], "yes", "no").astype(object), np.full(n, "", object)]),
        "compile_ms": np.concatenate([(steps["compile_ns"] / 1e6).round(3).astype(str).to_numpy(dtype=object),
                                      np.full(n, "", object)])})


def _write_compile_track(run: Run, rank: int, writer: TraceWriter, proc: int, clock: RankClock,
                         r_ops: pd.DataFrame, op_ids: np.ndarray) -> int:
    compiles = run.compiles[run.compiles["rank"] == rank]
    phases = run.compile_phases[run.compile_phases["rank"] == rank]
    breaks = run.graph_breaks[run.graph_breaks["rank"] == rank]
    recompiles = run.recompiles[run.recompiles["rank"] == rank]
    if compiles.empty and breaks.empty and recompiles.empty:
        return 0
    track = writer.track(proc, "Compile")
    if len(compiles):
        label = np.array([f"compile {c} {f}" for c, f in zip(compiles["compile_id"].astype(str),
                                                             compiles["func"].astype(str))], dtype=object)
        ids = writer.slices(track, *clock.span(compiles["ts"], compiles["dur"]), label,
                            {"backend": compiles["backend"], "status": compiles["status"],
                             "fail_reason": compiles["fail_reason"], "source": compiles["source_full"],
                             "graph_ops": compiles["graph_ops"].to_numpy(), "guards": compiles["guards"].to_numpy()})
        first_run = {cid: int(op_ids[pos]) for cid, pos in first_region_runs(r_ops).items()}  # id of its slice
        pairs = [(int(i), first_run[normalize_compile_id(c)]) for i, c in zip(ids, compiles["compile_id"].astype(str))
                 if normalize_compile_id(c) in first_run]
        if pairs:
            writer.flows(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    if len(phases):
        writer.slices(track, *clock.span(phases["ts"], phases["dur"]), phases["phase"],
                      {"compile_id": phases["compile_id"]})
    if len(breaks):
        writer.instants(writer.track(proc, "Graph breaks"), clock.at(breaks["ts"]),
                        np.array([f"graph break: {c}" for c in breaks["reason_class"].astype(str)], dtype=object),
                        {"reason": breaks["reason"], "source": breaks["source_full"],
                         "compile_id": breaks["compile_id"], "gb_id": breaks["gb_id"]})
    if len(recompiles):
        writer.instants(writer.track(proc, "Graph breaks"), clock.at(recompiles["ts"]),
                        np.array([f"recompile {f}" for f in recompiles["func"].astype(str)], dtype=object),
                        {"reason": recompiles["reason"], "compile_id": recompiles["compile_id"]})
    return len(compiles)


def _write_memory_counters(writer: TraceWriter, proc: int, clock: RankClock, tl: pd.DataFrame) -> int:
    """Live bytes per device: the total, and each category that ever held bytes (an always-zero
    category track would only push the useful ones out of view)."""
    written = 0
    for device, g in tl.groupby("device", observed=True, sort=True):
        ts = clock.at(g["ts"])
        named = [(f"Memory {device} (live bytes)", "total"), *((f"Memory {device}: {c}", c) for c in CATEGORIES)]
        for name, col in named:
            values = g[col].to_numpy(np.int64)
            if col != "total" and not values.any():
                continue
            # a counter holds its value until the next sample: only changes need writing (a category
            # is unchanged at most of the timeline's rows, which are changes of the total)
            changed = np.ones(len(values), bool)
            changed[1:] = values[1:] != values[:-1]
            writer.counters(writer.counter_track(proc, name, "bytes"), ts[changed], values[changed])
            written += int(changed.sum())
    return written


def _write_counted_memory(writer: TraceWriter, proc: int, clock: RankClock, ms: pd.DataFrame) -> int:
    """Allocated bytes at each step boundary of the devices read from their backend's counters
    (``memory_steps`` rows): no allocation event to draw a timeline from."""
    for device, g in ms.groupby("device", sort=True):
        writer.counters(writer.counter_track(proc, f"Memory {device} (allocated bytes, backend counters)", "bytes"),
                        clock.at(g["ts"]), g["live"].to_numpy(np.int64))
    return len(ms)


def _write_memory_events(writer: TraceWriter, proc: int, clock: RankClock, peaks: pd.DataFrame,
                         ooms: pd.DataFrame) -> int:
    """Each captured step's peak (what reached it is in the name, so it reads without a click) and
    any out-of-memory error, as instants on one track."""
    if peaks.empty and ooms.empty:
        return 0
    track = writer.track(proc, "Memory events")
    if len(peaks):
        several = peaks["device"].nunique() > 1  # name the device only where it tells peaks apart
        names = []
        for step, device, size, op, source in zip(peaks["step"], peaks["device"].astype(str), peaks["bytes"],
                                                  peaks["op"].astype(str), peaks["source"].astype(str)):
            where = " at ".join(x for x in (op, source) if x)
            names.append(f"peak step {step}" + (f" on {device}" if several else "") + f": {format_bytes(int(size))}"
                         + (f", {where}" if where else ""))
        writer.instants(track, clock.at(peaks["ts"]), np.array(names, dtype=object),
                        {"bytes": peaks["bytes"].to_numpy(np.int64), "device": string_args(peaks["device"]),
                         "op": string_args(peaks["op"]), "source": string_args(peaks["source_full"]),
                         "module": string_args(peaks["module"]), "category": string_args(peaks["category"]),
                         "alloc_bytes": peaks["alloc_bytes"].to_numpy(np.int64)})
    if len(ooms):
        writer.instants(track, clock.at(ooms["ts"]),
                        np.full(len(ooms), "out of memory", dtype=object),
                        {"message": string_args(ooms["message"]), "bytes": ooms["bytes"].to_numpy(np.int64),
                         "device": string_args(ooms["device"])})
    return len(peaks) + len(ooms)


def _last_event(r_ops: pd.DataFrame, r_marks: pd.DataFrame, r_steps: pd.DataFrame, r_allocs: pd.DataFrame,
                r_ooms: pd.DataFrame) -> int:
    """The latest time this rank recorded anything (its own clock): where a block still live when
    capture ended stops being drawn."""
    ends = [int((df["ts"] + df["dur"]).max()) for df in (r_ops, r_marks, r_steps) if len(df)]
    freed = r_allocs["free_ts"][r_allocs["free_ts"] != NEVER]
    ends += [int(c.max()) for c in (r_allocs["alloc_ts"], freed, r_ooms["ts"]) if len(c)]
    return max(ends, default=0)


def _write_large_allocations(writer: TraceWriter, proc: int, clock: RankClock, r_allocs: pd.DataFrame,
                             run_end: int) -> int:
    """Blocks of at least ``LARGE_ALLOCATION_BYTES`` as slices over their lifetime, per device on
    as many "Large allocations <device> #k" tracks as were alive at once; a block never freed
    during capture ends at ``run_end``."""
    big = r_allocs[r_allocs["bytes"] >= LARGE_ALLOCATION_BYTES]
    for device, g in big.groupby("device", observed=True, sort=True):
        start = g["alloc_ts"].to_numpy(np.int64)
        never = g["free_ts"].to_numpy(np.int64) == NEVER
        end = np.where(never, run_end, g["free_ts"].to_numpy(np.int64))
        lane = lanes(start, end)
        tracks = np.array([writer.track(proc, f"Large allocations {device} #{k + 1}")
                           for k in range(int(lane.max()) + 1)], dtype=np.int64)
        names = np.array([f"{format_bytes(int(b))} {op or alloc_op}".rstrip() for b, op, alloc_op in
                          zip(g["bytes"], g["top_op"].astype(str), g["op"].astype(str))], dtype=object)
        writer.slices(tracks[lane], *clock.span(start, end - start), names,
                      {"bytes": g["bytes"].to_numpy(np.int64), "op": string_args(g["op"]),
                       "source": string_args(g["source_full"]), "module": string_args(g["module"]),
                       "category": string_args(g["category"]), "step": g["step"].to_numpy(np.int64),
                       "freed": np.where(never, "no (live when capture ended)", "").astype(object)})
    return len(big)
