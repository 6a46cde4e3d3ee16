"""Ops: the op table of the steady captured steps, as the report scopes it (``analysis.ops.op_stats``
over ``run_time_ops``), optionally split by input shapes, self time along the module path as a
treemap (``analysis.ops.module_tree``), FLOPs, MFU and a roofline of the ops (or device kernels)
against the peaks (``analysis.flops``), the precision mix with the ops autocast left in fp32, and
what activation checkpointing re-ran (the report's sections)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from neuron_prof.analysis.ops import filter_tree, module_tree, op_stats
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.summary.build import peak_for, with_peak
from neuron_prof.reports.summary.sections import Peak, Summary
from neuron_prof.viewer import data
from neuron_prof.viewer.text import md, plot_array

MAX_ROWS = 2000  # op table rows sent to the browser (the table is sorted by self time first)


def _scope(run) -> tuple[pd.DataFrame, int]:
    """The report's op scope (``RunAnalysis.scoped_ops``) and what "per step" divides by."""
    analysis = analyze(run)
    return analysis.scoped_ops(("name", "module", "shapes", "bwd", "recompute")), analysis.op_basis.per_rank


@st.cache_data(max_entries=8, show_spinner="aggregating ops ...")
def _op_table(path: str, mtime: float, shapes: bool) -> tuple[pd.DataFrame, int, int]:
    ops, n = _scope(data.load(Path(path)))
    stats = op_stats(ops, ("name", "module", "shapes") if shapes else ("name", "module"))
    if n:
        stats["self_ms_per_step"] = stats["self_ms"] / n
        stats["total_ms_per_step"] = stats["total_ms"] / n
    return stats, n, len(ops)


@st.cache_data(max_entries=4, show_spinner="building the module tree ...")
def _tree(path: str, mtime: float) -> pd.DataFrame:
    ops, _ = _scope(data.load(Path(path)))
    return module_tree(ops, ops["self_ns"].to_numpy())


def roofline_figure(points: pd.DataFrame, peak: Peak, what: str) -> go.Figure:
    """Achieved FLOP/s over arithmetic intensity, log-log, one marker per row of ``points``
    (``OpEfficiency`` or ``KernelEfficiency`` rows with an intensity and a rate), under the
    roof of ``peak``: bandwidth x intensity up to the ridge point, the peak FLOP/s after it (the
    part of it a peak gives, when only one is known)."""
    fig = go.Figure(go.Scatter(
        x=points["intensity"], y=points["tflops"] * 1e12, mode="markers+text", name=what,
        text=plot_array(points["name"]), textposition="top center",
        customdata=np.column_stack([plot_array(points["name"]), points["flops_per_step"], points["ms_per_step"]]),
        hovertemplate="%{customdata[0]}<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s<br>%{customdata[1]:.3g} FLOP and "
                      "%{customdata[2]:.3f} ms per step<extra></extra>"))
    flop_s = peak.tflops * 1e12 if peak.tflops else None
    byte_s = peak.gbps * 1e9 if peak.gbps else None
    ridge = flop_s / byte_s if flop_s and byte_s else None
    xs = [*points["intensity"], *([ridge] if ridge else [])]
    lo, hi = min(xs) / 10, max(xs) * 10
    if ridge:
        fig.add_scatter(x=[lo, ridge, hi], y=[lo * byte_s, flop_s, flop_s], mode="lines", name="roof")
    elif flop_s:
        fig.add_scatter(x=[lo, hi], y=[flop_s, flop_s], mode="lines", name="roof (compute)")
    elif byte_s:
        fig.add_scatter(x=[lo, hi], y=[lo * byte_s, hi * byte_s], mode="lines", name="roof (memory)")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)")
    fig.update_yaxes(type="log", title="achieved FLOP/s")
    fig.update_layout(margin=dict(t=10, l=0, r=0, b=0))
    return fig


