"""Timeline: one step of one rank, thread by thread: the ops the user called (and optionally the
ones directly inside them), compiles and graph breaks, and live memory; the whole run opens in
Perfetto UI.

What is drawn comes from ``neuron_prof.analysis.timeline``; at most a chosen number of bars (the
longest in the window) go to the browser.
"""
from __future__ import annotations

import base64
import html
import json
import math
import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from neuron_prof.analysis import timeline as tla
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.errors import NeuronProfError
from neuron_prof.viewer import data
from neuron_prof.viewer import trace as run_trace
from neuron_prof.viewer.text import md, plot, plot_array

EMBED_LIMIT = 50 << 20  # a bigger trace is offered as a download only (it would travel as base64 in the page)
MEMORY_POINTS = 2000
PERFETTO = "https://ui.perfetto.dev"
_PASS_COLORS = {"forward": "#4C78A8", "backward": "#F58518"}


def _run(path: str):
    return data.load(Path(path))


@st.cache_data(max_entries=8, show_spinner=False)
def _choices(path: str, mtime: float, rank: int) -> pd.DataFrame:
    run = _run(path)
    return tla.step_choices(analyze(run).step_kinds, run.ops, rank, run.spans)


@st.cache_data(max_entries=32, show_spinner="finding the ops in the window ...")
def _bars(path: str, mtime: float, rank: int, step: int, t0: int, t1: int, depth: int,
          limit: int) -> tuple[pd.DataFrame, int]:
    o = tla.window_ops(_run(path).ops, rank, step, t0, t1, depth)
    bars = tla.longest_ops(o, limit)[["thread", "depth", "name", "module", "source", "ts", "dur", "bwd"]]
    return bars.reset_index(drop=True), len(o)


