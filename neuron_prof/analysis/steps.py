"""Step-time statistics per rank (complete steps only: the partial step at exit is not a step)."""
from __future__ import annotations

import pandas as pd


def step_stats(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, captured (detailed) steps, and step-time mean/median/p90/min/max/std in ms."""
    done = steps[steps["complete"]]
    cols = ["rank", "steps", "captured", "mean_ms", "median_ms", "p90_ms", "min_ms", "max_ms", "std_ms"]
    if done.empty:
        return pd.DataFrame(columns=cols)
    ms = done.assign(ms=done["dur"] / 1e6).groupby("rank")
    out = pd.DataFrame({
        "steps": ms.size(),
        "captured": ms["active"].sum().astype(int),
        "mean_ms": ms["ms"].mean(),
        "median_ms": ms["ms"].median(),
        "p90_ms": ms["ms"].quantile(0.9),
        "min_ms": ms["ms"].min(),
        "max_ms": ms["ms"].max(),
        "std_ms": ms["ms"].std(ddof=0),
    }).reset_index()
    return out[cols]
