"""Stragglers: which rank made the others wait, in which steps, and whether it matters.

A collective's wait traces back to one rank (``collective_match.matched``: ``root_rank``, the
last to arrive or the rank that made it late). The wait a rank caused in a step is the longest
that any other rank waited for it there, each instant once: the union of that rank's waiting
intervals (``intervals.length_by_key``). Two async all-reduces a rank waits for at once, both
late for the same reason, are one wait, not two added up; and no wait exceeds the waiting
rank's step. The rank that caused the most wait in a step is its top straggler.

Significance (``straggler_steps``): in synchronous training some rank is always last, by a few
microseconds of noise, and on a busy host by tens of milliseconds. A step's top straggler is
*significant* when the wait it caused is

* at least ``SHARE`` of the median steady step (less is not worth a finding), and
* above the run's noise floor: an outlier among the steady steps' top waits, more than
  ``steps.NOISE`` robust standard deviations (1.4826 x MAD) above their median
  (``steps.noise_floor``), so the jitter every step has never names a rank, however large it is
  on a loaded host;
* or, instead of the floor, the rank is the top straggler in every steady step (at least
  ``PERSISTENT_MIN`` of them): a rank that is late every time (slower hardware, more data) makes
  its own wait the median, yet it is the most important straggler to name.

Steps are the steady ones (``analysis.steps.basis_steps``), like the rest of the report. Wait
that neuron_prof caused (its own work on the last rank: ``collective_match.own_spans``) is left
out of what a rank caused.

Times are int64 ns. DataFrames in, DataFrames out.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from neuron_prof.analysis.intervals import length_by_key, minus_by_key
from neuron_prof.analysis.steps import basis_steps, noise_floor
from neuron_prof.store.keys import step_key, step_key_parts

Spans = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(rank, start, end) of disjoint intervals on rank 0's clock: ``collective_match.own_spans``."""
NO_SPANS: Spans = (np.zeros(0, dtype=np.int64),) * 3

SHARE = 0.1
"""A significant straggler made the others wait at least this share of the median steady step."""
PERSISTENT_MIN = 3
"""A rank last in every one of at least this many steady steps needs no noise floor."""


class SteadySteps(NamedTuple):
    """The steps per-step collective figures are over: ``steps``, the steady step numbers
    (``basis_steps``: all complete steps where none is steady), and ``median_ns``, the median
    step time over them."""
    steps: set[int]
    median_ns: float


def steady_steps(steps: pd.DataFrame) -> SteadySteps:
    """``SteadySteps`` of ``steps`` (``RunAnalysis.step_kinds``)."""
    basis = basis_steps(steps).steps
    return SteadySteps(set(map(int, basis["step"])), float(basis["dur"].median()) if len(basis) else 0.0)


def _per_step(rank: np.ndarray, step: np.ndarray, other: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step, other) of the intervals: the length of their union, at most the rank's
    step (``steps``: its ``dur``), as columns rank, step, other, ns."""
    rank_step, rank_steps = pd.factorize(step_key(rank, step))  # int64 keys: fast at 100,000s of rows
    others, other_values = pd.factorize(np.asarray(other, dtype=np.int64))
    k, length = length_by_key(rank_step.astype(np.int64) * max(len(other_values), 1) + others, starts, ends)
    k = np.asarray(k, dtype=np.int64)
    key = rank_steps[k // max(len(other_values), 1)] if len(k) else np.zeros(0, dtype=np.int64)
    ns = np.asarray(length, np.int64)
    if len(steps):
        dur = steps.drop_duplicates(["rank", "step"])
        cap = pd.Series(dur["dur"].to_numpy(np.int64), index=step_key(dur["rank"], dur["step"])).reindex(key)
        ns = np.where(cap.isna(), ns, np.minimum(ns, cap.fillna(0).to_numpy(np.int64)))
    r, st = step_key_parts(key)
    return pd.DataFrame({"rank": r, "step": st, "other": other_values[k % max(len(other_values), 1)]
                         if len(k) else np.zeros(0, dtype=np.int64), "ns": ns.astype(np.int64)})


def waited(waits: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step with collectives: ``waited_ns``, how long the rank waited in them for the
    last arrival (``collective_match.waits``), each instant once however many collectives it
    waited for at the time, at most its step (``steps``: ``Run.steps`` or ``step_kinds``)."""
    w = waits[waits["wait_ns"] > 0]
    start = w["start"].to_numpy(np.int64)
    per = _per_step(w["rank"].to_numpy(np.int64), w["step"].to_numpy(np.int64), np.zeros(len(w), np.int64),
                    start, start + w["wait_ns"].to_numpy(np.int64), steps)
    return per.rename(columns={"ns": "waited_ns"})[["rank", "step", "waited_ns"]]


def _caused(waits: pd.DataFrame, steady: set[int], steps: pd.DataFrame, own: Spans) -> pd.DataFrame:
    """Wait caused per steady step and rank: the longest that another rank waited, in that step,
    at the collectives it is the root of (``root_rank``: it arrived last, or made the last rank
    late), each instant once (the union of the waiter's intervals, at most its step), less the
    time the last rank spent in neuron_prof's own work (``own``: ``collective_match.own_spans``)."""
    w = waits[waits["step"].isin(steady) & (waits["rank"] != waits["root_rank"]) & (waits["root_rank"] >= 0)]
    start = w["start"].to_numpy(np.int64)
    at, s, e = minus_by_key(w["late_rank"].to_numpy(np.int64), start, start + w["wait_ns"].to_numpy(np.int64), *own)
    per = _per_step(w["rank"].to_numpy(np.int64)[at], w["step"].to_numpy(np.int64)[at],
                    w["root_rank"].to_numpy(np.int64)[at], s, e, steps)
    caused = per.groupby(step_key(per["other"], per["step"]))["ns"].max()
    seen = np.unique(step_key(w["root_rank"], w["step"]))  # a root whose collectives nobody waited at caused 0
    root, step = step_key_parts(seen)
    return (pd.DataFrame({"step": step, "rank": root, "wait_caused_ns": caused.reindex(seen, fill_value=0)
                          .to_numpy(np.int64)}).sort_values(["step", "rank"], ignore_index=True))