@st.cache_data(max_entries=32, show_spinner=False)
def _compiles(path: str, mtime: float, rank: int, t0: int, t1: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    run = _run(path)
    return (tla.in_window(run.compiles, rank, t0, t1).reset_index(drop=True),
            tla.in_window(run.graph_breaks, rank, t0, t1).reset_index(drop=True))


@st.cache_data(max_entries=32, show_spinner="live memory in the window ...")
def _memory(path: str, mtime: float, rank: int, t0: int, t1: int) -> pd.DataFrame:
    return tla.memory_window(analyze(_run(path)).memory_allocations, rank, t0, t1, MEMORY_POINTS)


@st.cache_resource
def _trace_lock() -> threading.Lock:
    """One per server process (a page script's own globals are made anew on every run)."""
    return threading.Lock()


@st.cache_resource
def _spare_dir() -> Path:
    """This server's own folder for traces of runs it may not write to (private: made anew)."""
    return Path(tempfile.mkdtemp(prefix="neuron_prof-traces-"))


def _trace_file(path: str, mtime: float) -> Path:
    with _trace_lock():
        return run_trace.trace_file(Path(path), mtime, lambda: _run(path), _spare_dir())


def _trace_bytes(path: str, mtime: float) -> bytes:
    with run_trace.open_trace(_trace_file(path, mtime)) as f:
        return f.read()


def _perfetto_html(trace: bytes, title: str, file_name: str) -> str:
    """A button that opens ui.perfetto.dev in a new tab and hands it the trace (Perfetto's
    window.open + PING/PONG + postMessage protocol). A click inside the frame opens the tab:
    browsers block tabs a page opens by itself."""
    payload = base64.b64encode(trace).decode("ascii")

    def js(v: str) -> str:  # a JS string literal that cannot end the <script> element
        return json.dumps(v).replace("</", "<\\/")

    return f"""<div style="font-family: sans-serif; font-size: 14px">
<button id="open" style="padding: 6px 12px; cursor: pointer">Open the trace in ui.perfetto.dev</button>
<span id="status" style="margin-left: 8px; color: #555">{html.escape(f"{len(trace) / 2**20:.1f} MiB")}</span></div>
<script>
const ORIGIN = {js(PERFETTO)};
const TITLE = {js(title)};
const FILE_NAME = {js(file_name)};
const TRACE_B64 = "{payload}";
const status = document.getElementById("status");
document.getElementById("open").onclick = () => {{
  const win = window.open(ORIGIN);
  if (!win) {{ status.textContent = "the browser blocked the new tab: allow pop-ups for this page"; return; }}
  status.textContent = "waiting for Perfetto UI ...";
  const bin = atob(TRACE_B64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  let tries = 0;
  const timer = setInterval(() => {{
    if (++tries > 1200) {{ clearInterval(timer); status.textContent = "Perfetto UI did not answer"; return; }}
    win.postMessage("PING", ORIGIN);
  }}, 50);
  const onMessage = (evt) => {{
    if (evt.origin !== ORIGIN || evt.data !== "PONG") return;
    clearInterval(timer);
    window.removeEventListener("message", onMessage);
    win.postMessage({{perfetto: {{buffer: bytes.buffer, title: TITLE, fileName: FILE_NAME}}}}, ORIGIN);
    status.textContent = "sent to Perfetto UI";
  }};
  window.addEventListener("message", onMessage);
}};
</script>"""


def _show_html(source: str, height: int) -> None:
    if hasattr(st, "iframe"):  # Streamlit >= 1.5x: components.v1.html's replacement
        st.iframe(source, height=height)
    else:
        import streamlit.components.v1 as components
        components.html(source, height=height)


def _reset_window() -> None:
    st.session_state.pop("tl_window", None)


st.title("Timeline")
path = data.run_path()
run = data.load(path)
mtime = data.stamp(path)
key = str(path)

ops = run.ops
if ops.empty:
    data.no_data("ops", "Ops are recorded by the `eager` collector (on by default) in captured steps: call "
                        "`prof.step()` once per iteration, or use an optimizer under `neuron-prof record`.")
    st.stop()

c = st.columns([1, 2, 1, 1])
rank = c[0].selectbox("rank", sorted(int(r) for r in ops["rank"].unique()), key="tl_rank", on_change=_reset_window)
choices = _choices(key, mtime, rank)
steps = [int(s) for s in choices["step"]]
before = "start-up" if (run.spans["name"].astype(str) == "start-up").any() else "before the first step"
labels = {st_: (f"step {st_}" if st_ != tla.BEFORE_FIRST_STEP else before)
          + ("" if done or st_ == tla.BEFORE_FIRST_STEP else " (partial)") + (" · warm-up" if warm else "")
          + (" · captured" if active else "") + f" · {d / 1e6:.1f} ms · {n:,} ops"
          for st_, done, warm, active, d, n in zip(steps, choices["complete"], choices["warmup"], choices["active"],
                                                   choices["dur"], choices["ops"])}
first = tla.default_step(choices)
step = c[1].selectbox("step", steps, index=steps.index(first), key="tl_step", format_func=labels.get,
                      on_change=_reset_window)
depth = 1 if c[2].toggle("depth 1 too", key="tl_depth1", help="also draw the ops called directly inside them") else 0
limit = int(c[3].number_input("bars at most", min_value=100, max_value=10_000, value=2000, step=100,
                              key="tl_max_bars"))

s = choices[choices["step"] == step].iloc[0]
t0, dur = int(s["ts"]), int(s["dur"])
span_ms = dur / 1e6
res = 10.0 ** math.floor(math.log10(span_ms / 1000)) if span_ms > 0 else 0.001
top_ms = round(math.ceil(span_ms / res) * res, 9) if span_ms > 0 else res
lo, hi = st.slider("window (ms since the step began)", 0.0, top_ms, (0.0, top_ms), step=res, key="tl_window",
                   format=f"%.{max(3, -math.floor(math.log10(res)))}f")
w0, w1 = t0 + int(round(lo * 1e6)), t0 + int(round(hi * 1e6))

bars, in_window = _bars(key, mtime, rank, step, w0, w1, depth, limit)
compiles, breaks = _compiles(key, mtime, rank, w0, w1)
memory = _memory(key, mtime, rank, w0, w1)

if bars.empty and compiles.empty and breaks.empty:
    data.no_data("ops in this window", "Choose another step or widen the window; steps that were not captured "
                                       "have no ops.")
else:
    rows: list[str] = []
    thread = plot_array(bars["thread"].astype(str))  # run text: Plotly labels render HTML
    row = np.where(bars["depth"].to_numpy() > 0, np.char.add(thread.astype(str), " › depth 1"), thread)
    used = set(row)
    for t in dict.fromkeys(thread):
        rows += [t] + ([f"{t} › depth 1"] if f"{t} › depth 1" in used else [])
    if len(compiles) or len(breaks):
        rows.append("compile")
    with_memory = not memory.empty
    fig = make_subplots(rows=2 if with_memory else 1, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.75, 0.25] if with_memory else None)
    start = (bars["ts"].to_numpy() - t0) / 1e6
    for pass_, mask in (("forward", ~bars["bwd"].to_numpy()), ("backward", bars["bwd"].to_numpy())):
        if not mask.any():
            continue
        b = bars[mask]
        custom = np.column_stack([plot_array(b["name"]), plot_array(b["module"]), plot_array(b["source"]),
                                  b["ts"].to_numpy()]).astype(object)
        fig.add_trace(go.Bar(orientation="h", y=row[mask], x=b["dur"].to_numpy() / 1e6, base=start[mask],
                             name=pass_, marker_color=_PASS_COLORS[pass_], customdata=custom,
                             hovertemplate="%{customdata[0]}<br>module %{customdata[1]}<br>%{customdata[2]}"
                                           "<br>%{x:.3f} ms<extra>" + pass_ + "</extra>"), row=1, col=1)
    if len(compiles):
        custom = np.column_stack([plot_array(compiles["func"]), plot_array(compiles["compile_id"]),
                                  plot_array(compiles["status"]), plot_array(compiles["source"])]).astype(object)
        fig.add_trace(go.Bar(orientation="h", y=["compile"] * len(compiles), x=compiles["dur"].to_numpy() / 1e6,
                             base=(compiles["ts"].to_numpy() - t0) / 1e6, name="compile", marker_color="#B279A2",
                             customdata=custom,
                             hovertemplate="compile %{customdata[1]} of %{customdata[0]} (%{customdata[2]})"
                                           "<br>%{customdata[3]}<br>%{x:.3f} ms<extra>compile</extra>"), row=1, col=1)
    if len(breaks):
        custom = np.column_stack([plot_array(breaks["reason_class"]), plot_array(breaks["source"]),
                                  plot_array(breaks["compile_id"])]).astype(object)
        fig.add_trace(go.Scatter(x=(breaks["ts"].to_numpy() - t0) / 1e6, y=["compile"] * len(breaks), mode="markers",
                                 marker={"symbol": "x", "size": 10, "color": "#E45756"}, name="graph break",
                                 customdata=custom,
                                 hovertemplate="graph break: %{customdata[0]}<br>%{customdata[1]}"
                                               "<br>compile %{customdata[2]}<extra></extra>"), row=1, col=1)
    if with_memory:
        for device, m in memory.groupby("device", observed=True, sort=True):
            x = np.r_[(m["ts"].to_numpy() - t0) / 1e6, hi]  # the state holds to the window's end
            y = np.r_[m["total"].to_numpy(), m["total"].to_numpy()[-1]]
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=f"live bytes {plot(device)}",
                                     hovertemplate="%{y:,} bytes<extra>" + plot(device) + "</extra>"), row=2, col=1)
        fig.update_yaxes(title_text="live bytes", row=2, col=1)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=rows[::-1], row=1, col=1)
    fig.update_xaxes(range=[lo, hi])
    fig.update_xaxes(title_text=f"ms since step {step} began", row=2 if with_memory else 1, col=1)
    fig.update_layout(barmode="overlay", height=220 + 34 * len(rows) + (160 if with_memory else 0),
                      margin={"t": 30}, legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    st.plotly_chart(fig, width="stretch", key="tl_chart")
    what = "ops the user called (depth 0)" + (" and the ops directly inside them (depth 1)" if depth else "")
    drawn = (f"all {len(bars):,} {what} in the window" if len(bars) == in_window else
             f"the {len(bars):,} longest of the {in_window:,} {what} in the window (raise 'bars at most' or narrow "
             "the window to see the rest)")
    extra = []
    if len(compiles):
        extra.append(f"{len(compiles)} compiles")
    if len(breaks):
        extra.append(f"{len(breaks)} graph breaks")
    st.caption(f"Drawn: {drawn}" + (f"; {', '.join(extra)}" if extra else "") +
               ("; live memory of this rank (downsampled, peak kept)" if with_memory else "") + ".")

st.subheader("Perfetto")
st.caption("The whole run (every rank, op, step, compile and memory counter) as a Perfetto trace, written next to "
           f"the run as `{run_trace.TRACE_NAME}` and rewritten when the run changes.")
why_not = run_trace.blocked(path)
if why_not:  # a link or special file where the trace goes: never read, served or replaced
    st.warning(f"The trace is not shown: {md(why_not)}", icon=":material/block:")
    st.stop()
c = st.columns(2)
if c[0].button("Open in Perfetto", key="tl_perfetto", icon=":material/open_in_new:"):
    with st.spinner("writing the Perfetto trace ..."):
        trace_path = _trace_file(key, mtime)
    try:
        with run_trace.open_trace(trace_path) as f:
            size = os.fstat(f.fileno()).st_size
            body = f.read() if size <= EMBED_LIMIT else None
    except (OSError, NeuronProfError) as exc:  # it changed under us since it was written
        st.error(f"The trace is not shown: {md(exc)}")
        st.stop()
    if body is None:
        st.warning(f"The trace is {size / 2**20:.0f} MiB, too big to hand to Perfetto UI from this page: download it "
                   f"and open it in {PERFETTO} (Open trace file), or run "
                   f"`trace_processor --httpd` on {md(trace_path)}.")
    else:
        _show_html(_perfetto_html(body, f"neuron_prof: {Path(key).name}", run_trace.TRACE_NAME), height=48)
        st.caption(f"{md(trace_path)} · click the button above to open it in a new tab of {PERFETTO} (the trace goes "
                   "straight from this page to that tab; nothing is uploaded).")
c[1].download_button("Download the Perfetto trace", key="tl_trace_download", on_click="ignore",
                     data=lambda k=key, m=mtime: _trace_bytes(k, m), file_name=run_trace.TRACE_NAME,
                     mime="application/octet-stream", icon=":material/download:")
