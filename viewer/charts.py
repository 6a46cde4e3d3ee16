"""Charts more than one line long, built from analysis frames (kept out of the page scripts so
tests can check what they draw)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from neuron_prof.viewer.text import plot, plot_array

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


WAIT_COLOR = "#d62728"
"""Waiting for the last rank: red in every collectives chart, the one thing the eye should find."""
OPEN_COLOR = "#7f7f7f"


def collective_lanes(rows: pd.DataFrame, zero: int) -> go.Figure:
    """One lane per rank of a step's collectives (``analysis.collective_match.waits`` rows: aligned
    start and end, wait_ns, late_rank), in ms from ``zero`` on rank 0's clock: each rank's wait for
    the last rank in red, then the collective itself in its op's colour. A collective that never
    completed is drawn grey to the latest end in the step."""
    start = rows["start"].to_numpy(np.int64)
    end = rows["end"].to_numpy(np.int64)
    unfinished = end < 0
    latest = int(end[~unfinished].max()) if (~unfinished).any() else int(start.max())
    end = np.where(unfinished, np.maximum(latest, start), end)
    wait = np.minimum(rows["wait_ns"].to_numpy(np.int64), end - start)
    lane = np.array([f"rank {r}" for r in rows["rank"]], dtype=object)
    op = rows["op"].astype(str).to_numpy()
    hover = plot_array([f"{o} (group {g}, seq {q}) · {b:,} bytes · waited {w / 1e6:.2f} ms"
                        + (f" for rank {k}" if w > 0 else "") + f" · {s}"
                        for o, g, q, b, w, k, s in zip(op, rows["group"].astype(str), rows["seq"], rows["bytes"], wait,
                                                       rows["late_rank"], rows["status"].astype(str))])
    ms = lambda a: a / 1e6  # noqa: E731
    fig = go.Figure()
    w = wait > 0
    fig.add_trace(go.Bar(y=lane[w], x=ms(wait[w]), base=ms(start[w] - zero), orientation="h", name="wait for the last rank",
                         marker_color=WAIT_COLOR, customdata=hover[w], hovertemplate="%{customdata}<extra>wait</extra>"))
    for name in sorted(set(op[~unfinished])):
        k = (op == name) & ~unfinished
        fig.add_trace(go.Bar(y=lane[k], x=ms(end[k] - start[k] - wait[k]), base=ms(start[k] + wait[k] - zero),
                             orientation="h", name=plot(name), customdata=hover[k],
                             hovertemplate="%{customdata}<extra></extra>"))
    if unfinished.any():
        k = unfinished
        fig.add_trace(go.Bar(y=lane[k], x=ms(end[k] - start[k] - wait[k]), base=ms(start[k] + wait[k] - zero),
                             orientation="h", name="never completed", marker_color=OPEN_COLOR, customdata=hover[k],
                             hovertemplate="%{customdata}<extra>never completed</extra>"))
    order = [f"rank {r}" for r in sorted(set(rows["rank"]))]
    fig.update_layout(barmode="overlay", xaxis_title="ms (rank 0's clock)", legend_title_text="",
                      height=max(250, 40 * len(order) + 120))
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    return fig


def wait_heatmap(waited: pd.DataFrame) -> go.Figure:
    """Rank x step: the ms each rank waited in collectives for the last rank to arrive
    (``analysis.stragglers.waited``: each instant once, however many collectives it waited for at
    the time). A straggler's steps are the columns where every other rank's cell is hot."""
    w = waited[waited["step"] >= 0]
    z = w.pivot_table(index="rank", columns="step", values="waited_ns", aggfunc="sum", fill_value=0) / 1e6
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=[str(s) for s in z.columns], y=[f"rank {r}" for r in z.index],
                               colorscale="Reds", zmin=0, colorbar={"title": {"text": "ms"}},
                               hovertemplate="%{y}, step %{x}: waited %{z:.2f} ms<extra></extra>"))
    fig.update_layout(xaxis_title="step", xaxis_type="category", height=min(900, max(250, 22 * len(z.index) + 120)))
    fig.update_yaxes(autorange="reversed")
    return fig
