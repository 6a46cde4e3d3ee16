"""Overview: run facts, step time per rank, where the time goes, and the findings of every analysis."""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis.steps import step_stats
from neuron_prof.findings import findings
from neuron_prof.viewer import data

_ICONS = {"high": ":material/error:", "medium": ":material/warning:", "info": ":material/info:"}
_PAGE_TITLES = {"overview": "Overview", "timeline": "Timeline", "compile": "Graph breaks / Compile",
                "memory": "Memory", "collectives": "Collectives", "ops": "Ops", "diff": "Diff"}

run = data.load()
meta = run.meta

# first what needs only the run's metadata and step table (fast at any size), then the analyses
st.title("Overview")
cmd = " ".join(meta["command"]) if isinstance(meta.get("command"), list) else (meta.get("command") or "?")
st.caption(f"`{cmd}`")
steps = step_stats(run.steps)
cols = st.columns(5)
cols[0].metric("device", meta.get("device") or "?")
cols[1].metric("ranks", len(run.ranks))
cols[2].metric("steps", int(steps["steps"].sum()) if len(steps) else 0)
cols[3].metric("captured steps", int(steps["captured"].sum()) if len(steps) else 0)
cols[4].metric("median step", f"{steps['median_ms'].median():.2f} ms" if len(steps) else "-")
findings_box = st.container()

st.subheader("Step time")
all_steps = run.steps[run.steps["complete"]].assign(ms=lambda d: d["dur"] / 1e6,
                                                   captured=lambda d: d["active"].map({True: "yes", False: "no"}))
if all_steps.empty:
    data.no_data("completed steps", "Call `prof.step()` once per iteration, or use an optimizer under "
                                    "`neuron-prof record`.")
else:
    fig = px.line(all_steps, x="step", y="ms", color=all_steps["rank"].astype(str), markers=True,
                  hover_data=["captured"], labels={"ms": "step time (ms)", "color": "rank"})
    st.plotly_chart(fig, width="stretch")

s = data.summary()
r = s["run"]
with findings_box:
    st.caption(f"torch {r['torch_version']} · world size {r['world_size']} · started {r['start_time']}")
    st.subheader("Findings")
    found = findings(s)
    if not found:
        st.success("Nothing stands out: no graph breaks, recompiles, leaks, sync points or collector failures.")
    for f in found:
        with st.container(border=True):
            left, right = st.columns([5, 1])
            left.markdown(f"{_ICONS[f['severity']]} {f['text']}")
            if f["page"] != "overview":
                right.page_link(f"views/{f['page']}.py", label=f"see {_PAGE_TITLES[f['page']]}")

st.subheader("Where a captured step's time goes")
split = pd.DataFrame(s["time_split"])
if split.empty:
    data.no_data("captured steps with ops", "Capture at least one complete step with the `eager` collector.")
else:
    long = split.melt(id_vars=["rank"], value_vars=[c for c in split.columns if c.endswith("_ms") and c != "step_ms"],
                      var_name="kind", value_name="ms per step")
    long["kind"] = long["kind"].str[:-3]
    fig = px.bar(long, x="ms per step", y=long["rank"].astype(str), color="kind", orientation="h",
                 labels={"y": "rank"})
    st.plotly_chart(fig, width="stretch")
    st.dataframe(split.rename(columns=lambda c: c.replace("_ms", " ms")).round(3), hide_index=True)
