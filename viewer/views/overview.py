"""Overview: run facts, step time per rank, where the time goes, and the findings of every analysis."""
from __future__ import annotations

import time

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.findings import findings
from neuron_prof.reports.summary.sections import DeviceSection, NotCaptured, Summary
from neuron_prof.viewer import data
from neuron_prof.viewer.charts import step_time_chart
from neuron_prof.viewer.text import md, plot

_ICONS = {"high": ":material/error:", "medium": ":material/warning:", "info": ":material/info:"}
_PAGE_TITLES = {"overview": "Overview", "timeline": "Timeline", "device": "Device", "compile": "Graph breaks / Compile",
                "memory": "Memory", "collectives": "Collectives", "ops": "Ops", "compare": "Compare"}


def _device_split(device: DeviceSection | NotCaptured) -> pd.DataFrame:
    """Per rank, the busiest device's busy and idle ms per steady step and the host's wait for it
    (the report's Device verdict rows, which are means over their steps, weighted by them); empty
    when the run has no device data."""
    v = pd.DataFrame(device.verdict) if isinstance(device, DeviceSection) else pd.DataFrame()
    if v.empty:
        return v
    w = v.assign(busy=v["busy_ms"] * v["steps"], idle=v["idle_ms"] * v["steps"], wait=v["wait_ms"] * v["steps"])
    g = w.groupby("rank")
    n = g["steps"].sum()
    return pd.DataFrame({"device": g["device"].first(), "steps": n, "busy_ms": g["busy"].sum() / n,
                         "idle_ms": g["idle"].sum() / n, "wait_ms": g["wait"].sum() / n}).reset_index()


def _split_with_device(long: pd.DataFrame, device: pd.DataFrame) -> go.Figure:
    """The host's split of a step per rank and, under it, its busiest device's busy and idle time:
    one bar each, the host's labelled "host", the device's by its name."""
    host = long.assign(row=[f"rank {r} · host" for r in long["rank"]])
    dev = device.melt(id_vars=["rank", "device"], value_vars=["busy_ms", "idle_ms"], var_name="kind",
                      value_name="ms per step")
    dev = dev.assign(kind="device " + dev["kind"].str[:-3],
                     row=[f"rank {r} · {plot(d)}" for r, d in zip(dev["rank"], dev["device"])])
    both = pd.concat([host.assign(lane=0), dev.assign(lane=1)], ignore_index=True)
    fig = px.bar(both, x="ms per step", y="row", color="kind", orientation="h", labels={"row": ""})
    order = both.sort_values(["rank", "lane"], kind="stable")["row"].unique().tolist()
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])  # rank 0's host bar on top
    return fig


def _show_findings(box, summary: Summary) -> None:
    """Run facts and the findings of every analysis (the report's), in ``box`` under the metrics."""
    facts = summary.run
    with box:
        st.caption(f"torch {md(facts.torch_version)} · world size {md(facts.world_size)} · started {md(facts.start_time)}")
        st.subheader("Findings")
        found = findings(summary)
        if not found:
            st.success("Nothing stands out: no graph breaks, recompiles, leaks, sync points or collector failures.")
        for f in found:
            with st.container(border=True):
                left, right = st.columns([5, 1])
                left.markdown(f"{_ICONS[f.severity]} {md(f.text)}")  # names from the run: as typed
                if f.page != "overview":
                    right.page_link(f"views/{f.page}.py", label=f"see {_PAGE_TITLES[f.page]}")


run = data.load()
meta = run.meta

# first what needs only the run's metadata and step table (fast at any size), then the analyses
# (at once when the run holds a fresh stored summary, else computed after the step-time chart)
st.title("Overview")
cmd = " ".join(meta["command"]) if isinstance(meta.get("command"), list) else (meta.get("command") or "?")
st.code(cmd, language=None, wrap_lines=True)  # the recorded command, as typed: never Markdown
kinds = analyze(run).step_kinds
steps = analyze(run).step_time.stats
startup = run.spans[run.spans["name"].astype(str) == "start-up"]
cols = st.columns(6)
cols[0].metric("device", md(meta.get("device") or "?"))
cols[1].metric("ranks", len(run.ranks))
cols[2].metric("steps", int(steps["steps"].sum()) if len(steps) else 0,
               help="complete steps; warm-up steps (a rank's first step, steps that compiled) are left out of the "
                    "statistics")
cols[3].metric("steady steps", int(steps["steady"].sum()) if len(steps) else 0)
cols[4].metric("median step", f"{steps['median_ms'].median():.2f} ms" if len(steps) else "-",
               help="median over the steady steps")
cols[5].metric("start-up", f"{startup['dur'].max() / 1e9:.2f} s" if len(startup) else "-",
               help="from capture start to the first module call (imports, model and data set-up); not a step")
findings_box = st.container()
s = data.stored_summary()  # stored in the run and fresh: the findings at once, before any chart
if s is not None:
    _show_findings(findings_box, s)

st.subheader("Step time")
shown = kinds[kinds["complete"]]
if shown.empty:
    data.no_data("completed steps", "Call `prof.step()` once per iteration, or use an optimizer under "
                                    "`neuron-prof record`.")
else:
    st.plotly_chart(step_time_chart(shown), width="stretch")
    if len(startup):
        st.caption(" · ".join(f"rank {r}: start-up {d / 1e9:.2f} s before step 0"
                              for r, d in zip(startup["rank"], startup["dur"])) + " (not a step, not drawn)")

if s is None:
    time.sleep(0.1)  # let the server send what is drawn before the analyses hold the GIL for seconds
    s = data.summary()
    _show_findings(findings_box, s)

st.subheader("Where a steady step's time goes")
split = pd.DataFrame(s.time_split)
if split.empty:
    data.no_data("captured steps with ops", "Capture at least one complete step with the `eager` collector.")
else:
    long = split.melt(id_vars=["rank"], value_vars=[c for c in split.columns if c.endswith("_ms") and c != "step_ms"],
                      var_name="kind", value_name="ms per step")
    long["kind"] = long["kind"].str[:-3]
    device = _device_split(s.device)
    if device.empty:
        fig = px.bar(long, x="ms per step", y=long["rank"].astype(str), color="kind", orientation="h",
                     labels={"y": "rank"})
    else:
        fig = _split_with_device(long, device)
    st.plotly_chart(fig, width="stretch")
    st.dataframe(split.rename(columns=lambda c: c.replace("_ms", " ms")).round(3), hide_index=True)
    if len(device):
        st.dataframe(device.rename(columns={"busy_ms": "device busy ms", "idle_ms": "device idle ms",
                                            "wait_ms": "host waits ms"}).round(3), hide_index=True)
        st.caption("On an asynchronous device the host's **sync** is its measured wait for the device (the queue "
                   "flushes), and the second bar of each rank is the device itself: its busiest device running "
                   "kernels (busy) or idle, per steady step; both over the same steps.")
        st.page_link("views/device.py", label="see Device")