def _efficiency(summary: Summary) -> None:
    """FLOPs per step and MFU per rank, and the roofline of the ops or device kernels, against the
    peaks the report uses with no flag (given here, or measured on this machine for a CPU run)."""
    e = summary.efficiency
    if not any(x.flops_per_step for x in e.ranks):
        return
    st.subheader("FLOPs, MFU and roofline")
    default = peak_for(summary)  # as the report with no peak flag
    state = st.session_state
    if summary.run.device == "cpu" and st.button("measure this machine's CPU peaks", key="ops_calibrate",
                                                 help="a matmul and a copy, about 0.1 s: the report's --calibrate"):
        state["ops_peak_measured"] = peak_for(summary, calibrate=True)
        state["ops_peak_tflops"] = float(state["ops_peak_measured"].tflops)
        state["ops_peak_gbps"] = float(state["ops_peak_measured"].gbps)
    state.setdefault("ops_peak_tflops", float(default.tflops or 0.0))
    state.setdefault("ops_peak_gbps", float(default.gbps or 0.0))
    left, right = st.columns(2)
    tflops = left.number_input("peak TFLOP/s", min_value=0.0, format="%.4g", key="ops_peak_tflops",
                               help="0: unknown (the report's --peak-tflops)")
    gbps = right.number_input("peak GB/s", min_value=0.0, format="%.4g", key="ops_peak_gbps",
                              help="0: unknown (the report's --peak-gbps)")
    peak = next((p for p in (default, state.get("ops_peak_measured"))
                 if p is not None and (tflops, gbps) == (float(p.tflops or 0.0), float(p.gbps or 0.0))),
                Peak(tflops=tflops or None, gbps=gbps or None, source="given here"))
    e = with_peak(summary, peak).efficiency
    st.dataframe(pd.DataFrame(e.ranks), hide_index=True, column_config={
        "flops_per_step": st.column_config.NumberColumn("FLOP/step", format="%.4g"),
        "bytes_per_step": st.column_config.NumberColumn("bytes/step", format="%.4g"),
        "step_ms": st.column_config.NumberColumn("step ms", format="%.3f"),
        "tflops": st.column_config.NumberColumn("achieved TFLOP/s", format="%.4g"),
        "mfu_pct": st.column_config.NumberColumn("MFU %", format="%.2f"),
        "unknown_per_step": "FLOPs unknown (ops/step)", "uncounted_per_step": "not counted (ops/step)"})
    st.caption(f"per {e.basis} step: forward and backward FLOPs as torch's FlopCounterMode counts them, over the "
               f"step's wall time; peak: {md(peak.source)}")
    kinds = (["device kernels (device time)"] if e.kernels else []) + ["ops (run time)"]
    shown = st.radio("points", kinds, horizontal=True, key="ops_roofline_points") if len(kinds) > 1 else kinds[0]
    rows = pd.DataFrame(e.kernels if shown.startswith("device") else e.ops)
    ranks = sorted(rows["rank"].unique())
    rank = st.selectbox("rank", ranks, key="ops_roofline_rank") if len(ranks) > 1 else ranks[0]
    rows = rows[rows["rank"] == rank]
    points = rows[(rows["intensity"].notna()) & (rows["tflops"].fillna(0) > 0)]
    if points.empty:
        st.info("no op with both a known byte count and a run time to place on the roofline")
    else:
        st.plotly_chart(roofline_figure(points, peak, shown.split(" (")[0]), width="stretch")
    st.dataframe(rows.drop(columns=["rank"]), hide_index=True, column_config={
        "flops_per_step": st.column_config.NumberColumn("FLOP/step", format="%.4g"),
        "bytes_per_step": st.column_config.NumberColumn("bytes/step", format="%.4g"),
        "ms_per_step": st.column_config.NumberColumn("ms/step", format="%.3f"),
        "tflops": st.column_config.NumberColumn("TFLOP/s", format="%.4g"),
        "intensity": st.column_config.NumberColumn("FLOP/byte", format="%.3g"),
        "roof_pct": st.column_config.NumberColumn("% of roof", format="%.1f")})
    if e.unknown:
        st.markdown("**FLOPs left out**")
        st.dataframe(pd.DataFrame(e.unknown), hide_index=True, column_config={"name": "op"})


path = data.run_path()
data.load(path)
mtime = data.stamp(path)

st.title("Ops")
shapes = st.toggle("split by input shapes", key="ops_shapes",
                   help="group by (op, module, input shapes) instead of (op, module)")
stats, n_captured, n_ops = _op_table(str(path), mtime, shapes)
if stats.empty:
    data.no_data("op events", "Capture with the `eager` collector (on by default) and call `prof.step()` once "
                              "per iteration (or use an optimizer under `neuron-prof record`).")
    st.stop()

scope = f"{n_captured} steady captured steps" if n_captured else "no complete captured step"
st.caption(f"{scope} (warm-up steps and ops run while compiling left out), {n_ops:,} op events, {len(stats):,} "
           "groups · self time = time not spent in nested ops · click a column header to sort")
