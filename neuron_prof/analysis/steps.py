"""Steps: which are warm-up and which are steady state, their statistics per rank, and where a
step's time goes.

The first step of a rank, and any step in which torch.compile compiled, are **warm-up**: lazy
initialisation, optimizer state, allocator growth and compiling make them unlike the steps after.
Statistics and "where the time goes" describe the **steady** steps (complete, not warm-up), so
one slow first step cannot drive a mean, a p90 or a finding; a run with no steady step falls back
to all complete steps and says so (``basis``). The partial step at exit is never a step.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import OP_PHASES


def step_kinds(steps: pd.DataFrame, compile_spans: pd.DataFrame | None = None) -> pd.DataFrame:
    """``steps`` plus ``compile_ns`` (compile time within the step, from
    ``analysis.compile.compile_spans``), ``warmup`` and ``steady``."""
    out = steps.copy()
    cns = np.zeros(len(out), dtype=np.int64)
    if compile_spans is not None and len(compile_spans) and len(out):
        for rank, idx in out.groupby("rank").indices.items():
            sp = compile_spans[compile_spans["rank"] == rank]
            if sp.empty:
                continue
            starts, ends = sp["ts"].to_numpy(np.int64), sp["end"].to_numpy(np.int64)
            s0 = out["ts"].to_numpy(np.int64)[idx]
            s1 = s0 + out["dur"].to_numpy(np.int64)[idx]
            # overlap of every step with every compile span of its rank (few of either)
            cns[idx] = np.clip(np.minimum(s1[:, None], ends[None, :]) - np.maximum(s0[:, None], starts[None, :]),
                               0, None).sum(axis=1)
    out["compile_ns"] = cns
    complete = out["complete"].to_numpy(bool)
    first = np.zeros(len(out), dtype=bool)
    done = out[complete]
    if len(done):
        first[done.groupby("rank")["step"].idxmin().to_numpy()] = True
    out["warmup"] = complete & (first | (cns > 0))
    out["steady"] = complete & ~out["warmup"].to_numpy()
    return out


class Basis(NamedTuple):
    """The steps statistics and per-step figures describe (``basis_steps``)."""

    steps: pd.DataFrame  # step_kinds rows
    kind: str  # "steady", "all" (no steady step: all complete steps) or "none"
    per_rank: int  # the most of these steps on one rank: what "per step" divides by (0: none)


def steps_per_rank(steps: pd.DataFrame) -> int:
    """The most of ``steps`` one rank has: what every "per step" figure divides by (0: none)."""
    return int(steps.groupby("rank").size().max()) if len(steps) else 0


def captured_steps(steps: pd.DataFrame, complete_only: bool = False) -> pd.DataFrame:
    """The steps captured in detail (``active``): the only steps that have op, memory-event and
    device rows. ``complete_only``: without the partial step at exit."""
    keep = steps["active"] & steps["complete"] if complete_only else steps["active"]
    return steps[keep]


def basis_steps(kinds: pd.DataFrame, captured_only: bool = False) -> Basis:
    """The steady steps, else (no steady step) all complete steps. ``captured_only``: only steps
    captured in detail (what op figures are over)."""
    done = captured_steps(kinds, complete_only=True) if captured_only else kinds[kinds["complete"]]
    steady = done[done["steady"]] if "steady" in done.columns else done.iloc[0:0]
    steps, kind = (steady, "steady") if len(steady) else (done, "all" if len(done) else "none")
    return Basis(steps, kind, steps_per_rank(steps))


SLOW_STEP = 1.5
"""A basis step longer than this many medians, and above their noise (``noise_floor``), is slow
(``step_stats.slow_steps``): the "step time varies" finding names these steps, and the finding
that explains them (a straggler's)."""
NOISE = 3.0
"""An outlier among steps is more than this many robust standard deviations above their median."""


def noise_floor(values: np.ndarray) -> float:
    """Median + ``NOISE`` robust standard deviations (1.4826 x MAD) of per-step ``values``: what
    the jitter every step has does not exceed, however large it is on a loaded host."""
    values = np.asarray(values, dtype=np.float64)
    if not len(values):
        return 0.0
    mid = float(np.median(values))
    return mid + NOISE * 1.4826 * float(np.median(np.abs(values - mid)))


def step_stats(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: ``steps`` (complete), ``warmup`` and ``steady`` counts, ``captured`` (in detail),
    ``compile_ms`` (compiling inside steps), ``basis`` (see ``basis_steps``), the step time
    mean/median/p90/min/max/std in ms over the basis steps, and ``slow_steps`` (the basis steps
    over ``SLOW_STEP`` medians and their noise). ``steps`` from ``step_kinds`` (plain steps are read as if nothing
    compiled)."""
    kinds = steps if "steady" in steps.columns else step_kinds(steps)
    cols = ["rank", "steps", "warmup", "steady", "captured", "compile_ms", "basis",
            "mean_ms", "median_ms", "p90_ms", "min_ms", "max_ms", "std_ms", "slow_steps"]
    rows = []
    for rank, k in kinds[kinds["complete"]].groupby("rank"):
        basis = basis_steps(k)
        ms = basis.steps["dur"] / 1e6
        rows.append({"rank": rank, "steps": len(k), "warmup": int(k["warmup"].sum()),
                     "steady": int(k["steady"].sum()), "captured": int(k["active"].sum()),
                     "compile_ms": float(k["compile_ns"].sum() / 1e6), "basis": basis.kind,
                     "mean_ms": ms.mean(), "median_ms": ms.median(), "p90_ms": ms.quantile(0.9),
                     "min_ms": ms.min(), "max_ms": ms.max(), "std_ms": ms.std(ddof=0),
                     "slow_steps": sorted(map(int, basis.steps.loc[(ms > SLOW_STEP * ms.median())
                                                                   & (ms > noise_floor(ms)), "step"]))})
    return pd.DataFrame(rows, columns=cols)


def own_work(steps: pd.DataFrame) -> pd.DataFrame:
    """neuron_prof's own work at each step boundary (draining, writing the step to disk), per
    rank: the gap between a step's end and the next step's start, which the session keeps out of
    both steps and out of the ops open across it. Columns rank, step (the step it follows), ts, dur."""
    cols = ["rank", "step", "ts", "dur"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    s = steps.sort_values(["rank", "step"])
    end = s["ts"] + s["dur"]
    nxt = s.groupby("rank")["ts"].shift(-1)
    gap = s.assign(ts=end, dur=nxt - end).dropna(subset=["dur"])
    gap = gap[gap["dur"] > 0]
    return gap.assign(dur=gap["dur"].astype(np.int64))[cols].reset_index(drop=True)


PHASES = (*OP_PHASES, "compile", "outside_ops")


def _busiest(top: pd.DataFrame) -> pd.Series:
    """Per (rank, step): the run time of top-level ops on the step's busiest thread."""
    return top.groupby(["rank", "step", "tid"])["dur"].sum().groupby(["rank", "step"]).max()


def step_breakdown(top: pd.DataFrame, steps: pd.DataFrame, phase_ns: pd.DataFrame) -> pd.DataFrame:
    """Where each step's wall time went, per rank, mean ms per step of ``steps`` (``step_kinds``
    rows; the report passes the steady captured steps). ``phase_ns``: the ops' run-time self time
    per rank and phase over those steps (``analysis.ops.phase_time`` of ``step_phases``: forward,
    backward, optimizer, wherever they nest); ``top``: their top-level ops with run-time
    durations (``analysis.ops.run_time_ops(..., top_level=True)``), for what the busiest thread
    covered. ``compile`` = torch.compile compiling inside the steps, ``outside_ops`` = the rest of
    the step on its busiest thread: Python between ops, data loading, waiting. Backward running on
    another thread (an accelerator's autograd thread) overlaps the calling thread's wait, so
    phases can sum past 100%.
    """
    cols = ["rank", "steps", "step_ms", *(f"{p}_ms" for p in PHASES), *(f"{p}_pct" for p in PHASES)]
    if steps.empty or top.empty:
        return pd.DataFrame(columns=cols)
    per = phase_ns.pivot_table(index="rank", columns="phase", values="ns", aggfunc="sum", fill_value=0)
    covered = _busiest(top)
    rows = []
    for rank, s in steps.groupby("rank"):
        n = len(s)
        step_ns = s["dur"].sum()
        comp = s["compile_ns"].sum()
        cov = covered.get(rank, pd.Series(dtype=float)).reindex(s["step"]).fillna(0).sum()
        ms = {p: (per.loc[rank, p] if rank in per.index and p in per.columns else 0) / n / 1e6 for p in OP_PHASES}
        ms["compile"] = comp / n / 1e6
        ms["outside_ops"] = max(step_ns - cov - comp, 0) / n / 1e6
        step_ms = step_ns / n / 1e6
        rows.append({"rank": rank, "steps": n, "step_ms": step_ms, **{f"{p}_ms": ms[p] for p in PHASES},
                     **{f"{p}_pct": 100 * ms[p] / step_ms if step_ms else 0.0 for p in PHASES}})
    return pd.DataFrame(rows, columns=cols)


TIME_KINDS = ("compute", "communication", "sync", "compile", "idle")


def time_split(top: pd.DataFrame, steps: pd.DataFrame, sync: pd.DataFrame, comm: pd.DataFrame,
               exposed: pd.DataFrame | None = None, waits: pd.DataFrame | None = None) -> pd.DataFrame:
    """Where a step's time goes, per rank, mean ms per step of ``steps`` (as ``step_breakdown``):
    ``communication``, ``sync`` (sync points: the host waiting for the device;
    ``analysis.sync.sync_points``), ``compute`` (the rest of the top-level ops' run time),
    ``compile`` (torch.compile compiling inside the steps) and ``idle`` (the rest of the step on
    its busiest thread: Python, data loading). Nothing is counted twice: the kinds add up to the
    step (less what other threads ran at the same time).

    ``communication`` is the collective ops' time (at any depth, ``analysis.ops.comm_ops``); for a
    rank with ``exposed`` rows (``analysis.comm_cost.overlap``: per rank and step, the time in
    collectives that no compute overlapped) it is that exposed time, and ``idle`` is what is left
    of the step after compute, sync, compile and it: a rank that waits for an asynchronous
    collective (DDP's gradient all-reduce) waits outside any op, on no op's clock, and a
    collective that compute overlapped costs the step nothing.

    ``waits``: where a device backend measured the host's waits for its queue
    (``Run.queue_flushes``), a rank that has them takes ``sync`` from them instead: every wait,
    by whatever op (a sync point, a full queue, a CPU fallback) or outside any op
    (``torch.<device>.synchronize()``); a wait inside an op leaves that op's time, one outside
    any leaves ``idle``."""
    cols = ["rank", "steps", "step_ms", *(f"{k}_ms" for k in TIME_KINDS)]
    if steps.empty or top.empty:
        return pd.DataFrame(columns=cols)
    covered = _busiest(top)
    has_exposed = exposed is not None and len(exposed) > 0
    if has_exposed:
        exposed = exposed[exposed["exposed_ns"] >= 0]
    rows = []
    for rank, s in steps.groupby("rank"):
        n = len(s)
        ops_ns = top.loc[top["rank"] == rank, "dur"].sum()
        comm_ns = comm[(comm["rank"] == rank) & comm["step"].isin(s["step"])]["dur"].sum() if len(comm) else 0
        sy = sync[(sync["rank"] == rank) & sync["step"].isin(s["step"])]["dur"].sum() if len(sync) else 0
        comp = s["compile_ns"].sum()
        cov = covered.get(rank, pd.Series(dtype=float)).reindex(s["step"]).fillna(0).sum()
        idle = max(s["dur"].sum() - cov - comp, 0)
        communication = comm_ns
        mine = exposed[(exposed["rank"] == rank) & exposed["step"].isin(s["step"])] if has_exposed else exposed
        if has_exposed and len(mine):
            communication = int(mine["exposed_ns"].sum())
            idle = max(s["dur"].sum() - (ops_ns - comm_ns) - comp - communication, 0)
        waited = sy  # the host's waits: in ops (sy) and outside any (left out of idle)
        measured = waits[(waits["rank"] == rank) & waits["step"].isin(s["step"])] if waits is not None else None
        if measured is not None and len(measured):
            inside = measured["host_op"].astype(str).to_numpy() != ""
            sy = int(measured["dur"].to_numpy()[inside].sum())
            outside = int(measured["dur"].to_numpy()[~inside].sum())
            idle, waited = max(idle - outside, 0), sy + outside
        ms = {"compute": (ops_ns - comm_ns - sy) / n / 1e6, "communication": communication / n / 1e6,
              "sync": waited / n / 1e6, "compile": comp / n / 1e6, "idle": idle / n / 1e6}
        rows.append({"rank": rank, "steps": n, "step_ms": s["dur"].sum() / n / 1e6,
                     **{f"{k}_ms": max(v, 0.0) for k, v in ms.items()}})
    return pd.DataFrame(rows, columns=cols)
