"""Ops: the op table of the steady captured steps, as the report scopes it (``analysis.ops.op_stats``
over ``run_time_ops``), optionally split by input shapes, self time along the module path as a
treemap (``analysis.ops.module_tree``), the precision mix with the ops autocast left in fp32, and
what activation checkpointing re-ran (the report's sections)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis.ops import filter_tree, module_tree, op_stats
from neuron_prof.analysis.run_analysis import analyze
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
