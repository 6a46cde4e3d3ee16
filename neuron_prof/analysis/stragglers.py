"""Stragglers: which rank made the others wait, in which steps, and whether it matters.

A collective's wait traces back to one rank (``collective_match.matched``: ``root_rank``, the
last to arrive or the rank that made it late). Summed per steady step, the rank that caused the
most wait in a step is its top straggler.

Significance (``straggler_steps``): in synchronous training some rank is always last, by a few
microseconds of noise, and on a busy host by tens of milliseconds. A step's top straggler is
*significant* when the wait it caused is

* at least ``SHARE`` of the median steady step (less is not worth a finding), and
* above the run's noise floor: an outlier among the steady steps' top waits, more than ``NOISE``
  robust standard deviations (1.4826 x MAD) above their median, so the jitter every step has
  never names a rank, however large it is on a loaded host;
* or, instead of the floor, the rank is the top straggler in every steady step (at least
  ``PERSISTENT_MIN`` of them): a rank that is late every time (slower hardware, more data) makes
  its own wait the median, yet it is the most important straggler to name.

Steps are the steady ones (``analysis.steps.basis_steps``), like the rest of the report. Wait
that neuron_prof caused (``matched.own_ns``) is left out of what a rank caused.

Times are int64 ns. DataFrames in, DataFrames out.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from neuron_prof.analysis.steps import basis_steps

SHARE = 0.1
"""A significant straggler made the others wait at least this share of the median steady step."""
NOISE = 3.0
"""... and more than this many robust standard deviations above the median step's top wait."""
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


def _caused(matched: pd.DataFrame, steady: set[int]) -> pd.DataFrame:
    """Wait caused per steady step and rank: the waits of the collectives it is the root of
    (``matched.root_rank``: it arrived last, or made the last rank late), less what neuron_prof's
    own work made of them (``own_ns``; collectives seen on one rank cause no wait)."""
    m = matched[matched["step"].isin(steady) & (matched["ranks_seen"].str.len() > 1)]
    m = m.assign(caused=m["wait_ns"] - m["own_ns"])
    return (m.groupby(["step", "root_rank"])["caused"].sum().rename_axis(["step", "rank"])
            .reset_index(name="wait_caused_ns"))


def noise_floor_ns(top_waits: np.ndarray) -> float:
    """Median + ``NOISE`` robust standard deviations of the steps' top waits."""
    if not len(top_waits):
        return 0.0
    mid = float(np.median(top_waits))
    return mid + NOISE * 1.4826 * float(np.median(np.abs(top_waits - mid)))


def straggler_steps(matched: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per steady step with collectives seen on more than one rank: the rank that caused the most
    wait in it (``rank``, ``wait_caused_ns``) and whether that is ``significant`` (module
    docstring); ``threshold_ns``: the wait a step needed, the same for every step."""
    cols = ["step", "rank", "wait_caused_ns", "significant", "threshold_ns"]
    steady, median_step = steady_steps(steps)
    caused = _caused(matched, steady)
    if caused.empty:
        return pd.DataFrame(columns=cols)
    top = caused.sort_values(["step", "wait_caused_ns", "rank"], ascending=[True, False, True]).drop_duplicates("step")
    wait = top["wait_caused_ns"].to_numpy(np.float64)
    persistent = top["rank"].nunique() == 1 and len(top) >= PERSISTENT_MIN
    floor = 0.0 if persistent else noise_floor_ns(wait)
    significant = (wait >= SHARE * median_step) & (wait > floor)
    return top.assign(significant=significant, threshold_ns=max(SHARE * median_step, floor))[cols].reset_index(drop=True)


def stragglers(matched: pd.DataFrame, waits: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, over the steady steps, worst first: ``steps`` (those in which it was the
    significant straggler: ``straggler_steps``), ``times_last`` (the collectives it arrived last
    at, making others wait, in those steps), ``wait_caused_ns`` (the waits of all the collectives
    it arrived last at, in any steady step, less neuron_prof's own), its ``share`` of all the
    wait caused, and ``waited_ns`` (how long it waited for others itself)."""
    cols = ["rank", "times_last", "wait_caused_ns", "share", "steps", "waited_ns"]
    steady, _ = steady_steps(steps)
    caused = _caused(matched, steady)
    if caused.empty:
        return pd.DataFrame(columns=cols)
    m = matched[matched["step"].isin(steady) & (matched["ranks_seen"].str.len() > 1)]
    ranks = sorted({int(r) for rs in m["ranks_seen"] for r in rs})
    per = caused.groupby("rank")["wait_caused_ns"].sum().reindex(ranks, fill_value=0)
    sig = straggler_steps(matched, steps)
    sig = sig[sig["significant"]]
    named = [sorted(map(int, sig.loc[sig["rank"] == r, "step"])) for r in ranks]
    at = m[m["wait_ns"] > m["own_ns"]]
    times = [int(((at["root_rank"] == r) & at["step"].isin(s)).sum()) for r, s in zip(ranks, named)]
    waited = waits[waits["step"].isin(steady)].groupby("rank")["wait_ns"].sum().reindex(ranks, fill_value=0)
    total = float(per.sum())
    out = pd.DataFrame({"rank": ranks, "times_last": times,
                        "wait_caused_ns": per.to_numpy(np.int64),
                        "share": per.to_numpy() / total if total else 0.0, "steps": named,
                        "waited_ns": waited.to_numpy(np.int64)})
    # worst first: the most significant steps, then the most wait caused (a rank at the root of a
    # long chain of small waits in one step is not worse than one that stalls the job every 10 steps)
    out["n_steps"] = out["steps"].str.len()
    return out.sort_values(["n_steps", "wait_caused_ns", "rank"], ascending=[False, False, True],
                           ignore_index=True)[cols]
