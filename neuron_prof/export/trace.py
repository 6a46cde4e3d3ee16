"""What goes where in a trace: a Run mapped onto any TraceWriter (Perfetto or Chrome JSON).

One process per rank, a thread track per thread with nested op and mark slices, a Steps track,
a Sync points track of instants. Timestamps are wall-clock ns (each rank's monotonic clock plus
its recorded offset), so ranks on different hosts line up.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

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
    counts = {"ranks": 0, "op_slices": 0, "mark_slices": 0, "steps": 0, "sync_points": 0}
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
        if len(r_ops):
            args = {c: r_ops[c] for c in OP_ARGS}
            args["pass"] = pd.Categorical.from_codes(r_ops["bwd"].to_numpy().astype(np.int8), ["", "backward"])
            writer.slices(lookup(r_ops["tid"].to_numpy()), r_ops["ts"].to_numpy() + offset,
                          r_ops["dur"].to_numpy(), r_ops["name"], args)
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
