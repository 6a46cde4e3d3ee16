"""Diff: this run against a second one, headline numbers side by side with their change and verdict
(``analysis.diff.compare`` of the two runs' report summaries).

The second run is ``$NEURON_PROF_DIFF_RUN`` (``neuron-prof view RUN --diff RUN2``) or one of the
run directories next to this one; never a path typed into the page."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from neuron_prof.analysis.diff import compare
from neuron_prof.units import format_bytes
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


def _fmt(v: float, unit: str, signed: bool = False) -> str:
    if pd.isna(v):
        return "-"
    sign = "+" if signed and v > 0 else ""
    if unit.startswith("bytes"):
        return sign + format_bytes(v, 2) + ("/step" if unit.endswith("/step") else "")
    if unit.startswith("ms"):
        return f"{sign}{v:.3f} {unit}"
    return f"{sign}{v:g}"


current = data.run_path()
data.load(current)

st.title("Diff")
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
        return f"{p}  (--diff)"
    return p.name


other = st.selectbox("compare this run with", choices, index=1 if env_run is not None and len(choices) > 1 else 0,
                     format_func=_label, key="diff_other",
                     help="the run given with `neuron-prof view RUN --diff RUN2`, or a run directory next to this one")
if other is None:
    st.info("Pick a second run to compare with: start the viewer with `neuron-prof view RUN --diff OTHER_RUN`, "
            "or keep runs side by side in one folder (e.g. `runs/before`, `runs/after`) and choose one above."
            + ("" if len(choices) > 1 else f" There is no other run directory next to {md(current)}."))
    st.stop()

this_is_baseline = st.toggle("use this run as the baseline", key="diff_swap",
                             help="by default the other run is the baseline and this run is compared with it")
a_path, b_path = (current, other) if this_is_baseline else (other, current)
sa, sb = data.summary(a_path), data.summary(b_path)
cmp = compare(sa, sb)
a_name, b_name = (a_path.name, b_path.name) if a_path.name != b_path.name else (str(a_path), str(b_path))
st.caption(f"**a** (baseline): {md(a_path)} · **b**: {md(b_path)} · change = b − a; lower is better for every "
           "number here; measured numbers within 5% count as the same")

cards = cmp.set_index("metric")
cols = st.columns(4)
for col, metric in zip(cols, ("step time (median)", "compile time", "memory peak", "leak growth")):
    r = cards.loc[metric]
    col.metric(f"{metric} (b)", _fmt(r["b"], r["unit"]),
               delta=None if pd.isna(r["change"]) else _fmt(r["change"], r["unit"], signed=True),
               delta_color="inverse", help=f"a: {_fmt(r['a'], r['unit'])} · {r['verdict']}")

worse = cmp[cmp["verdict"] == "worse"]["metric"].tolist()
better = cmp[cmp["verdict"] == "better"]["metric"].tolist()
if worse:
    st.warning(f"worse in b: {', '.join(worse)}")
if better:
    st.success(f"better in b: {', '.join(better)}")
if not worse and not better:
    st.info("no headline number changed beyond noise")

_COLORS = {"better": "color: green", "worse": "color: red; font-weight: bold"}
table = cmp.rename(columns={"a": f"a: {a_name}", "b": f"b: {b_name}"})
st.dataframe(table.style.map(lambda v: _COLORS.get(v, ""), subset=["verdict"]), hide_index=True,
             column_config={"change_pct": st.column_config.NumberColumn("change %", format="%+.1f"),
                            "change": st.column_config.NumberColumn("change (b − a)")})

st.subheader("Step time")
parts = []
for label, p in ((f"a: {plot(a_name)}", a_path), (f"b: {plot(b_name)}", b_path)):  # legend text renders HTML
    steps = data.load(p).step_kinds
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
