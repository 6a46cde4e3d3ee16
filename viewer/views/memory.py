"""Memory: live bytes over time by category, each step's peak and what made it, leaks (with the
process's resident memory beside the tracked bytes), OOMs, the difference between two step
boundaries, and the run as a memory_viz snapshot.

Every number comes from ``neuron_prof.analysis.memory`` (through ``Run``). The expensive calls are
cached per run and stamp; tables are built from the selected rank, device and step only, and the
timeline is downsampled on the server (each bucket's minimum and maximum kept, so the peak shows).
"""
from __future__ import annotations

import pickle
from dataclasses import fields
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis import memory as mem
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.steps import captured_steps
from neuron_prof.analysis.timeline import memory_window
from neuron_prof.reports.findings import (LINES_NOTE, called_from, confirmation_text, figures_text, keeper_text, leak_cost,
                                  process_note)
from neuron_prof.reports.summary.sections import MemoryLeak, MemoryPeak
from neuron_prof.units import format_bytes
from neuron_prof.store.schema import MEMORY_FIGURES
from neuron_prof.viewer import data
from neuron_prof.viewer.text import md

TIMELINE_POINTS = 4000  # rows per device in a chart: min/max kept, so the peak is always drawn
DIFF_BY = ("source", "user_source", "category", "module", "top_op", "op")
SOURCE_LABELS = {"source": "source line", "user_source": "called from (your line)"}
WHOLE = "whole capture"


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Categorical columns as plain strings (the grid shows an empty category as "None")."""
    return df.astype({c: str for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})


def _row(kind: type, row: pd.Series):
    """A row of ``RunAnalysis.memory_peaks`` or ``RunAnalysis.memory_leaks`` as the summary's row of ``kind``
    (what the findings' sentences are written from)."""
    return kind(**{f.name: row[f.name] for f in fields(kind)})


def _run(path: str):
    return data.load(Path(path))


@st.cache_data(max_entries=4, show_spinner=False)
def _devices(path: str, mtime: float) -> dict[int, list[str]]:
    """rank -> the devices it has memory data for (the process's resident memory is the CPU's)."""
    run = _run(path)
    parts = [analyze(run).memory_allocations[["rank", "device"]], run.memory_steps[["rank", "device"]],
             run.memory_ooms[["rank", "device"]], run.process_memory[["rank"]].assign(device="cpu")]
    pairs = pd.concat([p.astype({"device": str}).drop_duplicates() for p in parts], ignore_index=True)
    return {int(r): sorted(set(g["device"])) for r, g in pairs.groupby("rank")}


@st.cache_data(max_entries=8, show_spinner=False)
def _sampled_only(path: str, mtime: float, rank: int, device: str) -> bool:
    """Whether ``device``'s allocator was followed in sampled steps only (always-on capture's CPU):
    it has no per-step rows, and its events are none (no dump) or end blocks ``unfollowed``."""
    run = _run(path)
    ev, ms = run.memory_events, run.memory_steps
    if ((ms["rank"] == rank) & (ms["device"].astype(str) == device)).any():
        return False
    mine = ev[(ev["rank"] == rank) & (ev["device"].astype(str) == device)]
    return mine.empty or (mine["kind"].astype(str) == "unfollowed").any()


@st.cache_data(max_entries=16, show_spinner="computing the memory timeline ...")
def _timeline(path: str, mtime: float, rank: int, device: str, step: int | None) -> pd.DataFrame:
    run = _run(path)
    if step is None:
        t = analyze(run).memory.timeline
    else:
        s = run.steps[(run.steps["rank"] == rank) & (run.steps["step"] == step)].iloc[0]
        t = memory_window(analyze(run).memory_allocations, rank, int(s["ts"]), int(s["ts"] + s["dur"]), TIMELINE_POINTS)
    return t[(t["rank"] == rank) & (t["device"].astype(str) == device)].reset_index(drop=True)


@st.cache_data(max_entries=4, show_spinner="finding each step's peak ...")
def _peaks(path: str, mtime: float) -> pd.DataFrame:
    return analyze(_run(path)).memory_peaks


@st.cache_data(max_entries=4, show_spinner="looking for leaks ...")
def _leaks(path: str, mtime: float) -> pd.DataFrame:
    return analyze(_run(path)).memory_leaks


@st.cache_data(max_entries=4, show_spinner=False)
def _figures(path: str, mtime: float, rank: int, device: str) -> tuple[str, str]:
    """Where the device's per-step figures come from (``analysis.memory.figures_from``): figures_from, api."""
    f = analyze(_run(path)).memory.figures_from
    f = f[(f["rank"] == rank) & (f["device"] == device)]
    return (str(f["figures_from"].iloc[0]), str(f["api"].iloc[0])) if len(f) else (MEMORY_FIGURES[0], "")


@st.cache_data(max_entries=4, show_spinner=False)
def _growth(path: str, mtime: float, rank: int, device: str) -> float:
    """The device's tracked tensors' growth per step (``RunAnalysis.memory.growth``)."""
    g = analyze(_run(path)).memory.growth
    return float(g[(g["rank"] == rank) & (g["device"].astype(str) == device)].iloc[0]["growth_per_step"])


@st.cache_data(max_entries=4, show_spinner=False)
def _process(path: str, mtime: float) -> pd.DataFrame:
    return analyze(_run(path)).memory.process_growth


@st.cache_data(max_entries=32, show_spinner="what was live at the peak ...")
def _sites(path: str, mtime: float, rank: int, device: str, ts: int, top: int) -> pd.DataFrame:
    return mem.peak_site_details(analyze(_run(path)).memory_allocations, rank, device, ts, top)


@st.cache_data(max_entries=32, show_spinner="comparing the two boundaries ...")
def _diff(path: str, mtime: float, rank: int, device: str, ts_a: int, ts_b: int, by: str) -> pd.DataFrame:
    return mem.snapshot_diff(analyze(_run(path)).memory_allocations, ts_a, ts_b, by, rank, device)


@st.cache_data(max_entries=4, show_spinner=False)
def _snapshot_ranks(path: str, mtime: float) -> list[int]:
    """The ranks a snapshot can be made of (those with allocator events)."""
    return sorted(int(r) for r in _run(path).memory_events["rank"].unique())


@st.cache_data(max_entries=1, show_spinner=False)  # ~275 bytes per allocation: keep one
def _snapshot_pickle(path: str, mtime: float, rank: int) -> bytes:
    """The memory_viz snapshot of one rank, pickled as ``torch.cuda.memory._dump_snapshot`` does."""
    from neuron_prof.export import memory_snapshot
    snap = memory_snapshot.snapshot(_run(path), rank)
    return pickle.dumps(snap, protocol=memory_snapshot.PICKLE_PROTOCOL)


st.title("Memory")
path = data.run_path()
run = data.load(path)
mtime = data.stamp(path)
key = str(path)

if run.memory_events.empty and run.memory_steps.empty and run.memory_ooms.empty and run.process_memory.empty:
    data.no_data("memory data", "The `memory` collector is on by default; this run was recorded without it "
                                "(e.g. `collectors=[\"eager\"]`). Record again with it on: `neuron-prof record "
                                "-o RUN -- python train.py`, or "
                                "`neuron_prof.profile(RUN, collectors=[\"eager\", \"memory\"])`.")
    st.stop()

devices = _devices(key, mtime)
left, right = st.columns(2)
rank = left.selectbox("rank", sorted(devices), key="mem_rank")
device = right.selectbox("device", devices[rank], key="mem_device")
figures, api = _figures(key, mtime, rank, device)
counted = figures == MEMORY_FIGURES[1]
no_lines = f"{LINES_NOTE[:1].upper()}{LINES_NOTE[1:]}." if counted else ""
if counted:
    st.caption("Bytes the backend counts on this device, read at each step boundary: its allocator does not report "
               "allocations to the profiler, so live is all of the device's allocated bytes (not only since capture "
               "began) and peak its high-water mark; there is no timeline, peak site or leaking line.")
elif _sampled_only(key, mtime, rank, device):
    st.caption("Bytes the allocator was asked for in the sampled steps: always-on capture follows this device's "
               "allocator inside them only (`follow_cpu_memory=True` follows it at every step), so live bytes "
               "count what each sampled step allocated, from zero; the process's resident memory below is every "
               "step's.")
else:
    st.caption("Bytes the allocator was asked for since capture began, per device.")
st.caption(f"Figures from {md(figures_text(figures, api))}.")

# ------------------------------------------------------------------ timeline
st.subheader("Live memory over time")
r_steps = run.steps[run.steps["rank"] == rank]
ranges = [WHOLE] + [int(s) for s in r_steps["step"]]
span = st.selectbox("range", ranges, key="mem_range",
                    format_func=lambda v: v if v == WHOLE else f"step {v}")
chosen = None if span == WHOLE else int(span)
tl = _timeline(key, mtime, rank, device, chosen)
if tl.empty:
    data.no_data(f"allocations on rank {rank} {device} in this range",
                 no_lines or "Allocations are recorded in captured steps.")
else:
    if chosen is None:
        origin = int(r_steps["ts"].min()) if len(r_steps) else int(tl["ts"].min())
        x, x_label = (tl["ts"] - origin) / 1e9, "time since the first step began (s)"
    else:
        origin = int(r_steps.loc[r_steps["step"] == chosen, "ts"].iloc[0])
        x, x_label = (tl["ts"] - origin) / 1e6, f"time since step {chosen} began (ms)"
    shown = [c for c in mem.CATEGORIES if tl[c].any()]
    long = tl.assign(x=x).melt(id_vars=["x"], value_vars=shown, var_name="category", value_name="bytes")
    fig = px.area(long, x="x", y="bytes", color="category", line_shape="hv",
                  category_orders={"category": list(mem.CATEGORIES)}, labels={"x": x_label, "bytes": "live bytes"})
    fig.update_layout(legend_title_text="", margin={"t": 30})
    st.plotly_chart(fig, width="stretch", key="mem_timeline_chart")
    top = tl.loc[tl["total"].idxmax()]
    st.caption(f"highest in this range: {format_bytes(top['total'])} ({int(top['total']):,} bytes); "
               f"{len(tl):,} points (downsampled on the server, each bucket's minimum and maximum kept)")

# ------------------------------------------------------------------ peaks
st.subheader("Peak")
peaks = _peaks(key, mtime)
peaks = peaks[(peaks["rank"] == rank) & (peaks["device"].astype(str) == device)].reset_index(drop=True)
if peaks.empty:
    data.no_data("captured steps with allocations on this device", no_lines or "Peaks are found in captured steps.")
else:
    st.dataframe(_plain(peaks[["step", "bytes", "op", "source", "user_source", "module", "alloc_bytes", "category"]]),
                 hide_index=True, key="mem_peaks_table",
                 column_config={"bytes": st.column_config.NumberColumn("peak bytes", format="%d"),
                                "op": "reached with (op)", "alloc_bytes": st.column_config.NumberColumn(
                                    "its size (bytes)", format="%d"), **SOURCE_LABELS})
    steps = [int(s) for s in peaks["step"]]
    worst = int(peaks.loc[peaks["bytes"].idxmax(), "step"])
    step = st.selectbox("step", steps, index=steps.index(worst), key="mem_peak_step",
                        format_func=lambda s: f"step {s}" + (" (the highest peak)" if s == worst else ""))
    p = peaks[peaks["step"] == step].iloc[0]
    made = (f", reached with {int(p['alloc_bytes']):,} bytes from {md(p['op'])} at {md(p['source'] or '?')}"
            f"{md(called_from(_row(MemoryPeak, p)))}" + (f" (module {md(p['module'])})" if p["module"] else "")
            + f" [{p['category']}]") if p["op"] else ""
    st.markdown(f"Step {step} peaked at **{format_bytes(p['bytes'])}** ({int(p['bytes']):,} bytes){made}.")
    top_n = st.number_input("sites to list", min_value=1, max_value=200, value=10, key="mem_top")
    sites = _sites(key, mtime, rank, device, int(p["ts"]), int(top_n))
    st.markdown(f"**Live at step {step}'s peak, by site**")
    st.dataframe(_plain(sites.drop(columns=["stack"])), hide_index=True, key="mem_sites_table",
                 column_config={"bytes": st.column_config.NumberColumn("bytes", format="%d"),
                                "largest": st.column_config.NumberColumn("largest block (bytes)", format="%d"),
                                "shape": "shape of the largest", "dtype": "its dtype",
                                "shapes": "distinct shapes", **SOURCE_LABELS})
    if len(sites):
        names = [f"{i + 1}. {src or '?'} · {op or '?'} · {cat}"
                 for i, (src, op, cat) in enumerate(zip(sites["source"], sites["op"], sites["category"]))]
        site = st.selectbox("user stack of the site", names, key="mem_site")
        frames = run.stack(rank, int(sites["stack"].iloc[names.index(site)]))
        if frames:
            st.code("\n".join(f"{run.display_path(file)}:{line}  {func}" for file, func, line in frames),
                    language=None)
            st.caption("innermost frame first: the line that allocated, then its callers")
        else:
            st.caption("no Python stack: the block was made before capture began or outside Python code")

# ------------------------------------------------------------------ leaks
st.subheader("Leaks")
leaks = _leaks(key, mtime)
leaks = leaks[(leaks["rank"] == rank) & (leaks["device"].astype(str) == device)].reset_index(drop=True)
if leaks.empty:
    st.success("No leak: live memory at the step boundaries does not keep growing step over step.")
else:
    x = leaks.iloc[0]
    g = float(x["growth_per_step"])
    mine = run.memory_steps[(run.memory_steps["rank"] == rank) & (run.memory_steps["device"].astype(str) == device)]
    severity, pace = leak_cost(g, int(mine["peak"].max()) if len(mine) else 0)
    card = {"high": st.error, "medium": st.warning, "info": st.info}[severity]
    card(f"Live memory grows **{format_bytes(g)} per step** ({g:,.0f} bytes/step) on rank {rank} {md(device)}: it grew at "
         f"{int(x['steps_growing'])} of the step boundaries checked; confidence {float(x['confidence']):.2f}"
         + "".join(f"; {md(n)}" for n in (pace, confirmation_text(_row(MemoryLeak, x))) if n) + ".")
    if counted:
        st.info(no_lines)
    sited = leaks[(leaks["source"] != "") | (leaks["op"] != "")]
    if len(sited):
        top = _row(MemoryLeak, sited.iloc[0])
        st.markdown(f"**Made from** {md(top.made_at or '? (no line in the step loop)')}"
                    + (f" via {md(top.source)} {md(top.op)}" if top.source and top.source != top.made_at else "")
                    + f"; **{md(keeper_text(top).lstrip(', '))}**.")
    note = process_note(_row(MemoryLeak, x))
    if note:
        st.warning(note[:1].upper() + note[1:] + ".")
    cols = st.columns(3)
    cols[0].metric("growth per step", format_bytes(g))
    cols[1].metric("confidence", f"{float(x['confidence']):.2f}")
    found = leaks[(leaks["source"] != "") | (leaks["op"] != "")]
    cols[2].metric("surviving sites", len(found))
    st.dataframe(_plain(found)[["made_at", "source", "user_source", "module", "op", "category", "grad",
                                "bytes_per_step", "blocks_per_step", "steps_seen", "steps_checked", "keeper",
                                "keeper_via", "keeper_note"]], hide_index=True,
                 key="mem_leaks_table",
                 column_config={"made_at": "made from (step loop)", "source": "surviving allocations from",
                                "user_source": SOURCE_LABELS["user_source"], "keeper": "kept alive by",
                                "keeper_via": "via", "keeper_note": "keeper not known",
                                "grad": st.column_config.CheckboxColumn("in an autograd graph"),
                                "bytes_per_step": st.column_config.NumberColumn("bytes/step", format="%d")})
ms = run.memory_steps
ms = ms[(ms["rank"] == rank) & (ms["device"].astype(str) == device)]
if len(ms):
    long = ms.melt(id_vars=["step"], value_vars=["live", "peak"], var_name="what", value_name="bytes")
    fig = px.line(long, x="step", y="bytes", color="what", markers=True,
                  labels={"bytes": "bytes", "what": "", "step": "step boundary (end of step)"})
    fig.update_layout(margin={"t": 30})
    st.plotly_chart(fig, width="stretch", key="mem_steps_chart")
    st.caption("live: allocated bytes at each step boundary; peak: "
               + ("the backend's high-water mark" if counted else "the highest since the boundary before"))
pm = run.process_memory
pm = pm[pm["rank"] == rank]
if len(pm):
    pg = _process(key, mtime)
    pg = pg[pg["rank"] == rank].iloc[0]
    per_step = pg["growth_per_step"]
    cols = st.columns(2)
    # always-on capture follows the CPU allocator in its sampled steps only: no per-step figure
    cols[0].metric("tracked tensors: growth per step",
                   format_bytes(_growth(key, mtime, rank, device)) if len(ms) else "not followed")
    cols[1].metric("process (RSS): growth per step", "not judged" if pd.isna(per_step) else format_bytes(per_step))
    fig = px.line(pm, x="step", y="rss", markers=True,
                  labels={"rss": "resident bytes", "step": "step boundary (end of step)"})
    fig.update_layout(margin={"t": 30})
    st.plotly_chart(fig, width="stretch", key="mem_process_chart")
    st.caption(f"the process's resident memory (RSS) at each step boundary, next to the allocator's view above: "
               f"Python objects, autograd graph nodes and native libraries show here, not there. Its growth is judged "
               f"over {int(pg['judged'])} boundaries: those of steps not captured, {mem.PROCESS_SETTLE_NS / 1e9:.0f} s "
               f"or more after a captured one "
               f"(the capture holds each captured step's events for a while), in the second half of the run")

# ------------------------------------------------------------------ OOMs
ooms = run.memory_ooms
ooms = ooms[ooms["rank"] == rank]
if len(ooms):
    st.subheader("Out of memory")
    for _, o in ooms.iterrows():
        st.error(f"rank {rank} {md(o['device'])}, step {o['step']}: asked for {int(o['bytes']):,} bytes: "
                 f"{md(o['message'])}")
    st.dataframe(_plain(ooms[["step", "device", "bytes", "message"]]), hide_index=True, key="mem_ooms_table")

# ------------------------------------------------------------------ diff
st.subheader("What changed between two step boundaries")
# allocations are recorded in captured steps: compare the boundaries of those
captured = captured_steps(r_steps)
bounds = mem.step_boundaries(captured if len(captured) else r_steps)
if len(bounds) < 2:
    data.no_data("two complete captured steps on this rank",
                 "A diff compares what was live at the end of two steps.")
else:
    steps = [int(s) for s in bounds["step"]]
    c = st.columns(3)
    step_a = c[0].selectbox("from the end of step", steps, index=0, key="mem_diff_a")
    step_b = c[1].selectbox("to the end of step", steps, index=len(steps) - 1, key="mem_diff_b")
    by = c[2].selectbox("by", DIFF_BY, key="mem_diff_by")
    ts = dict(zip(steps, bounds["ts"].astype(int)))
    diff = _diff(key, mtime, rank, device, int(ts[step_a]), int(ts[step_b]), by)
    net = int(diff["net"].sum()) if len(diff) else 0
    c = st.columns(3)
    c[0].metric("net growth", ("+" if net > 0 else "-" if net < 0 else "") + format_bytes(abs(net)))
    c[1].metric("appeared", format_bytes(int(diff["appeared"].sum()) if len(diff) else 0))
    c[2].metric("went away", format_bytes(int(diff["gone"].sum()) if len(diff) else 0))
    st.markdown(f"From the end of step {step_a} to the end of step {step_b}: net **{net:+,} bytes**.")
    st.dataframe(_plain(diff), hide_index=True, key="mem_diff_table")

# ------------------------------------------------------------------ memory_viz
st.subheader("memory_viz snapshot")
if rank in _snapshot_ranks(key, mtime):
    st.download_button(f"Download rank {rank}'s memory snapshot", key="mem_snapshot", on_click="ignore",
                       data=lambda k=key, m=mtime, r=rank: _snapshot_pickle(k, m, r),
                       file_name=f"memory-snapshot-rank{rank}.pickle",
                       mime="application/octet-stream", icon=":material/download:")
    st.caption("PyTorch's memory snapshot pickle (built when you click): open it in https://pytorch.org/memory_viz. "
               "Same as `neuron-prof export RUN --format memory-snapshot`.")
else:
    st.caption(f"rank {rank} has no allocation events to put in a snapshot")
