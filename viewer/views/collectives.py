"""Collectives: which rank made the others wait, in which steps and for how long; a step's
collectives rank by rank on one clock; what the ranks disagreed on or never finished; bandwidth.

In synchronous training every rank finishes a step together, so step time cannot name a
straggler: the waits inside the collectives can. Every number here comes from the run's summary
(its Collectives section, ``summary.build``) for the findings and tables, the run's aligned waits
for the heat map and the lanes; the page only draws. When collectives ran as device kernels (the
report's Device section has collectives), the stragglers on device time stand next to the host's,
with a link to the Device page. The charts stay small at any world size: the heat map is one
cell per rank and step, the lanes one step of at most ``MAX_LANES`` ranks.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from neuron_prof.analysis.clock import to_rank0
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.stragglers import waited
from neuron_prof.reports.findings import device_straggler_text, findings
from neuron_prof.reports.summary.sections import DeviceSection
from neuron_prof.viewer import data
from neuron_prof.viewer.charts import collective_lanes, wait_heatmap
from neuron_prof.viewer.text import md

MAX_LANES = 32  # ranks drawn at once in the lanes (the step's stragglers first): more would be unreadable
HOW = ("Every `torch.distributed` collective (DDP's gradient all-reduce, FSDP's all-gathers and reduce-scatters, "
       "explicit calls) is recorded on each rank by the `collectives` collector, on by default once the job has "
       "called `init_process_group`: run the job under `neuron-prof record` (`neuron-prof record -- torchrun "
       "--nproc-per-node 2 train.py`), or wrap each rank's training loop in `neuron_prof.profile(RUN)`.")


def _table(rows: list, columns: dict[str, str], ms: tuple[str, ...] = ()) -> None:
    """``rows`` (rows of the summary's Collectives section) as a grid of ``columns`` (key -> header); ``ms``: ns columns shown in ms."""
    df = pd.DataFrame(rows)[list(columns)]
    df[list(ms)] = df[list(ms)] / 1e6
    df = df.rename(columns=columns)
    st.dataframe(df.astype({c: str for c in df.columns if df[c].map(lambda v: isinstance(v, list)).any()}),
                 hide_index=True)


run = data.load()
st.title("Collectives")
if run.collectives.empty:
    data.no_data("collective data", HOW)
    st.stop()
summary = data.summary()
colls = summary.collectives  # captured: the run has collectives
for f in findings(summary):
    if f.page == "collectives":  # stuck, mismatched, straggling: as the report and the Overview say it
        st.warning(md(f.text), icon=":material/error:" if f.severity == "high" else ":material/warning:")

clock = pd.DataFrame(colls.clock)
cols = st.columns(4)
cols[0].metric("collectives", colls.collectives, help="matched across ranks by (process group, sequence number)")
cols[1].metric("calls", colls.calls, help="one per collective per rank")
cols[2].metric("process groups", len(colls.groups))
cols[3].metric("clocks", "one clock" if clock["same_clock"].all() else
               (f"aligned ±{clock['rtt'].max() / 2e6:.2f} ms" if clock["measured"].all() else "not measured"),
               help="every rank's times are moved onto rank 0's clock with the offsets measured at capture start "
                    "and end; ranks on one host share one clock")

st.subheader("Stragglers")
if not any(r.steps for r in colls.stragglers):
    st.markdown("No rank made the others wait significantly in any steady step.")
if colls.stragglers:
    _table(colls.stragglers, {"rank": "rank", "wait_caused_ns": "wait caused (ms)", "steps": "straggler in steps",
                             "times_last": "last in steps", "waited_ns": "waited itself (ms)", "share": "share"},
           ms=("wait_caused_ns", "waited_ns"))
if colls.threshold_ms is not None:
    st.caption(f"over the {colls.steady_steps} steady steps: a step's last rank counts as its straggler when the wait "
               f"it caused stands out from the run's own jitter (here {colls.threshold_ms:.1f} ms or more; "
               "neuron_prof's own step-boundary work is not counted)")

device = summary.device
if isinstance(device, DeviceSection) and device.collectives:  # collectives ran as device kernels: their own clock
    st.markdown("**On device time**: the same, over when each rank's device ran its collective kernels (the times "
                "above are when each rank's host issued them)")
    if device.stragglers:
        _table(device.stragglers, {"rank": "rank", "wait_caused_ns": "wait caused (ms)",
                                   "steps": "straggler in steps", "times_last": "last in steps",
                                   "waited_ns": "waited itself (ms)", "share": "share"},
               ms=("wait_caused_ns", "waited_ns"))
    late = [device_straggler_text(s) for s in device.stragglers if s.steps]
    st.caption(("; ".join(late) if late else "no rank's device reached collectives last significantly in any step")
               + ". Communication hidden or exposed on the device, and the streams that waited for it: the Device "
               "page's Collectives on the device")
    st.page_link("views/device.py", label="see Device")

waits = analyze(run).collective_waits
st.subheader("Wait per rank and step")
st.plotly_chart(wait_heatmap(waited(waits, run.steps)), width="stretch")
st.caption("ms each rank waited inside collectives for the last rank to arrive, each moment once however many "
           "collectives it waited for at the time: a straggler's steps are the columns where the other ranks are hot")

st.subheader("A step's collectives, rank by rank")
steps = sorted(int(x) for x in waits["step"].unique())
worst = max((r for r in colls.straggler_steps if r.significant), key=lambda r: r.wait_caused_ns, default=None)
step = st.selectbox("step", steps, index=steps.index(worst.step) if worst else 0, key="coll_step")
rows = waits[waits["step"] == step]
ranks = sorted(int(r) for r in rows["rank"].unique())
if len(ranks) > MAX_LANES:
    late = rows.groupby("late_rank")["wait_ns"].max().sort_values(ascending=False).index
    first = [int(r) for r in late if int(r) in ranks][:MAX_LANES // 4]
    shown = st.multiselect("ranks", ranks, default=first + [r for r in ranks if r not in first][:MAX_LANES - len(first)],
                           max_selections=MAX_LANES, key="coll_ranks")
    rows = rows[rows["rank"].isin(shown)]
step_rows = run.steps[run.steps["step"] == step]
zero = int(to_rank0(step_rows["ts"].to_numpy(), step_rows["rank"].to_numpy(), analyze(run).collective_offsets).min()) \
    if len(step_rows) else int(rows["start"].min())
if len(rows):
    st.plotly_chart(collective_lanes(rows, zero), width="stretch")
st.caption(f"from the start of step {step}; red: waiting for the last rank to arrive, then the collective itself")

st.subheader("Mismatches")
if colls.mismatches:
    _table(colls.mismatches, {"group": "group", "seq": "seq", "kind": "kind", "ranks": "ranks", "detail": "detail"})
else:
    st.caption("none: at every (group, seq) the ranks issued the same op, size and dtype, and every member issued it")

st.subheader("In flight")
if colls.in_flight:
    _table(colls.in_flight, {"rank": "rank", "op": "op", "group": "group", "seq": "seq", "bytes": "bytes",
                            "status": "status", "step": "step", "source": "source", "arrived": "arrived",
                            "missing": "never arrived"})
    st.caption("collectives issued and never completed: what each rank was stuck in when the job hung or its group "
               "timed out")
else:
    st.caption("none: every collective issued completed")

st.subheader("By op and group")
_table(colls.by_op, {"group": "group", "op": "op", "collectives": "collectives", "bytes": "bytes per rank",
                    "time_ms_per_rank": "ms per rank", "wait_ms_per_rank": "of which waiting", "per_step": "per step"})
if colls.bandwidth:
    _table(colls.bandwidth, {"group": "group", "op": "op", "group_size": "ranks", "calls": "collectives",
                            "bytes": "bytes", "algbw": "algbw GB/s", "busbw": "busbw GB/s"})
    st.caption("bandwidth over the transfer (from the last arrival to completion); busbw as NCCL-tests counts it")
if colls.overlap:
    _table(colls.overlap, {"rank": "rank", "comm_ms": "ms in collectives per step", "overlapped_ms": "overlapped",
                          "exposed_ms": "exposed", "exposed_pct": "exposed % of step"})
    st.caption("per steady step: time in collectives, the part compute overlapped, and the rest the rank only waited")
