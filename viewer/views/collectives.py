"""Collectives: no collector records collective events yet, so this page says so plainly; with more
than one rank it compares step time per rank and ranks the stragglers
(``analysis.steps.straggler_ranking``): that part is real data."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from neuron_prof.analysis.steps import straggler_ranking
from neuron_prof.viewer import data
from neuron_prof.viewer.charts import step_time_chart

run = data.load()
s = data.summary()

st.title("Collectives")
data.no_data("collective data",
             "Per-collective events (all-reduce, all-gather, ... with their sizes, wait and transfer time per rank) "
             "would come from a `collectives` collector, which neuron_prof does not have yet. Today: run every "
             "`torch.distributed` rank under `neuron-prof record` (or `neuron_prof.profile` in each rank) to compare "
             "step times per rank below; communication ops (c10d, Gloo, NCCL) show up on the Ops and Timeline pages "
             "and as `communication` in the Overview's time split.")

split = pd.DataFrame(s["time_split"])
if len(split) and split["communication_ms"].gt(0).any():
    st.subheader("Communication ops seen in the steady steps")
    st.dataframe(split[["rank", "steps", "step_ms", "communication_ms"]], hide_index=True, column_config={
        "step_ms": st.column_config.NumberColumn("step ms", format="%.2f"),
        "communication_ms": st.column_config.NumberColumn("communication ms/step", format="%.3f")})
    st.caption("top-level collective ops (c10d::, gloo:, nccl:) on the calling thread, mean per steady step")

st.subheader("Step time per rank")
if len(run.ranks) < 2:
    st.caption(f"this run has one rank ({run.ranks[0] if run.ranks else '-'}): nothing to compare across ranks")
    st.stop()
ranking = straggler_ranking(run.step_kinds)
if ranking.empty:
    st.caption("no step that every rank completed: nothing to compare")
    st.stop()
top = ranking.iloc[0]
st.markdown(f"**rank {int(top['rank'])}** was the slowest in **{int(top['slowest'])} of {int(top['steps'])}** "
            f"steady steps every rank completed ({top['slowest_pct']:.0f}%), on average "
            f"{top['behind_fastest_ms']:.2f} ms behind the fastest rank.")
st.plotly_chart(step_time_chart(run.step_kinds[run.step_kinds["complete"]]), width="stretch")
st.caption("straggler ranking: which rank is slowest most often")
st.dataframe(ranking, hide_index=True, column_config={
    "steps": "steps compared", "slowest": "slowest in",
    "slowest_pct": st.column_config.NumberColumn("slowest %", format="%.0f"),
    "mean_ms": st.column_config.NumberColumn("mean ms", format="%.2f"),
    "median_ms": st.column_config.NumberColumn("median ms", format="%.2f"),
    "behind_fastest_ms": st.column_config.NumberColumn("ms behind the fastest", format="%.2f")})
