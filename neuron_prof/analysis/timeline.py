"""What the viewer's Timeline page draws: one rank's ops, compiles, graph breaks and live memory
inside a time window of one step.

Pandas in, pandas out; inputs are ``Run.steps``, ``Run.ops``, ``Run.compiles``,
``Run.graph_breaks`` and ``RunAnalysis.memory_allocations``. Times are the run's monotonic ns. An event is
in a window ``[t0, t1]`` when it overlaps it (a span ``ts..ts+dur`` with ``ts <= t1`` and
``ts + dur >= t0``; an instant with ``t0 <= ts <= t1``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.memory import NEVER, timeline

BEFORE_FIRST_STEP = -1
"""The step of events that began before the first step (``Run`` tags them -1)."""


def step_choices(steps: pd.DataFrame, ops: pd.DataFrame, rank: int, spans: pd.DataFrame | None = None) -> pd.DataFrame:
    """The steps of ``rank`` a timeline can show: step, ts, dur, active, complete, warmup, ops
    (how many ops started in it); plus a pseudo-step -1 for what came before the first step: the
    run's start-up span (``Run.spans``) when it has one, else the span of the ops that began
    before the first step, when there are any. ``steps``: ``RunAnalysis.step_kinds`` (or plain steps)."""
    cols = ["step", "ts", "dur", "active", "complete", "warmup", "ops"]
    s = steps[steps["rank"] == rank]
    s = s.assign(warmup=s["warmup"] if "warmup" in s.columns else False)[cols[:-1]]
    r_ops = ops[ops["rank"] == rank]
    counts = r_ops["step"].value_counts()
    s = s.assign(ops=s["step"].map(counts).fillna(0).astype(np.int64))
    early = r_ops[r_ops["step"] == BEFORE_FIRST_STEP]
    startup = spans[(spans["rank"] == rank) & (spans["name"].astype(str) == "start-up")] if spans is not None \
        else pd.DataFrame()
    if len(startup):
        t0, t1 = int(startup["ts"].iloc[0]), int(startup["ts"].iloc[0] + startup["dur"].iloc[0])
    elif len(early):
        t0, t1 = int(early["ts"].min()), int((early["ts"] + early["dur"]).max())
    if len(startup) or len(early):
        head = pd.DataFrame({"step": [BEFORE_FIRST_STEP], "ts": [t0], "dur": [t1 - t0], "active": [False],
                             "complete": [False], "warmup": [False], "ops": [len(early)]})
        s = pd.concat([head, s], ignore_index=True) if len(s) else head
    return s[cols].sort_values("step", ignore_index=True)


def default_step(choices: pd.DataFrame) -> int:
    """The first captured steady step with ops, else the first captured step with ops, else the
    first step with ops, else the first."""
    captured = choices["active"] & (choices["ops"] > 0)
    for mask in (captured & ~choices["warmup"].astype(bool), captured, choices["ops"] > 0):
        if mask.any():
            return int(choices.loc[mask, "step"].iloc[0])
    return int(choices["step"].iloc[0]) if len(choices) else BEFORE_FIRST_STEP


def in_window(df: pd.DataFrame, rank: int, t0: int, t1: int) -> pd.DataFrame:
    """Rows of ``rank`` that overlap ``[t0, t1]`` (spans if ``df`` has ``dur``, else instants),
    in time order."""
    ts = df["ts"]
    m = (df["rank"] == rank) & (ts <= t1)
    m &= (ts + df["dur"] >= t0) if "dur" in df.columns else (ts >= t0)
    return df[m].sort_values("ts", kind="stable")


def window_ops(ops: pd.DataFrame, rank: int, step: int, t0: int, t1: int, max_depth: int = 0) -> pd.DataFrame:
    """The ops of ``rank`` that started in ``step`` (``Run.ops["step"]``), are nested at most
    ``max_depth`` deep (0: what the user called) and overlap ``[t0, t1]``, in time order."""
    o = ops[(ops["rank"] == rank) & (ops["step"] == step) & (ops["depth"] <= max_depth)]
    return in_window(o, rank, t0, t1)


def longest_ops(ops: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The ``limit`` longest of ``ops`` (equal durations: the earlier first), in time order."""
    if len(ops) <= limit:
        return ops
    order = np.lexsort((ops["ts"].to_numpy(), -ops["dur"].to_numpy()))[:limit]
    return ops.iloc[np.sort(order)]


def memory_window(allocs: pd.DataFrame, rank: int, t0: int, t1: int, max_points: int = 2000) -> pd.DataFrame:
    """Live bytes of ``rank`` per device within ``[t0, t1]``, total and per category: the
    columns of :func:`neuron_prof.analysis.memory.timeline`, downsampled the same way (each
    bucket's minimum and maximum are kept, so the window's peak is a row). The first row of a
    device is its state at ``t0`` (everything made before and still alive counts as made at
    ``t0``); frees after ``t1`` are left out."""
    a = allocs[(allocs["rank"] == rank) & (allocs["alloc_ts"] <= t1) & (allocs["free_ts"] > t0)]
    if a.empty:
        return timeline(a, max_points)
    a = a.assign(alloc_ts=np.maximum(a["alloc_ts"].to_numpy(np.int64), t0),
                 free_ts=np.where(a["free_ts"].to_numpy(np.int64) > t1, NEVER, a["free_ts"].to_numpy(np.int64)))
    return timeline(a, max_points)
