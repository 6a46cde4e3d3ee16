"""Charts more than one line long, built from analysis frames (kept out of the page scripts so
tests can check what they draw)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

OFF_SCALE = 3.0  # warm-up steps this many times the slowest steady step are drawn clipped


def step_time_chart(kinds: pd.DataFrame) -> go.Figure:
    """Step time per rank from ``analysis.steps.step_kinds`` rows (complete steps): steady steps
    as lines, warm-up steps (a rank's first step, steps that compiled) as separate markers. The
    y axis fits the steady steps, so one first step that compiled for a minute does not flatten
    the rest: warm-up steps far above it sit at the top edge, labelled with their real time."""
    fig = go.Figure()
    ms = kinds["dur"] / 1e6
    steady_ms = ms[kinds["steady"].to_numpy()]
    clip = len(steady_ms) > 0 and float(ms.max()) > OFF_SCALE * float(steady_ms.max())
    top = 1.25 * float(steady_ms.max()) if clip else None
    for rank, k in kinds.groupby("rank"):
        steady, warm = k[k["steady"]], k[k["warmup"]]
        fig.add_trace(go.Scatter(x=steady["step"], y=steady["dur"] / 1e6, mode="lines+markers",
                                 name=f"rank {rank}", hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>"))
        if warm.empty:
            continue
        wms = (warm["dur"] / 1e6).to_numpy()
        off = wms > top if clip else np.zeros(len(wms), dtype=bool)
        fig.add_trace(go.Scatter(
            x=warm["step"], y=np.where(off, top, wms), mode="markers+text", name=f"rank {rank} warm-up",
            text=[f"{v / 1e3:.1f} s" if o else "" for v, o in zip(wms, off)], textposition="bottom center",
            marker={"symbol": "triangle-up", "size": 11}, customdata=np.column_stack([wms, warm["compile_ns"] / 1e6]),
            hovertemplate="warm-up step %{x}: %{customdata[0]:.1f} ms, of which %{customdata[1]:.1f} ms "
                          "compiling<extra></extra>"))
    if clip:
        fig.update_yaxes(range=[0, top * 1.05])
    fig.update_layout(xaxis_title="step", yaxis_title="step time (ms)", legend_title_text="")
    return fig
