"""Graph breaks / Compile: break sites with their stack and source, recompiles and their failed
guards, compile time by frame and phase, compile caches, fusion groups, compiled graphs at run time.

Every table is a ``neuron_prof.analysis.compile`` function over the run (the report's numbers)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.summary.sections import BreakSite
from neuron_prof.viewer import data
from neuron_prof.viewer.source import show_source
from neuron_prof.viewer.text import md, plot_array



@st.cache_data(max_entries=4, show_spinner="timing compiled graphs ...")
def _graph_runs(path: str, mtime: float) -> pd.DataFrame:
    return analyze(data.load(Path(path))).compiled.graph_runs


def _recorded_files(run, stack_ids) -> set[str]:
    """Every file named by the given recorded stacks: the only files this page will ever open."""
    return {f for rank, sid in stack_ids for f, _, _ in run.stack(int(rank), int(sid))}


def _show_site(run, site: BreakSite) -> None:
    rows = run.graph_breaks[(run.graph_breaks["source"].astype(str) == site.source)
                            & (run.graph_breaks["reason_class"].astype(str) == site.reason_class)]
    st.markdown(f"**{md(site.reason_class)}** at {md(site.source)} · {md(site.gb_id)} · {site.breaks} "
                f"breaks · {site.hits_per_step:.1f} hits/step · {site.frame_ms_per_step:.3f} frame ms/step · "
                f"compile ids {md(', '.join(site.compile_ids))}")
    with st.expander("full reason", expanded=False):
        st.code(site.reason, language=None)
    if rows.empty:
        return
    # the stack recorded most often for this site (they normally all agree)
    rank, sid = rows.groupby(["rank", "stack"], observed=True).size().idxmax()
    frames = run.stack(int(rank), int(sid))
    left, right = st.columns(2)
    with left:
        st.caption("user stack (innermost first)")
        st.dataframe(pd.DataFrame([{"#": i, "function": fn, "file": run.display_path(f), "line": ln}
                                   for i, (f, fn, ln) in enumerate(frames)]), hide_index=True)
    with right:
        if not frames:
            st.caption("no stack was recorded for this break")
            return
        file, _, line = frames[0]
        allowed = _recorded_files(run, rows[["rank", "stack"]].drop_duplicates().itertuples(index=False))
        show_source(run, int(rank), file, line, allowed)


run = data.load()
compiled = data.summary().compile
path = data.run_path()
runs = _graph_runs(str(path), data.stamp(path))

st.title("Graph breaks / Compile")
if not compiled.frames_compiled and not compiled.graph_break_events and runs.empty:
    data.no_data("torch.compile activity",
                 "Run a `torch.compile`d model under `neuron_prof.profile(...)` or `neuron-prof record` with the "
                 "`compiler` collector on (it is by default): graph breaks, recompiles, compile time, caches, "
                 "fusions and the compiled graphs' run time show up here.")
    st.stop()

cols = st.columns(4)
cols[0].metric("frame compiles", compiled.frames_compiled)
cols[1].metric("compile time", f"{compiled.compile_ms:.0f} ms")
cols[2].metric("graph break sites", compiled.graph_breaks, help=f"{compiled.graph_break_events} graph breaks in all")
cols[3].metric("recompiles", compiled.recompiles)
if compiled.cache_limit_hit:
    hit = [r.func for r in compiled.recompiles_by_frame if r.cache_limit_hit]
    st.error(f"**The recompile (cache size) limit was hit** for {md(', '.join(hit))}: "
             "those frames run eagerly, uncompiled, for the rest of the run. Fix the recompiles below "
             "(or mark the changing dimension dynamic) rather than raising the limit.",
             icon=":material/error:")

st.subheader("Graph breaks by site")
sites = compiled.break_sites
if not sites:
    st.success("No graph breaks: every compiled frame traced in one graph.")
else:
    st.dataframe(pd.DataFrame(sites)[["source", "reason_class", "breaks", "hits_per_step", "frame_ms_per_step",
                                      "gb_id", "compile_ids", "reason"]],
                 hide_index=True, column_config={
                     "reason_class": "class",
                     "hits_per_step": st.column_config.NumberColumn("hits/step", format="%.1f"),
                     "frame_ms_per_step": st.column_config.NumberColumn("frame ms/step", format="%.3f"),
                     "gb_id": "gb id", "compile_ids": st.column_config.ListColumn("compile ids")})
    st.caption("frame ms/step: the graph before the break plus the break's eager code, until the resumed frame.")
    pick = st.selectbox("break site", range(len(sites)), key="compile_site",
                        format_func=lambda i: f"{sites[i].source} · {sites[i].reason_class}")
    _show_site(run, sites[pick])

st.subheader("Recompiles by frame")
rec = pd.DataFrame(compiled.recompiles_by_frame)
if rec.empty:
    st.caption("no recompiles: every frame's guards held")
else:
    st.dataframe(rec[["func", "recompiles", "cache_limit_hit", "reasons"]], hide_index=True, column_config={
        "func": "frame", "cache_limit_hit": st.column_config.CheckboxColumn("cache limit hit"),
        "reasons": st.column_config.ListColumn("failed guards", width="large")})
    with st.expander("failed guards, one per line"):
        for r in compiled.recompiles_by_frame:
            st.markdown(f"**{md(r.func)}** ({r.recompiles} recompiles"
                        + (", :red[CACHE LIMIT HIT]" if r.cache_limit_hit else "") + ")")
            st.code("\n".join(r.reasons) or "(no failed guard recorded)", language=None)

st.subheader("Compile time by frame and phase")
ctime = analyze(run).compiled.times
if ctime.empty:
    st.caption("no frame compiles recorded (the `compiler` collector was off)")
else:
    base = ["compile_id", "func", "backend", "status", "graph_ops", "total_ms"]
    phases = [col for col in ctime.columns if col not in base]
    st.dataframe(ctime, hide_index=True, column_config={
        "func": "frame", "graph_ops": "ops", "total_ms": st.column_config.NumberColumn("total ms", format="%.1f"),
        **{p: st.column_config.NumberColumn(f"{p} ms", format="%.1f") for p in phases}})
    if phases:
        long = ctime.assign(frame=plot_array(ctime["compile_id"] + " " + ctime["func"].astype(str))).melt(
            id_vars=["frame", "total_ms"], value_vars=phases, var_name="phase", value_name="ms").dropna(subset=["ms"])
        long["phase"] = plot_array(long["phase"])  # phase names are run text; the legend renders HTML
        fig = px.bar(long, x="ms", y="frame", color="phase", orientation="h",
                     labels={"ms": "compile time (ms)", "frame": "compile"})
        fig.update_yaxes(categoryorder="total ascending")
        st.plotly_chart(fig, width="stretch")

st.subheader("FX graph / AOT autograd caches")
cache = analyze(run).compiled.cache
if cache.empty:
    st.caption("no cache lookups recorded (the inductor backend looks its caches up; eager and aot_eager don't)")
else:
    st.dataframe(cache, hide_index=True, column_config={
        "hit_rate": st.column_config.ProgressColumn("hit rate", format="percent", min_value=0, max_value=1)})

st.subheader("Fusion groups per kernel")
fus = analyze(run).compiled.fusions
if fus.empty:
    st.caption("no fused kernels recorded (inductor generates them; eager and aot_eager don't fuse)")
else:
    st.dataframe(fus, hide_index=True, column_config={
        "fused": "fused nodes", "nodes": st.column_config.ListColumn("FX nodes", width="large")})

st.subheader("Compiled graphs at run time")
if runs.empty:
    st.caption("no compiled region ran inside the captured ops (capture with the `eager` collector)")
else:
    st.dataframe(runs, hide_index=True, column_config={
        "compile_id": "compile id", "runs_per_step": st.column_config.NumberColumn("runs/step", format="%.1f"),
        "total_ms": st.column_config.NumberColumn("total ms", format="%.3f"),
        "self_ms": st.column_config.NumberColumn("self ms", format="%.3f"),
        "self_ms_per_step": st.column_config.NumberColumn("self ms/step", format="%.3f")})
    st.caption("self: time inside the compiled region outside the regions nested in it (frames resumed after "
               "a break run inside the frame that broke).")
