"""Compare: this run against a second one, the migration checklist side by side (step time,
throughput, compile stability, coverage, sync stalls, memory, loss agreement:
``reports.compare.compare_runs``, what ``neuron-prof compare`` prints), the graph breaks of one run
only, each step's loss and step time, and the ops whose time changed most.

The second run is ``$NEURON_PROF_DIFF_RUN`` (``neuron-prof view RUN --compare RUN2``) or one of the
run directories next to this one; never a path typed into the page."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis.metrics import series
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.compare import compare_runs, format_value
from neuron_prof.viewer import data
from neuron_prof.viewer.text import md, plot

MAX_SIBLINGS = 200  # run directories offered from the folder this run is in


def _is_run(d: Path) -> bool:
    try:
        return d.is_dir() and any(p.is_dir() for p in d.glob("rank-*"))
    except OSError:
        return False


def _siblings(current: Path) -> list[Path]:
    """Run directories (folders with rank-*/ in them) next to ``current``, by name."""
    out = []
    try:
        entries = sorted(current.parent.iterdir())
    except OSError:
        return []
    for d in entries:
        if d != current and _is_run(d):
            out.append(d)
            if len(out) >= MAX_SIBLINGS:
                break
    return out


current = data.run_path()
data.load(current)

st.title("Compare")
env = os.environ.get(data.DIFF_ENV, "")
env_run = Path(env).resolve() if env else None
choices: list[Path | None] = [None]
if env_run is not None and env_run != current:
    choices.append(env_run)
choices += [d for d in _siblings(current) if d not in choices]


def _label(p: Path | None) -> str:
    if p is None:
        return "(none)"
    if p == env_run:
        return f"{p}  (--compare)"
    return p.name


other = st.selectbox("compare this run with", choices, index=1 if env_run is not None and len(choices) > 1 else 0,
                     format_func=_label, key="diff_other",
                     help="the run given with `neuron-prof view RUN --compare RUN2`, or a run directory next to this one")
if other is None:
    st.info("Pick a second run to compare with: start the viewer with `neuron-prof view RUN --compare OTHER_RUN`, "
            "or keep runs side by side in one folder (e.g. `runs/before`, `runs/after`) and choose one above."
            + ("" if len(choices) > 1 else f" There is no other run directory next to {md(current)}."))
    st.stop()

this_is_baseline = st.toggle("use this run as the baseline", key="diff_swap",
                             help="by default the other run is the baseline and this run is compared with it")
a_path, b_path = (current, other) if this_is_baseline else (other, current)
a_name, b_name = (a_path.name, b_path.name) if a_path.name != b_path.name else (str(a_path), str(b_path))
run_a, run_b = data.load(a_path), data.load(b_path)
compared = compare_runs(run_a, run_b, summaries=(data.summary(a_path), data.summary(b_path)))
result = compared.checklist
cmp = pd.DataFrame(result.rows)
st.caption(f"**a** (baseline): {md(a_path)} · **b**: {md(b_path)} · ratio = b / a; lower is better but where "
           "marked higher; measured numbers within 5% count as the same. `neuron-prof compare A B` prints the "
           "same (with `--price` for the cost per million tokens, `--markdown` for a report)")

cards = cmp.set_index("item")
cols = st.columns(4)
for col, item in zip(cols, ("step time (median)", "tokens/s", "peak memory (busiest device)", "graph break sites")):
    r = cards.loc[item]
    change = r["b"] - r["a"] if pd.notna(r["a"]) and pd.notna(r["b"]) else None
    col.metric(f"{item} (b)", format_value(r["b"], r["unit"]),
               delta=None if change is None else ("+" if change > 0 else "") + format_value(change, r["unit"]),
               delta_color="normal" if r["better"] == "higher" else "inverse",
               help=f"a: {format_value(r['a'], r['unit'])} · {r['verdict']}")

worse = cmp[cmp["verdict"].isin(["worse", "diverged"])]["item"].tolist()
better = cmp[cmp["verdict"] == "better"]["item"].tolist()
if worse:
    st.warning(f"worse in b: {', '.join(worse)}")
if better:
    st.success(f"better in b: {', '.join(better)}")
if not worse and not better:
    st.info("no checklist number changed beyond noise")
for note in result.notes:
    st.caption(md(note))

_COLORS = {"better": "color: green", "worse": "color: red; font-weight: bold", "diverged": "color: red; font-weight: bold"}
table = cmp.rename(columns={"a": f"a: {a_name}", "b": f"b: {b_name}"})
st.dataframe(table.style.map(lambda v: _COLORS.get(v, ""), subset=["verdict"]), hide_index=True,
             column_config={"ratio": st.column_config.NumberColumn("ratio b/a", format="%.2fx")})

for key, sites in (("a", compared.breaks_a_only), ("b", compared.breaks_b_only)):
    if sites:
        st.subheader(f"Graph breaks only in {key}")
        st.dataframe(pd.DataFrame(sites)[["source", "reason_class", "reason", "breaks"]], hide_index=True)

st.subheader("Loss per step")
losses = pd.concat([pd.DataFrame({"step": v.index, "loss": v.to_numpy(), "run": label})
                    for label, v in ((f"a: {plot(a_name)}", series(run_a.metrics, "loss")),
                                     (f"b: {plot(b_name)}", series(run_b.metrics, "loss")))], ignore_index=True)
if losses.empty:
    st.caption("neither run recorded a loss (the `loss` collector records the scalar `backward()` ran on)")
else:
    st.plotly_chart(px.line(losses, x="step", y="loss", color="run", markers=True), width="stretch")
    st.caption(md(cards.loc["loss: max relative difference", "detail"]))

st.subheader("Ops whose time changed most")
if not result.ops:
    st.caption("no steady captured step in one of the runs")
else:
    st.dataframe(pd.DataFrame(result.ops), hide_index=True,
                 column_config={"a_ms_per_step": st.column_config.NumberColumn("a ms/step", format="%.3f"),
                                "b_ms_per_step": st.column_config.NumberColumn("b ms/step", format="%.3f"),
                                "change_ms": st.column_config.NumberColumn("change ms/step", format="%+.3f")})

st.subheader("Step time")
parts = []
for label, run in ((f"a: {plot(a_name)}", run_a), (f"b: {plot(b_name)}", run_b)):  # legend text renders HTML
    steps = analyze(run).step_kinds
    done = steps[steps["steady"]]
    parts.append(done.assign(ms=done["dur"] / 1e6, run=label, rank=done["rank"].astype(str))[["run", "rank", "step",
                                                                                             "ms"]])
both = pd.concat(parts, ignore_index=True)
if both.empty:
    st.caption("neither run has a steady step (a complete step that is not a rank's first and did not compile)")
else:
    fig = px.line(both, x="step", y="ms", color="run", line_dash="rank", markers=True,
                  labels={"ms": "step time (ms)"})
    st.plotly_chart(fig, width="stretch")
    st.caption("steady steps: warm-up steps (a rank's first, steps that compiled) are left out")
