"""What goes where in a trace: a Run mapped onto any TraceWriter (Perfetto or Chrome JSON).

One process per rank, a thread track per thread with nested op and mark slices, a Steps track,
a Sync points track of instants, a Compile track (frame compiles with their phases nested, graph
breaks and recompiles as instants carrying reason and user line, a flow from each compile to the
first run of the graph it produced). Timestamps are wall-clock ns (each rank's monotonic clock plus
its recorded offset), so ranks on different hosts line up.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from neuron_prof.analysis.compile import REGION_PREFIX, normalize_compile_id
from neuron_prof.analysis.sync import sync_points
from neuron_prof.export.tracewriter import TraceWriter
from neuron_prof.run import Run

OP_ARGS = ("module", "source", "shapes", "dtypes", "devices")


def _thread_tracks(writer: TraceWriter, proc: int, tids: np.ndarray, names: dict[int, str]):
    """One track per thread; returns a vectorised tid -> track handle lookup."""
    uniq = np.unique(tids)
    handles = np.array([writer.thread_track(proc, int(t), names.get(int(t), f"thread {t}")) for t in uniq],
                       dtype=np.int64)
    return lambda t: handles[np.searchsorted(uniq, t)]


def write_run(run: Run, writer: TraceWriter) -> dict[str, Any]:
    """Write every rank of ``run`` into ``writer`` (closing it); returns counts for the CLI."""
    ops, marks, steps, threads = run.ops, run.marks, run.steps, run.threads
    sync = sync_points(ops)
    counts = {"ranks": 0, "op_slices": 0, "mark_slices": 0, "steps": 0, "sync_points": 0, "compiles": 0}
    used_pids: set[int] = set()
    for rd in run.rank_data:
        rank = rd.rank
        offset = int(rd.meta.get("clock_offset_ns", 0))
        pid = int(rd.meta.get("pid", rank + 1))
        if pid in used_pids:  # two hosts, same pid: keep processes apart
            pid = 1_000_000 + rank
        used_pids.add(pid)
        proc = writer.process(pid, f"rank {rank} ({rd.meta.get('hostname', '?')}, pid {rd.meta.get('pid', '?')})")
        names = {int(t): str(n) for t, n in zip(threads.loc[threads["rank"] == rank, "tid"],
                                                threads.loc[threads["rank"] == rank, "name"])}
        r_ops = ops[ops["rank"] == rank]
        r_marks = marks[marks["rank"] == rank]
        lookup = _thread_tracks(writer, proc, np.concatenate([r_ops["tid"].to_numpy(), r_marks["tid"].to_numpy()]),
                                names)
        op_ids = np.empty(0, dtype=np.int64)
        if len(r_ops):
            args = {c: r_ops[c] for c in OP_ARGS}
            args["pass"] = pd.Categorical.from_codes(r_ops["bwd"].to_numpy().astype(np.int8), ["", "backward"])
            op_ids = writer.slices(lookup(r_ops["tid"].to_numpy()), r_ops["ts"].to_numpy() + offset,
                                   r_ops["dur"].to_numpy(), r_ops["name"], args)
        counts["compiles"] += _write_compile_track(run, rank, writer, proc, offset, r_ops, op_ids)
        if len(r_marks):
            writer.slices(lookup(r_marks["tid"].to_numpy()), r_marks["ts"].to_numpy() + offset,
                          r_marks["dur"].to_numpy(), r_marks["name"], {"source": r_marks["source"]})
        r_steps = steps[steps["rank"] == rank]
        if len(r_steps):
            label = np.array([f"step {s}" + ("" if c else " (partial)")
                              for s, c in zip(r_steps["step"], r_steps["complete"])], dtype=object)
            writer.slices(writer.track(proc, "Steps"), r_steps["ts"].to_numpy() + offset, r_steps["dur"].to_numpy(),
                          label, {"captured": np.where(r_steps["active"], "yes", "no").astype(object)})
        r_sync = sync[sync["rank"] == rank]
        if len(r_sync):
            writer.instants(writer.track(proc, "Sync points"), r_sync["ts"].to_numpy() + offset,
                            r_sync["name"].astype(str).to_numpy(dtype=object),
                            {"source": r_sync["source"].astype(str).to_numpy(dtype=object),
                             "why": r_sync["kind"].astype(str).to_numpy(dtype=object)})
        counts["ranks"] += 1
        counts["op_slices"] += len(r_ops)
        counts["mark_slices"] += len(r_marks)
        counts["steps"] += len(r_steps)
        counts["sync_points"] += len(r_sync)
    writer.close()
    return counts


def _first_region_run(r_ops: pd.DataFrame, op_ids: np.ndarray) -> dict[str, int]:
    """compile id -> trace event id of the first run of its graph."""
    if r_ops.empty:
        return {}
    names = r_ops["name"].astype(str)
    is_region = names.str.startswith(REGION_PREFIX).to_numpy()
    out: dict[str, int] = {}
    for pos in np.flatnonzero(is_region)[np.argsort(r_ops["ts"].to_numpy()[is_region], kind="stable")]:
        out.setdefault(normalize_compile_id(names.iloc[pos][len(REGION_PREFIX):]), int(op_ids[pos]))
    return out


def _write_compile_track(run: Run, rank: int, writer: TraceWriter, proc: int, offset: int,
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
        ids = writer.slices(track, compiles["ts"].to_numpy() + offset, compiles["dur"].to_numpy(), label,
                            {"backend": compiles["backend"], "status": compiles["status"],
                             "fail_reason": compiles["fail_reason"], "source": compiles["source"],
                             "graph_ops": compiles["graph_ops"].to_numpy(), "guards": compiles["guards"].to_numpy()})
        first_run = _first_region_run(r_ops, op_ids)
        pairs = [(int(i), first_run[normalize_compile_id(c)]) for i, c in zip(ids, compiles["compile_id"].astype(str))
                 if normalize_compile_id(c) in first_run]
        if pairs:
            writer.flows(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    if len(phases):
        writer.slices(track, phases["ts"].to_numpy() + offset, phases["dur"].to_numpy(), phases["phase"],
                      {"compile_id": phases["compile_id"]})
    if len(breaks):
        writer.instants(writer.track(proc, "Graph breaks"), breaks["ts"].to_numpy() + offset,
                        np.array([f"graph break: {c}" for c in breaks["reason_class"].astype(str)], dtype=object),
                        {"reason": breaks["reason"], "source": breaks["source"], "compile_id": breaks["compile_id"],
                         "gb_id": breaks["gb_id"]})
    if len(recompiles):
        writer.instants(writer.track(proc, "Graph breaks"), recompiles["ts"].to_numpy() + offset,
                        np.array([f"recompile {f}" for f in recompiles["func"].astype(str)], dtype=object),
                        {"reason": recompiles["reason"], "compile_id": recompiles["compile_id"]})
    return len(compiles)