cols = ["name", "module", *(["shapes"] if shapes else []), "calls", "self_ms", "self_pct",
        *(["self_ms_per_step", "total_ms_per_step"] if n_captured else []), "total_ms", "mean_us", "backward",
        "recompute"]
table = stats[cols].head(MAX_ROWS)
table = table.assign(module=table["module"].astype(str).replace("", "-"))  # as the report prints "no module"
st.dataframe(table, hide_index=True, column_config={
    "name": "op", "self_ms": st.column_config.NumberColumn("self ms", format="%.3f"),
    "self_pct": st.column_config.NumberColumn("self %", format="%.1f"),
    "self_ms_per_step": st.column_config.NumberColumn("self ms/step", format="%.3f"),
    "total_ms_per_step": st.column_config.NumberColumn("total ms/step", format="%.3f"),
    "total_ms": st.column_config.NumberColumn("total ms", format="%.3f"),
    "mean_us": st.column_config.NumberColumn("mean µs", format="%.1f"),
    "backward": st.column_config.CheckboxColumn("backward"),
    "recompute": st.column_config.CheckboxColumn("recompute", help="a forward op the backward pass re-ran "
                                                                   "(activation checkpointing)")})
if len(stats) > MAX_ROWS:
    st.caption(f"showing the top {MAX_ROWS:,} of {len(stats):,} groups by self time")

st.subheader("Self time by module path")
tree = _tree(str(path), mtime)
text = st.text_input("filter modules", key="ops_module_filter", placeholder="e.g. self_attn or layers.0")
shown = filter_tree(tree, text)
if shown.empty:
    st.info(f"no module path contains {md(repr(text))}")
else:
    labels = shown.assign(**{c: plot_array(shown[c]) for c in ("id", "parent", "label")})  # run text: no HTML
    fig = px.treemap(labels, ids="id", parents="parent", names="label", values="total_ms",
                     branchvalues="total", hover_data={"self_ms": ":.3f", "calls": True})
    fig.update_traces(root_color="lightgrey", hovertemplate="%{id}<br>self time here and below: %{value:.3f} ms"
                                                            "<br>own self time: %{customdata[0]:.3f} ms"
                                                            "<br>own ops: %{customdata[1]}<extra></extra>")
    fig.update_layout(margin=dict(t=10, l=0, r=0, b=0))
    st.plotly_chart(fig, width="stretch")
    st.caption(f"area = self time of a module's ops and its submodules' ({tree['total_ms'].iloc[0]:.3f} ms in all); "
               "ops outside any module count to the root")
    st.dataframe(shown.rename(columns={"id": "module"}).drop(columns=["parent", "label"]), hide_index=True,
                 column_config={"self_ms": st.column_config.NumberColumn("own self ms", format="%.3f"),
                                "total_ms": st.column_config.NumberColumn("self ms incl. submodules", format="%.3f"),
                                "calls": "own ops"})

summary = data.summary(path)
_efficiency(summary)
precision = summary.precision
if any(m.precision in ("bf16", "fp16") for m in precision.mix):
    st.subheader("Precision")
    what = "device time" if precision.time == "device" else "op self time"
    st.dataframe(pd.DataFrame(precision.mix), hide_index=True, column_config={
        "ms_per_step": st.column_config.NumberColumn(f"{what} ms/step", format="%.3f"),
        "pct": st.column_config.NumberColumn("%", format="%.1f")})
    st.caption("each op's precision is the dtype it computed in (its floating inputs'); cast: casts and copies")
    if precision.left_in_fp32:
        st.markdown("**Forward ops autocast left in fp32**")
        st.dataframe(pd.DataFrame(precision.left_in_fp32).assign(
            user_sources=[", ".join(x.user_sources) for x in precision.left_in_fp32]), hide_index=True,
            column_config={"name": "op", "ms_per_step": st.column_config.NumberColumn("ms/step", format="%.3f"),
                           "pct": st.column_config.NumberColumn("%", format="%.1f"), "user_sources": "called at"})
if summary.recompute:
    st.subheader("Recomputed by activation checkpointing")
    st.dataframe(pd.DataFrame(summary.recompute).assign(
        user_sources=[", ".join(x.user_sources) for x in summary.recompute]), hide_index=True, column_config={
        "module": "checkpointed module", "reruns": "re-runs",
        "ms_per_step": st.column_config.NumberColumn("ms/step", format="%.3f"),
        "pct_of_backward": st.column_config.NumberColumn("% of backward", format="%.1f"), "user_sources": "called at"})
    st.caption("forward ops the backward pass ran again, self time per steady step, by the module all ops of a "
               "re-run lie in")
