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


PHASES = ("forward", "backward", "optimizer", "outside_ops")
_OPTIMIZER_PREFIX = "Optimizer."  # torch.optim's record_function ranges: Optimizer.step#Adam.step, ...


def step_breakdown(ops: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Where each captured step's wall time went, per rank, mean ms per step.

    Counts top-level ops (depth 0) on each thread: ``optimizer`` = torch.optim's step/zero_grad
    ranges, ``backward`` = ops run for autograd's backward pass, ``forward`` = every other op.
    ``outside_ops`` = step time not covered by a top-level op on the step's busiest thread: Python
    between ops, data loading, waiting. Backward running on another thread (an accelerator's
    autograd thread) overlaps the calling thread's wait, so phases can sum past 100%.
    """
    cols = ["rank", "steps", "step_ms", *(f"{p}_ms" for p in PHASES), *(f"{p}_pct" for p in PHASES)]
    done = steps[steps["complete"] & steps["active"]]
    top = ops[(ops["depth"] == 0) & ops["step"].isin(done["step"])]
    if done.empty or top.empty:
        return pd.DataFrame(columns=cols)
    is_opt = top["name"].astype(str).str.startswith(_OPTIMIZER_PREFIX).to_numpy()
    phase = pd.Series(["forward"] * len(top), index=top.index)
    phase[top["bwd"].to_numpy()] = "backward"
    phase[is_opt] = "optimizer"
    per = top.assign(phase=phase).groupby(["rank", "phase"])["dur"].sum().unstack(fill_value=0)
    # the busiest thread's covered time, per rank and step, gives what ran outside any op
    covered = top.groupby(["rank", "step", "tid"])["dur"].sum().groupby(["rank", "step"]).max()
    rows = []
    for rank, s in done.groupby("rank"):
        n = len(s)
        step_ns = s["dur"].sum()
        cov = covered.loc[rank].reindex(s["step"]).fillna(0).sum() if rank in covered.index.get_level_values(0) else 0
        ms = {p: (per.loc[rank, p] if rank in per.index and p in per.columns else 0) / n / 1e6 for p in PHASES[:3]}
        ms["outside_ops"] = max(step_ns - cov, 0) / n / 1e6
        step_ms = step_ns / n / 1e6
        rows.append({"rank": rank, "steps": n, "step_ms": step_ms, **{f"{p}_ms": v for p, v in ms.items()},
                     **{f"{p}_pct": 100 * v / step_ms if step_ms else 0.0 for p, v in ms.items()}})
    return pd.DataFrame(rows, columns=cols)


TIME_KINDS = ("compute", "communication", "sync", "compile", "idle")
_COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "record_param_comms")


def time_split(ops: pd.DataFrame, steps: pd.DataFrame, compiles: pd.DataFrame,
               sync: pd.DataFrame) -> pd.DataFrame:
    """Where a captured step's time goes, per rank, mean ms per step: ``compute`` (top-level
    ops that are neither communication nor sync points), ``communication`` (top-level
    collective ops: ``c10d::``, NCCL/Gloo ranges), ``sync`` (sync points: the host waiting for
    the device), ``compile`` (torch.compile frame compiles inside the steps) and ``idle`` (step
    time on the busiest thread outside any op, less compile time: Python, data loading).
    ``sync`` is ``analysis.sync.sync_points`` of the ops."""
    cols = ["rank", "steps", "step_ms", *(f"{k}_ms" for k in TIME_KINDS)]
    done = steps[steps["complete"] & steps["active"]]
    top = ops[(ops["depth"] == 0) & ops["step"].isin(done["step"])]
    if done.empty or top.empty:
        return pd.DataFrame(columns=cols)
    names = top["name"].astype(str)
    comm = names.str.startswith(_COMM_PREFIXES).to_numpy()
    rows = []
    for rank, s in done.groupby("rank"):
        n = len(s)
        t = top[top["rank"] == rank]
        c = comm[(top["rank"] == rank).to_numpy()]
        busiest = t.groupby(["step", "tid"])["dur"].sum().groupby("step").max().sum()
        sy = sync[(sync["rank"] == rank) & sync["step"].isin(s["step"])]["dur"].sum() if len(sync) else 0
        comp = compiles[(compiles["rank"] == rank) & compiles["step"].isin(s["step"])]["dur"].sum() \
            if len(compiles) else 0
        comm_ns = t["dur"].to_numpy()[c].sum()
        ops_ns = t["dur"].sum()
        idle = max(s["dur"].sum() - busiest - comp, 0)
        ms = {"compute": (ops_ns - comm_ns - sy) / n / 1e6, "communication": comm_ns / n / 1e6,
              "sync": sy / n / 1e6, "compile": comp / n / 1e6, "idle": idle / n / 1e6}
        rows.append({"rank": rank, "steps": n, "step_ms": s["dur"].sum() / n / 1e6,
                     **{f"{k}_ms": max(v, 0.0) for k, v in ms.items()}})
    return pd.DataFrame(rows, columns=cols)


def straggler_ranking(steps: pd.DataFrame) -> pd.DataFrame:
    """Which rank holds the others up: over the complete steps every rank has, per rank: ``steps``
    compared, ``slowest`` (steps in which this rank took longest) and its share ``slowest_pct``,
    ``mean_ms`` / ``median_ms`` of its step time, and ``behind_fastest_ms``: the mean of its step
    time minus the fastest rank's in the same step. Most often slowest first; empty with < 2 ranks."""
    cols = ["rank", "steps", "slowest", "slowest_pct", "mean_ms", "median_ms", "behind_fastest_ms"]
    done = steps[steps["complete"]]
    if done.empty or done["rank"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    ms = done.assign(ms=done["dur"] / 1e6).pivot_table(index="step", columns="rank", values="ms", aggfunc="max")
    ms = ms.dropna()  # only steps every rank completed are comparable
    if ms.empty:
        return pd.DataFrame(columns=cols)
    slowest = ms.idxmax(axis=1).value_counts().reindex(ms.columns, fill_value=0)
    out = pd.DataFrame({
        "steps": len(ms),
        "slowest": slowest.astype(int),
        "slowest_pct": 100 * slowest / len(ms),
        "mean_ms": ms.mean(),
        "median_ms": ms.median(),
        "behind_fastest_ms": ms.sub(ms.min(axis=1), axis=0).mean(),
    }).rename_axis("rank").reset_index()
    out["rank"] = out["rank"].astype(int)
    return out.sort_values(["slowest", "mean_ms"], ascending=False, ignore_index=True)[cols]
