"""The training's scalars per step: ``Run.metrics`` (one row per value handed over) in, one value
per (rank, step, name) out.

A step can hand a name over several times: gradient accumulation calls ``backward()`` once per
micro-batch. Counts (``tokens``, ``samples``) add up over the step, and so does the ``loss``: a
loop that accumulates divides each micro-batch's loss by the number of micro-batches before
``backward()`` (Hugging Face's Trainer and Lightning do), so the sum of what ``backward()`` ran on
is the step's loss as those frameworks log it. Every other scalar (a learning rate) is the mean of
the step's values.
"""
from __future__ import annotations

import pandas as pd

SUMMED = ("tokens", "samples", "loss")
"""Scalars whose values within one step add up."""


def per_step(metrics: pd.DataFrame) -> pd.DataFrame:
    """Columns rank, step, name, value, values (how many were handed over); sorted. Values of no
    step (handed over before the first step began, step -1) are left out."""
    m = metrics[metrics["step"] >= 0]
    if m.empty:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int32"),
                             "name": pd.Series(dtype="object"), "value": pd.Series(dtype="float64"),
                             "values": pd.Series(dtype="int64")})
    m = m.assign(name=m["name"].astype(str))
    g = m.groupby(["rank", "step", "name"], sort=True)["value"]
    out = g.agg(["mean", "sum", "size"]).reset_index()
    summed = out["name"].isin(SUMMED)
    out["value"] = out["sum"].where(summed, out["mean"])
    return out.rename(columns={"size": "values"})[["rank", "step", "name", "value", "values"]]


def series(metrics: pd.DataFrame, name: str, rank: int | None = None) -> pd.Series:
    """One scalar's per-step values of one rank (default: the lowest rank that has it), indexed
    by step."""
    return step_values(per_step(metrics), name, rank)


def step_values(steps: pd.DataFrame, name: str, rank: int | None = None) -> pd.Series:
    """:func:`series` from :func:`per_step`'s frame (for a caller that needs several of its names)."""
    p = steps[steps["name"] == name]
    if p.empty:
        return pd.Series(dtype="float64", name=name)
    rank = int(p["rank"].min()) if rank is None else rank
    p = p[p["rank"] == rank]
    return pd.Series(p["value"].to_numpy(), index=p["step"].to_numpy(), name=name)


def summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per rank and scalar, over its per-step values: steps, first, last, min, max, mean."""
    cols = ["rank", "name", "steps", "first", "last", "min", "max", "mean"]
    p = per_step(metrics)
    if p.empty:
        return pd.DataFrame(columns=cols)
    g = p.groupby(["rank", "name"], sort=True)["value"]
    out = g.agg(steps="size", first="first", last="last", min="min", max="max", mean="mean").reset_index()
    return out[cols]
