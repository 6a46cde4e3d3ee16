"""Activation checkpointing's cost: the forward ops re-run inside the backward pass.

The observer marks them (``ops.recompute``: an op under a backward op that records autograd
history, and the ops under it), whether ``torch.utils.checkpoint`` re-ran them reentrant or not,
or a model's own ``gradient_checkpointing_enable()`` did. Their time is a phase of its own in "where
the time goes" (``analysis.ops.step_phases``); here it is grouped by the checkpointed module: the
module path all ops of one re-run share, which is what the user wrapped."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

RECOMPUTE_COLUMNS = ["rank", "module", "reruns", "ops", "ms_per_step", "pct_of_backward", "user_sources"]


def _common_module(modules: pd.Series) -> str:
    """The longest dotted module path every one of ``modules`` lies in (empty paths left out)."""
    paths = [m.split(".") for m in modules if m]
    if not paths:
        return ""
    return ".".join(os.path.commonprefix(paths))


def _lines(ops: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The user's line of each of ``rows``, else its innermost line: a device's autograd thread
    re-runs a block with no user frame on its stack (the library's line is the one there is)."""
    user = ops["user_source"].to_numpy()[rows].astype(str)
    return np.where(user != "", user, ops["source"].to_numpy()[rows].astype(str))


def recompute_by_module(ops: pd.DataFrame, parent: np.ndarray, self_ns: np.ndarray, keep: np.ndarray,
                        per_rank: int) -> pd.DataFrame:
    """Per rank and checkpointed module: re-runs (a re-run: the recomputed ops under one backward
    op), ops re-run, their self time per step of the ``keep`` rows' steps (``per_rank`` of them),
    its share of the backward pass's time (recompute included) and the user's lines that the
    re-runs' first ops came from (``_lines``). Costliest first; empty when nothing was recomputed."""
    if "recompute" not in ops.columns or not per_rank:
        return pd.DataFrame(columns=RECOMPUTE_COLUMNS)
    re = ops["recompute"].to_numpy(bool)
    if not (re & keep).any():
        return pd.DataFrame(columns=RECOMPUTE_COLUMNS)
    bwd = ops["bwd"].to_numpy(bool)
    # a re-run's root: a recomputed op whose parent is not one; its ops share its root's parent
    root = np.where(re, parent, -1)
    top = re & ~np.where(parent >= 0, re[np.maximum(parent, 0)], False)
    region = np.full(len(ops), -1, np.int64)
    region[top] = np.flatnonzero(top)  # each top op starts a region; ops under it join by its parent chain
    for _ in range(int(ops["depth"].to_numpy().max(initial=0))):
        inherit = re & (region < 0) & (root >= 0)
        if not inherit.any():
            break
        region[inherit] = region[root[inherit]]
    # top ops under the same backward op form one re-run
    rerun = np.where(region >= 0, parent[np.maximum(region, 0)], -1)
    mine = re & keep
    frame = pd.DataFrame({"rank": ops["rank"].to_numpy()[mine], "rerun": rerun[mine],
                          "module": ops["module"].to_numpy()[mine].astype(str), "self_ns": self_ns[mine],
                          "source": _lines(ops, mine)})
    backward_ns = pd.Series(self_ns[bwd & keep]).groupby(ops["rank"].to_numpy()[bwd & keep]).sum()
    reruns = frame.groupby(["rank", "rerun"], sort=False).agg(
        module=("module", _common_module), ops=("self_ns", "size"), self_ns=("self_ns", "sum"),
        source=("source", lambda s: next((x for x in s if x), ""))).reset_index()
    rows = []
    for (rank, module), g in reruns.groupby(["rank", "module"], sort=False):
        total = int(backward_ns.get(rank, 0))
        rows.append({"rank": int(rank), "module": module, "reruns": len(g), "ops": int(g["ops"].sum()),
                     "ms_per_step": g["self_ns"].sum() / 1e6 / per_rank,
                     "pct_of_backward": 100 * g["self_ns"].sum() / total if total else 0.0,
                     "user_sources": sorted({s for s in g["source"] if s})})
    return pd.DataFrame(rows, columns=RECOMPUTE_COLUMNS).sort_values("ms_per_step", ascending=False,
                                                                    ignore_index=True)
