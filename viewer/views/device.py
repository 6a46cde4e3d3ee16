"""Device: what bounded each step on an asynchronous device (its busy and idle time, the host's
waits for it), one step's host ops and device kernels side by side with a line from each op to the
kernel that ran its work, the host's waits by line with the source around them, fusion, streams,
collectives that ran as device kernels (communication hidden or exposed, streams that waited for
them, the rank whose device reached them last), and the ops that fell back to the CPU.

On an asynchronous device an op returns once it is queued, so the host's op times say little:
every table and the per-step chart are the report's Device section (``summarize(run).device``,
computed by ``neuron_prof.analysis.device``), so the page and ``neuron-prof report``
say the same numbers. The lanes are one step of one rank, sliced out of the run's device tables
before any per-row work and cached, and at most ``MAX_BARS`` bars per kind and ``MAX_FLOWS``
lines go to the browser, so the page stays quick on a run of a million kernels.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from neuron_prof.analysis import timeline as tla
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.findings import Finding, device_straggler_text, findings, stall_site, user_line
from neuron_prof.reports.summary.sections import DeviceSection, DeviceThresholds, DeviceVerdict, Stall
from neuron_prof.units import format_bytes
from neuron_prof.viewer import data
from neuron_prof.viewer.source import show_source
from neuron_prof.viewer.text import md, plot, plot_array

MAX_BARS = 2000  # per kind (host ops, waits, fallbacks, kernels) in the lanes: the longest are drawn
MAX_FLOWS = 300  # op -> kernel lines in the lanes: the ops that waited longest in the queue
VERDICT_COLORS = {"device-bound": "#4C78A8", "host-bound": "#F58518", "balanced": "#72B7B2"}
IDLE_COLOR, WAIT_COLOR, FALLBACK_COLOR, OP_COLOR = "#d9d9d9", "#d62728", "#9467bd", "#4C78A8"
KERNEL_COLORS = {"fused kernel": "#2ca02c", "one-op kernel": "#98df8a"}
HOW = ("Device data (the eager queue, its kernels, the host's waits for it and CPU fallbacks) comes from a device "
       "backend that reports through neuron_prof's backend hook API (`collectors/neuron_prof_backend.h`, read by the "
       "`device` collector, on by default); CPU and CUDA runs have none. To try it without the hardware, enable the "
       "emulated `neuron` device, `neuron_prof.testing.neuron.enable()`, before moving the model to `\"neuron\"` (or "
       "run `neuron-prof demo --device neuron`); docs/device.md (linked from the README) says more about the backend "
       "hook API and the emulated `neuron` device.")


def _table(rows: list | pd.DataFrame, columns: dict[str, str]) -> None:
    """``rows`` (rows of the Device section, or a frame of them) as a grid of ``columns`` (field ->
    header): cells are literal text."""
    st.dataframe(pd.DataFrame(rows, columns=list(columns)).rename(columns=columns), hide_index=True)


def _share(verdicts: list[DeviceVerdict], share: Callable[[DeviceVerdict], float]) -> float | None:
    """The mean of ``share`` (a per-step share) over every rank's basis steps: the report's verdict
    rows are means over their steps, so they are weighted by them."""
    steps = sum(v.steps for v in verdicts)
    return sum(share(v) * v.steps for v in verdicts) / steps if steps else None


def _metrics(device: DeviceSection) -> None:
    """What bounds most steps, how busy the device is and how long the host waits for it, and the
    share of device ops that ran natively: the four figures to read before any chart."""
    v = device.verdict
    counts = pd.DataFrame(v).groupby("verdict")["steps"].sum().sort_values(ascending=False) if v else pd.Series()
    busy, wait = _share(v, lambda x: x.busy_pct), _share(v, lambda x: x.wait_pct)
    cov = device.coverage
    native, total = sum(c.native_ops for c in cov), sum(c.native_ops + c.fallback_ops for c in cov)
    per_rank = "; ".join(f"rank {x.rank}: {x.steps} {x.verdict}" for x in v)
    cols = st.columns(4)
    cols[0].metric("most steps are", counts.index[0] if len(counts) else "-",
                   help=f"over the {device.basis_steps} {device.basis} captured steps of each rank: {per_rank}" if v else
                   "no steady captured step")
    cols[1].metric("device busy", f"{busy:.0f}% of a step" if busy is not None else "-",
                   help="the busiest device's kernels, as a share of the step, averaged over the steps")
    cols[2].metric("host waits", f"{wait:.0f}% of a step" if wait is not None else "-",
                   help="the host's measured waits for the device (queue flushes), as a share of the step")
    cols[3].metric("coverage", f"{100 * native / total:.1f}%" if total else "-",
                   help=f"of {total:,} device ops, {native:,} ran natively, the rest fell back to the CPU")


def _step_chart(steps: pd.DataFrame, thresholds: DeviceThresholds) -> go.Figure:
    """Per complete step of one rank (the report's ``steps`` rows): the busiest device's busy
    share (coloured by the step's verdict, hatched for warm-up steps) stacked with its idle share,
    and the host's wait for it as a line; the verdict thresholds as dashed lines. In % of the step
    so a warm-up step of seconds does not flatten the rest (its ms are in the hover)."""
    fig = go.Figure()
    warm = steps["warmup"].fillna(False).astype(bool).to_numpy()
    hover = plot_array([f"step {s}{' (warm-up)' if w else ''}: {v} · {dur:.2f} ms · {dev} busy {b:.2f} ms "
                        f"({bp:.0f}%), idle {i:.2f} ms · the host waited {wt:.2f} ms ({wp:.0f}%)"
                        for s, w, v, dur, dev, b, bp, i, wt, wp in
                        zip(steps["step"], warm, steps["verdict"], steps["dur_ms"], steps["device"],
                            steps["busy_ms"], steps["busy_pct"], steps["idle_ms"], steps["wait_ms"], steps["wait_pct"])])
    pattern = np.where(warm, "/", "")
    for verdict, color in VERDICT_COLORS.items():
        k = (steps["verdict"] == verdict).to_numpy()
        if k.any():
            fig.add_trace(go.Bar(x=steps["step"][k], y=steps["busy_pct"][k], name=f"busy · {verdict}",
                                 marker={"color": color, "pattern": {"shape": pattern[k].tolist()}},
                                 customdata=hover[k], hovertemplate="%{customdata}<extra></extra>"))
    fig.add_trace(go.Bar(x=steps["step"], y=100 - steps["busy_pct"], name="idle", marker_color=IDLE_COLOR,
                         customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    fig.add_trace(go.Scatter(x=steps["step"], y=steps["wait_pct"], name="host waits for the device",
                             mode="lines+markers", line_color=WAIT_COLOR, customdata=hover,
                             hovertemplate="%{customdata}<extra></extra>"))
    for y, label in ((thresholds.device_bound_busy_pct, "device-bound above"),
                     (thresholds.host_bound_busy_pct, "host-bound below")):
        fig.add_hline(y=y, line_dash="dash", line_color="#7f7f7f", annotation_text=label,
                      annotation_position="top left")
    fig.update_layout(barmode="stack", xaxis_title="step", yaxis_title="% of the step", yaxis_range=[0, 105],
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, margin={"t": 30})
    return fig


@st.cache_data(max_entries=8, show_spinner=False)
def _choices(path: str, mtime: float, rank: int) -> pd.DataFrame:
    """The rank's steps the lanes can show (``analysis.timeline.step_choices``), without what came
    before the first step: this page is about steps."""
    run = data.load(Path(path))
    c = tla.step_choices(analyze(run).step_kinds, run.ops, rank, run.spans)
    return c[c["step"] != tla.BEFORE_FIRST_STEP].reset_index(drop=True)


def _longest(df: pd.DataFrame) -> pd.DataFrame:
    return tla.longest_ops(df, MAX_BARS)


@st.cache_data(max_entries=32, show_spinner="slicing the step ...")
def _step_slice(path: str, mtime: float, rank: int, step: int) -> dict[str, Any]:
    """One step of one rank for the lanes, every table filtered by rank and step before any
    per-row work: the host threads that talked to the device (queued, waited, fell back) with
    their top-level ops, waits and fallbacks; the kernels from the step's start to the end of the
    last kernel that ran work queued in it; and the flows (enqueued op -> its kernel; the
    ``MAX_FLOWS`` that waited longest in the queue). Bars: the ``MAX_BARS`` longest per kind.
    ``counts``: how many of each there were, to say what was left out."""
    run = data.load(Path(path))
    kinds = analyze(run).step_kinds
    s = kinds[(kinds["rank"] == rank) & (kinds["step"] == step)].iloc[0]
    t0, end = int(s["ts"]), int(s["ts"] + s["dur"])
    corr, flushes, falls = (df[(df["rank"] == rank) & (df["step"] == step)]
                            for df in (analyze(run).device_correlation, run.queue_flushes, analyze(run).cpu_fallbacks.table))
    ran = corr[corr["kernel"] >= 0]
    if len(ran):
        end = max(end, int((ran["kernel_ts"] + ran["kernel_dur"]).max()))
    ops = run.ops
    ops = ops[(ops["rank"] == rank) & (ops["step"] == step) & (ops["depth"] == 0)]
    tids = {int(t) for df in (corr, flushes, falls) for t in df["tid"].unique()}
    ops = ops[ops["tid"].isin(tids)] if tids else ops
    tids = tids or {int(t) for t in ops["tid"].unique()}
    k = run.device_kernels
    k = k[(k["rank"] == rank) & (k["ts"] <= end) & (k["ts"] + k["dur"] >= t0)]
    flows = ran[ran["op_index"] >= 0]
    counts = {"ops": len(ops), "flushes": len(flushes), "fallbacks": len(falls), "kernels": len(k), "flows": len(flows)}
    flows = flows.nlargest(MAX_FLOWS, "queued_ns") if len(flows) > MAX_FLOWS else flows
    host = run.ops.iloc[flows["op_index"].to_numpy()]
    names = {int(t): str(n) for t, n in zip(ops["tid"], ops["thread"])}
    return {"t0": t0, "end": end, "counts": counts, "threads": {t: names.get(t, f"tid {t}") for t in sorted(tids)},
            "ops": _longest(ops)[["tid", "ts", "dur", "name", "module", "source"]],
            "flushes": _longest(flushes)[["tid", "ts", "dur", "device", "reason", "ops", "host_op", "source"]],
            "fallbacks": _longest(falls)[["tid", "ts", "dur", "device", "op", "bytes_to_host", "bytes_from_host",
                                          "source"]],
            "kernels": _longest(k)[["ts", "dur", "device", "name", "n_ops"]],
            "flows": pd.DataFrame({"tid": flows["tid"].to_numpy(), "ts": flows["ts"].to_numpy(),
                                   "op": host["name"].astype(str).to_numpy(),
                                   "source": host["source"].astype(str).to_numpy(),
                                   "device": flows["device"].astype(str).to_numpy(),
                                   "kernel": flows["kernel_name"].astype(str).to_numpy(),
                                   "kernel_ts": flows["kernel_ts"].to_numpy(), "queued_ns": flows["queued_ns"].to_numpy()})}


def _bars(fig: go.Figure, lane: np.ndarray, df: pd.DataFrame, t0: int, name: str, color: str, width: float,
          hover: np.ndarray) -> None:
    """One trace of horizontal bars on the lanes (``hover``: escaped text per bar)."""
    if len(df):
        fig.add_trace(go.Bar(orientation="h", y=lane, x=df["dur"].to_numpy() / 1e6, base=(df["ts"].to_numpy() - t0) / 1e6,
                             width=width, name=name, marker_color=color, customdata=hover,
                             hovertemplate="%{customdata}<extra>" + name + "</extra>"))


def _host_lane(threads: dict, tids: pd.Series) -> np.ndarray:
    return plot_array([f"host · {threads.get(t, f'tid {t}')}" for t in tids])


def _device_lane(devices: pd.Series) -> np.ndarray:
    return plot_array([f"device · {d}" for d in devices.astype(str)])


def _lane_chart(sl: dict[str, Any], step: int) -> go.Figure:
    """The step's host threads over its device(s): top-level ops, and over them the host's waits
    for the device (red) and CPU fallbacks; the device's kernels, fused or of one op; a grey line
    from where each host op queued an op to the start of the kernel that ran it. ms from the
    step's start."""
    t0, th = sl["t0"], sl["threads"]
    fig = go.Figure()
    o, f, fb, k, fl = sl["ops"], sl["flushes"], sl["fallbacks"], sl["kernels"], sl["flows"]
    _bars(fig, _host_lane(th, o["tid"]), o, t0, "host op", OP_COLOR, 0.8,
          plot_array([f"{n}" + (f" in {m}" if m else "") + f" · {s} · {d / 1e6:.3f} ms"
                      for n, m, s, d in zip(o["name"], o["module"].astype(str), o["source"], o["dur"])]))
    _bars(fig, _host_lane(th, fb["tid"]), fb, t0, "CPU fallback", FALLBACK_COLOR, 0.5,
          plot_array([f"{op} ran on the CPU for {dev}: {format_bytes(a)} to the host, {format_bytes(b)} back · {s} · "
                      f"{d / 1e6:.3f} ms" for op, dev, a, b, s, d in
                      zip(fb["op"], fb["device"], fb["bytes_to_host"], fb["bytes_from_host"], fb["source"], fb["dur"])]))
    _bars(fig, _host_lane(th, f["tid"]), f, t0, "host waits for the device", WAIT_COLOR, 0.5,
          plot_array([f"waited {d / 1e6:.3f} ms for {dev} ({r}: {n} queued ops) in {op} · {s}"
                      for d, dev, r, n, op, s in zip(f["dur"], f["device"], f["reason"], f["ops"], f["host_op"],
                                                     f["source"])]))
    for name, mask in (("fused kernel", k["n_ops"] > 1), ("one-op kernel", k["n_ops"] <= 1)):
        kk = k[mask.to_numpy()]
        _bars(fig, _device_lane(kk["device"]), kk, t0, name, KERNEL_COLORS[name], 0.8,
              plot_array([f"kernel {n} · {c} ops · {d / 1e6:.3f} ms" for n, c, d in
                          zip(kk["name"], kk["n_ops"], kk["dur"])]))
    if len(fl):
        _flows(fig, fl, th, t0)
    host_lanes = [f"host · {plot(t)}" for t in th.values()]
    lanes = host_lanes + sorted({f"device · {plot(d)}" for d in k["device"].astype(str)} |
                                {f"device · {plot(d)}" for d in fl["device"]})
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=lanes[::-1])
    fig.update_xaxes(title_text=f"ms since step {step} began", range=[0, (sl["end"] - t0) / 1e6])
    fig.update_layout(barmode="overlay", height=200 + 70 * len(lanes), margin={"t": 30},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return fig


def _flows(fig: go.Figure, fl: pd.DataFrame, threads: dict, t0: int) -> None:
    """The op -> kernel lines as one trace: each a segment from the host lane at the enqueue to
    the device lane at the kernel's start, ``None`` between segments."""
    n = len(fl)
    x = np.full(3 * n, None, dtype=object)
    y = np.full(3 * n, None, dtype=object)
    x[0::3], x[1::3] = (fl["ts"].to_numpy() - t0) / 1e6, (fl["kernel_ts"].to_numpy() - t0) / 1e6
    y[0::3], y[1::3] = _host_lane(threads, fl["tid"]), _device_lane(fl["device"])
    text = plot_array([f"{op} at {s} queued work that kernel {kn} ran {q / 1e6:.3f} ms later"
                       for op, s, kn, q in zip(fl["op"], fl["source"], fl["kernel"], fl["queued_ns"])])
    hover = np.full(3 * n, None, dtype=object)
    hover[0::3], hover[1::3] = text, text
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="op → kernel", line={"color": "rgba(90,90,90,0.45)",
                                                                                 "width": 1},
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"))


def _lanes_caption(sl: dict[str, Any], step: int) -> str:
    """What the lanes drew, and what they left out."""
    c = sl["counts"]
    drawn = {"ops": len(sl["ops"]), "flushes": len(sl["flushes"]), "fallbacks": len(sl["fallbacks"]),
             "kernels": len(sl["kernels"]), "flows": len(sl["flows"])}
    words = {"ops": "top-level host ops", "flushes": "host waits", "fallbacks": "CPU fallbacks", "kernels": "kernels",
             "flows": "op → kernel lines"}
    parts = [f"{drawn[x]:,} {words[x]}" if drawn[x] == c[x] else f"the {drawn[x]:,} longest of {c[x]:,} {words[x]}"
             for x in ("ops", "flushes", "fallbacks", "kernels")]
    flows = (f"all {c['flows']:,} {words['flows']}" if drawn["flows"] == c["flows"] else
             f"{drawn['flows']:,} of the {c['flows']:,} {words['flows']} (those whose op waited longest in the queue)")
    return (f"From the start of step {step} to the end of the last kernel that ran work queued in it. Drawn: "
            + ", ".join(parts) + f"; {flows}: each from where a host op queued an op to the kernel that ran it.")


def _show_stall_source(run, stall: Stall) -> None:
    """The source lines around the line a stall waited on, read from its file when the source
    rule allows (the file its flushes recorded), else a caption saying it is not readable here."""
    f = run.queue_flushes
    rows = f[(f["rank"] == stall.rank) & (f["source"].astype(str) == stall.source)
             & (f["user_source"].astype(str) == stall.user_source) & (f["host_op"].astype(str) == stall.host_op)
             & (f["reason"].astype(str) == stall.reason) & (f["device"].astype(str) == stall.device)]
    full = rows["source_full"].astype(str).mode()
    file, _, line = (full.iloc[0] if len(full) else "").rpartition(":")
    if not file or not line.isdigit():
        st.caption("this wait was outside any op of the user's: there is no source line to show")
        return
    allowed = {fr for sid in rows["stack"].unique() for fr, _, _ in run.stack(int(stall.rank), int(sid))}
    show_source(run, int(stall.rank), file, int(line), allowed)


def _stalls(run, device: DeviceSection) -> None:
    st.subheader("Where the host waits for the device")
    stalls = device.stalls
    if not stalls:
        st.caption("none: the host never waited for a queued op")
        return
    _table(pd.DataFrame(stalls).assign(source=[stall_site(x) for x in stalls],
                                       called_from=[user_line(x) for x in stalls]),
           {"rank": "rank", "source": "source line", "called_from": "called from", "host_op": "op", "reason": "why",
            "device": "device", "count": "waits", "per_step_ms": "ms/step", "mean_ms": "mean ms", "max_ms": "max ms",
            "total_ms": "total ms", "ops": "ops waited for"})
    st.caption("why: sync = the host needs a value; size = the queue was full; fallback = a CPU fallback needs the "
               "inputs; synchronize = torch.<device>.synchronize(); stream_/event_synchronize = "
               "Stream./Event.synchronize(); "
               "ms/step over the steady captured steps")
    i = st.selectbox("source of the wait", range(len(stalls)), key="dev_stall",
                     format_func=lambda i: f"{stall_site(stalls[i])} · {stalls[i].reason} · "
                                           f"{stalls[i].total_ms:.2f} ms in all")
    _show_stall_source(run, stalls[i])


def _fusion(device: DeviceSection) -> None:
    st.subheader("Fusion")
    if device.fusion:
        _table(device.fusion, {"rank": "rank", "device": "device", "kernels": "kernels", "ops": "ops",
                             "ops_per_kernel": "ops per kernel", "one_op_kernels": "one-op kernels",
                             "one_op_pct": "one-op %", "busy_ms": "busy ms", "launch_floor_us": "shortest kernel µs",
                             "launch_ms": "launch ms (at most)", "launch_pct": "launch % of busy (at most)"})
        st.caption("a kernel's fixed launch cost is at most the device's shortest kernel: kernels x that bounds the "
                   "device time spent on launches")
    if device.unfused:
        st.markdown("**Unfused runs**: one-op kernels in a row, where `torch.compile` or a custom kernel would save "
                    "launches")
        _table(pd.DataFrame(device.unfused).assign(
                   where=[x.source + (f" .. {x.last_source}" if x.last_source != x.source else "") for x in device.unfused]),
               {"rank": "rank", "device": "device", "where": "source lines", "kernels": "kernels",
                "occurrences": "times", "per_step": "per step", "total_kernels": "kernels in all",
                "total_ms": "device ms", "launch_ms": "launch ms (at most)", "first_step": "first step"})


def _custom_kernels(device: DeviceSection) -> None:
    kernels = device.custom_kernels
    if not kernels:
        return
    st.subheader("Custom kernels")
    _table(pd.DataFrame(kernels).assign(lines=[", ".join(x.user_sources) for x in kernels],
                                        graphs=[", ".join(x.graphs) for x in kernels]),
           {"rank": "rank", "device": "device", "name": "kernel", "forward_calls": "forward calls",
            "backward_calls": "backward calls", "per_step_ms": "ms/step", "mean_us": "mean µs",
            "forward_ms": "forward ms", "backward_ms": "backward ms", "pct": "% of busy", "lines": "called at",
            "graphs": "in compiled graphs"})
    st.caption("kernels the backend reported under a custom op's name (lib::op): their share of the device's busy "
               "time is the custom-kernel coverage")


def _stream_step_chart(steps: pd.DataFrame) -> go.Figure:
    """Per complete step (the first rank and device shown), each stream's busy ms and its ms idle
    waiting for another stream, side by side, and the time streams ran at once as a line."""
    first = steps[(steps["rank"] == steps["rank"].iloc[0]) & (steps["device"] == steps["device"].iloc[0])]
    fig = go.Figure()
    for stream, s in first.groupby("stream"):
        fig.add_trace(go.Bar(x=s["step"], y=s["busy_ms"], name=f"stream {stream} busy", offsetgroup=str(stream)))
        fig.add_trace(go.Bar(x=s["step"], y=s["waiting_ms"], name=f"stream {stream} idle, waiting on another",
                             offsetgroup=str(stream), base=s["busy_ms"], marker_color=WAIT_COLOR, opacity=0.6))
    at_once = first.drop_duplicates("step")
    fig.add_trace(go.Scatter(x=at_once["step"], y=at_once["overlap_ms"], name="streams at once",
                             mode="lines+markers", line_color=OP_COLOR))
    fig.update_layout(barmode="group", xaxis_title="step", yaxis_title="ms",
                      title=f"rank {first['rank'].iloc[0]} {first['device'].iloc[0]}: streams per step",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, margin={"t": 60})
    return fig


def _streams(device: DeviceSection) -> None:
    if len({(s.rank, s.device, s.stream) for s in device.streams}) < 2 and not device.stream_waits:
        return
    st.subheader("Streams")
    _table(device.streams, {"rank": "rank", "device": "device", "stream": "stream",
                            "kernels_per_step": "kernels/step", "busy_ms": "busy ms/step", "busy_pct": "busy %",
                            "waiting_ms": "idle waiting on another stream ms/step"})
    for o in device.stream_overlap:
        st.caption(f"rank {o.rank} {md(o.device)}: streams ran kernels at once {o.overlap_ms:.3f} ms a step "
                   f"({o.overlap_pct:.1f}% of its {o.busy_ms:.3f} ms busy): copies or compute hidden under others")
    if device.stream_steps:
        st.plotly_chart(_stream_step_chart(pd.DataFrame(device.stream_steps)), width="stretch")
    if device.stream_waits:
        st.markdown("**Stream waits**: a stream idle on the device until another stream's event, by the line "
                    "that queued the wait (`wait_event`, `wait_stream`)")
        _table([{**vars(w), "line": w.user_source or w.source} for w in device.stream_waits],
               {"rank": "rank", "device": "device", "stream": "stream", "waited_for": "waited for stream",
                "line": "wait queued at", "count": "waits", "per_step_ms": "idle ms/step", "total_ms": "total ms",
                "max_ms": "longest ms"})


def _comm_step_chart(steps: pd.DataFrame, warmup: dict[int, bool]) -> go.Figure:
    """Per complete step of one rank (the report's ``collective_steps`` rows), each device's
    collective kernel time split in two, stacked: exposed (no other kernel of the device ran
    meanwhile) under overlapped (other kernels ran beside it); warm-up steps named on the axis (a
    hatch would hatch the legend too). One bar per device of the rank (side by side when it has
    several)."""
    fig = go.Figure()
    rank = int(steps["rank"].iloc[0])
    devices = sorted(steps["device"].astype(str).unique())
    for dev in devices:
        s = steps[steps["device"].astype(str) == dev].sort_values("step")
        warm = np.array([warmup.get(int(x), False) for x in s["step"]])
        hover = plot_array([f"step {n}{' (warm-up)' if w else ''} · {dev}: {k} collective kernel"
                            f"{'s' if k != 1 else ''} · {c:.3f} ms communication: {o:.3f} ms overlapped, "
                            f"{e:.3f} ms exposed"
                            for n, w, k, c, o, e in zip(s["step"], warm, s["kernels"], s["comm_ms"],
                                                          s["overlapped_ms"], s["exposed_ms"])])
        label = "" if len(devices) == 1 else f"{plot(dev)} "
        fig.add_trace(go.Bar(x=s["step"], y=s["exposed_ms"], name=f"{label}exposed", offsetgroup=dev,
                             marker_color=WAIT_COLOR, customdata=hover,
                             hovertemplate="%{customdata}<extra></extra>"))
        fig.add_trace(go.Bar(x=s["step"], y=s["overlapped_ms"], name=f"{label}overlapped", offsetgroup=dev,
                             base=s["exposed_ms"], marker_color=KERNEL_COLORS["fused kernel"],
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    where = plot(devices[0]) if len(devices) == 1 else "its devices"
    ticks = sorted(int(x) for x in steps["step"].unique())
    fig.update_layout(barmode="group", xaxis_title="step", yaxis_title="ms of collective kernels",
                      title=f"rank {rank} {where}: collectives per step",
                      xaxis={"tickvals": ticks, "ticktext": [f"{x} (warm-up)" if warmup.get(x) else str(x)
                                                            for x in ticks]},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, margin={"t": 60})
    return fig


def _device_stragglers(device: DeviceSection) -> list[str]:
    """The device-time straggler lines, as the report words them: the ranks whose device reached
    collectives last in steps where it made the others' kernels wait significantly."""
    return [device_straggler_text(s) for s in device.stragglers if s.steps]


def _collectives(device: DeviceSection, rank: int, warmup: dict[int, bool]) -> None:
    """Collectives that ran as device kernels: per rank and device their time hidden under other
    kernels or exposed, per step for the rank picked above, the streams that stood idle waiting
    for a collective (by the lines that issued it and queued the wait), and the ranks whose device
    reached collectives last: the report's ``Collectives on the device``."""
    if not device.collectives and not device.collective_waits:
        return
    st.subheader("Collectives on the device")
    if device.collectives:
        _table(device.collectives, {"rank": "rank", "device": "device", "kernels_per_step": "kernels/step",
                                    "comm_ms": "communication ms/step", "overlapped_ms": "overlapped ms/step",
                                    "exposed_ms": "exposed ms/step", "overlapped_pct": "overlapped %"})
        st.caption(f"mean per {md(device.basis)} step of the collective kernels (all-reduce, all-gather, ...): "
                   "overlapped = other kernels of the device ran meanwhile (communication hidden under compute), "
                   "exposed = nothing else did (the device only communicated)")
    steps = pd.DataFrame(device.collective_steps)
    mine = steps[steps["rank"] == rank] if len(steps) else steps
    if len(mine):
        st.plotly_chart(_comm_step_chart(mine, warmup), width="stretch", key="dev_comm_steps")
        st.caption(f"rank {rank} (the rank picked above), every complete captured step that ran collective "
                   "kernels, warm-up steps included (named on the axis)")
    if device.collective_waits:
        st.markdown("**Streams waiting for a collective**: a stream idle on the device until a collective ran (the "
                    "event its issue recorded), by the lines that issued it and queued the wait")
        _table(device.collective_waits,
               {"rank": "rank", "device": "device", "stream": "stream", "op": "collective", "group": "group",
                "user_source": "issued at", "waited_at": "waited at", "count": "waits",
                "per_step_ms": "idle ms/step", "total_ms": "total ms", "max_ms": "longest ms"})
    said = _device_stragglers(device)
    for line in said:
        st.markdown(line)
    if device.stragglers and not said:
        st.caption("on device time, no rank reached collectives last significantly in any step")


def _fallbacks(device: DeviceSection) -> None:
    st.subheader("CPU fallbacks")
    falls = device.fallbacks
    if falls:
        _table(pd.DataFrame(falls).assign(lines=[", ".join(x.sources) for x in falls],
                                          to_host=[format_bytes(x.bytes_to_host) for x in falls],
                                          from_host=[format_bytes(x.bytes_from_host) for x in falls]),
               {"rank": "rank", "device": "device", "op": "op", "lines": "source lines", "calls": "calls",
                "calls_per_step": "per step", "to_host": "to host", "from_host": "from host",
                "per_step_ms": "ms/step", "total_ms": "total ms"})
        st.caption("bytes over the run: inputs copied off the device, results copied back; the time includes the "
                   "copies")
    else:
        st.caption("none: every op ran on the device")
    if device.coverage:
        _table(device.coverage, {"rank": "rank", "device": "device", "native_ops": "ops run natively",
                               "fallback_ops": "ops fallen back", "coverage_pct": "coverage %",
                               "fallback_op_kinds": "kinds fallen back"})


def _copies(device: DeviceSection) -> None:
    st.subheader("Copies between host and device")
    copies = device.copies
    if not copies:
        st.caption("none reported: the device's trace holds no copy (a backend that reports its copies as "
                   "kernels shows them under Fusion)")
        return
    _table(pd.DataFrame(copies).assign(line=[x.user_source or "-" for x in copies],
                                       size=[format_bytes(x.bytes) for x in copies],
                                       per_step=[format_bytes(x.bytes_per_step) if x.bytes_per_step is not None
                                                 else "-" for x in copies]),
           {"rank": "rank", "device": "device", "kind": "direction", "line": "source line", "copies": "copies",
            "per_step": "bytes/step", "per_step_ms": "ms/step", "size": "bytes", "total_ms": "total ms",
            "gbps": "GB/s"})
    st.caption("DtoH: device to host (a value the host reads, a tensor moved to the CPU), HtoD the other way, DtoD "
               "within the device; per step over the steady captured steps")


def _finding(f: Finding) -> None:
    """A finding of the report as a box: a warning for high and medium, a note for info."""
    if f.severity == "info":
        st.info(md(f.text), icon=":material/info:")
    else:
        st.warning(md(f.text), icon=":material/error:" if f.severity == "high" else ":material/warning:")


def _step_label(choices: pd.DataFrame, verdicts: dict[int, str]) -> dict[int, str]:
    return {int(s): f"step {s}" + ("" if done else " (partial)") + (" · warm-up" if warm else "")
            + (f" · {verdicts[s]}" if s in verdicts else "") + f" · {dur / 1e6:.1f} ms"
            for s, done, warm, dur in zip(choices["step"], choices["complete"], choices["warmup"], choices["dur"])}


@st.fragment
def _lanes(path: Path, rank: int, verdicts: dict[int, str]) -> None:
    """The step selector and its lanes, as a fragment: picking a step reruns only this, not the
    page's tables and its per-step chart (on a run of a thousand steps, most of what the browser
    would otherwise redraw)."""
    st.subheader("A step on the host and on the device")
    key, mtime = str(path), data.stamp(path)
    choices = _choices(key, mtime, rank)
    if choices.empty:
        st.caption("this rank has no step to show")
        return
    steps = [int(s) for s in choices["step"]]
    labels = _step_label(choices, verdicts)
    step = st.selectbox("step", steps, index=steps.index(tla.default_step(choices)), key="dev_step",
                        format_func=labels.get)
    sl = _step_slice(key, mtime, rank, step)
    st.plotly_chart(_lane_chart(sl, step), width="stretch", key="dev_lanes")
    st.caption(_lanes_caption(sl, step))


st.title("Device")
path = data.run_path()
run = data.load(path)
summary = data.summary(path)
device = summary.device
if not isinstance(device, DeviceSection):
    data.no_data("device data", HOW)
    st.stop()
for f in findings(summary):
    if f.page == "device":  # what bounds the steps, the host's waits, fallbacks, launches: as the report says
        _finding(f)
_metrics(device)

st.subheader("What bounds each step")
if device.verdict:
    _table(device.verdict, {"rank": "rank", "verdict": "verdict", "steps": "steps", "device": "busiest device",
                          "step_ms": "step ms", "busy_ms": "busy ms", "busy_pct": "busy %", "idle_ms": "idle ms",
                          "wait_ms": "host waits ms", "wait_pct": "host waits %"})
t = device.thresholds
st.caption(f"over the {device.basis_steps} {md(device.basis)} captured steps: device-bound when the busiest device runs "
           f"kernels {t.device_bound_busy_pct:.0f}% of the step or more; host-bound when it is busy under "
           f"{t.host_bound_busy_pct:.0f}% while the host waits for it under {t.host_bound_wait_pct:.0f}% (the "
           "device waits for work); else balanced")
steps = pd.DataFrame(device.steps)
ranks = sorted(int(r) for r in steps["rank"].unique()) if len(steps) else sorted(run.ranks)
rank = st.selectbox("rank", ranks, key="dev_rank")
mine = steps[steps["rank"] == rank].sort_values("step") if len(steps) else steps
if len(mine):
    st.plotly_chart(_step_chart(mine, t), width="stretch", key="dev_steps")
_lanes(path, rank, {int(s): v for s, v in zip(mine["step"], mine["verdict"])} if len(mine) else {})
_stalls(run, device)
_fusion(device)
_custom_kernels(device)
_streams(device)
warm = (dict(zip(mine["step"].astype(int).tolist(), mine["warmup"].fillna(False).astype(bool).tolist()))
        if len(mine) else {})
_collectives(device, rank, warm)
_copies(device)
_fallbacks(device)