def straggler_steps(waits: pd.DataFrame, steps: pd.DataFrame, own: Spans = NO_SPANS) -> pd.DataFrame:
    """Per steady step in which a rank waited for another: the rank that caused the most wait in it
    (``rank``, ``wait_caused_ns``: ``_caused`` over ``collective_match.waits``) and whether that is
    ``significant`` (module docstring); ``threshold_ns``: the wait a step needed, the same for
    every step."""
    return _significance(_caused(waits, steady_steps(steps).steps, steps, own), steps)


def _significance(caused: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``straggler_steps`` of the wait caused per step and rank (``_caused``)."""
    cols = ["step", "rank", "wait_caused_ns", "significant", "threshold_ns"]
    if caused.empty:
        return pd.DataFrame(columns=cols)
    median_step = steady_steps(steps).median_ns
    top = caused.sort_values(["step", "wait_caused_ns", "rank"], ascending=[True, False, True]).drop_duplicates("step")
    wait = top["wait_caused_ns"].to_numpy(np.float64)
    persistent = top["rank"].nunique() == 1 and len(top) >= PERSISTENT_MIN
    floor = 0.0 if persistent else noise_floor(wait)
    significant = (wait >= SHARE * median_step) & (wait > floor)
    return top.assign(significant=significant, threshold_ns=max(SHARE * median_step, floor))[cols].reset_index(drop=True)


def stragglers(matched: pd.DataFrame, waits: pd.DataFrame, steps: pd.DataFrame, own: Spans = NO_SPANS
               ) -> pd.DataFrame:
    """Per rank, over the steady steps, worst first: ``steps`` (those in which it was the
    significant straggler: ``straggler_steps``), ``times_last`` (the collectives it arrived last
    at, making others wait, in those steps), ``wait_caused_ns`` (the wait it caused in each steady
    step, ``_caused``, summed over them), its ``share`` of all the wait caused, and ``waited_ns``
    (how long it waited for others itself: ``waited``, summed over the steady steps)."""
    cols = ["rank", "times_last", "wait_caused_ns", "share", "steps", "waited_ns"]
    steady, _ = steady_steps(steps)
    caused = _caused(waits, steady, steps, own)
    m = matched[matched["step"].isin(steady) & (matched["ranks_seen"].str.len() > 1)]
    if m.empty:
        return pd.DataFrame(columns=cols)
    ranks = sorted({int(r) for rs in m["ranks_seen"] for r in rs})
    per = caused.groupby("rank")["wait_caused_ns"].sum().reindex(ranks, fill_value=0)
    sig = _significance(caused, steps)
    sig = sig[sig["significant"]]
    named = [sorted(map(int, sig.loc[sig["rank"] == r, "step"])) for r in ranks]
    at = m[m["wait_ns"] > m["own_ns"]]
    times = [int(((at["root_rank"] == r) & at["step"].isin(s)).sum()) for r, s in zip(ranks, named)]
    mine = waited(waits[waits["step"].isin(steady)], steps)
    waited_ns = mine.groupby("rank")["waited_ns"].sum().reindex(ranks, fill_value=0)
    total = float(per.sum())
    out = pd.DataFrame({"rank": ranks, "times_last": times,
                        "wait_caused_ns": per.to_numpy(np.int64),
                        "share": per.to_numpy() / total if total else 0.0, "steps": named,
                        "waited_ns": waited_ns.to_numpy(np.int64)})
    # worst first: the most significant steps, then the most wait caused (a rank at the root of a
    # long chain of small waits in one step is not worse than one that stalls the job every 10 steps)
    out["n_steps"] = out["steps"].str.len()
    return out.sort_values(["n_steps", "wait_caused_ns", "rank"], ascending=[False, False, True],
                           ignore_index=True)[cols]


def worst_collectives(matched: pd.DataFrame, waits: pd.DataFrame, ranking: pd.DataFrame) -> pd.DataFrame:
    """Per rank of ``ranking`` (``stragglers``): the collective of its ``steps`` at which it made the
    others wait longest (where it was late itself, if anywhere: not where its delay was passed on),
    as the rank issued it: group, seq, op, bytes, source line, module, backward or not. A rank
    without one is left out."""
    cols = ["rank", "group", "seq", "op", "bytes", "source", "user_source", "module", "bwd"]
    rows = []
    for rank, steps in zip(ranking["rank"], ranking["steps"]):
        mine = matched[(matched["root_rank"] == rank) & matched["step"].isin(steps)]
        if (mine["last_rank"] == rank).any():
            mine = mine[mine["last_rank"] == rank]
        if mine.empty:
            continue
        top = mine.loc[(mine["wait_ns"] - mine["own_ns"]).idxmax()]
        issued = waits[(waits["rank"] == rank) & (waits["group"].astype(str) == top["group"])
                       & (waits["seq"] == top["seq"])]
        if issued.empty:
            continue
        r = issued.iloc[0]
        rows.append((int(rank), top["group"], int(top["seq"]), top["op"], int(top["bytes"]), str(r["source"]),
                     str(r["user_source"]), str(r["module"]), bool(r["bwd"])))
    return pd.DataFrame(rows, columns=cols)
