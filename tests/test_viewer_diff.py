"""The viewer's Diff page on real runs (the table = ``analysis.diff.compare`` of the two runs'
report summaries), and direct tests of ``compare``."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from conftest import viewer_page
from neuron_prof.analysis.diff import COLUMNS, compare, verdict
from neuron_prof.report import summarize

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


def _page(monkeypatch, run_dir: Path, diff: Path | None = None) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "diff", title="Diff", diff=diff)


def _table(at: AppTest) -> pd.DataFrame:
    t = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    # the run columns are named after the runs: a: NAME, b: NAME
    return t.rename(columns=lambda c: c.split(":")[0] if c.startswith(("a: ", "b: ")) else c)


def _assert_table_is(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got["metric"]) == list(want["metric"])
    assert list(got["verdict"]) == list(want["verdict"])
    for col in ("a", "b", "change", "change_pct"):
        np.testing.assert_allclose(got[col].astype(float), want[col].astype(float), rtol=1e-9, equal_nan=True)


def test_leak_against_clean_shows_the_changes_compare_computes(memory_runs, monkeypatch):
    leak, clean = memory_runs("leak"), memory_runs("clean")
    at = _page(monkeypatch, leak, diff=clean)  # neuron-prof view leak --diff clean
    assert at.selectbox(key="diff_other").value == clean.resolve()
    want = compare(summarize(neuron_prof.load(clean)), summarize(neuron_prof.load(leak)))
    got = _table(at)
    _assert_table_is(got, want)
    rows = got.set_index("metric")
    assert rows.loc["leak growth", "a"] == 0 and rows.loc["leak growth", "b"] > 0
    assert rows.loc["leak growth", "verdict"] == "worse" and rows.loc["memory peak", "verdict"] == "worse"
    assert rows.loc["graph breaks", "verdict"] == "same"
    assert any("leak growth" in w.value and "memory peak" in w.value for w in at.warning)
    cards = {m.label: m for m in at.metric}
    assert cards["leak growth (b)"].value.endswith("/step") and cards["leak growth (b)"].delta.startswith("+")
    # this run as the baseline: the same numbers the other way round
    at.toggle(key="diff_swap").set_value(True).run()
    assert not at.exception
    swapped = _table(at)
    _assert_table_is(swapped, compare(summarize(neuron_prof.load(leak)), summarize(neuron_prof.load(clean))))
    assert swapped.set_index("metric").loc["leak growth", "verdict"] == "better"


def test_the_second_run_can_be_picked_from_the_runs_next_to_this_one(memory_runs, monkeypatch):
    leak, clean = memory_runs("leak"), memory_runs("clean")
    at = _page(monkeypatch, clean)
    box = at.selectbox(key="diff_other")
    assert box.value is None and box.options[0] == "(none)"
    assert "leak" in box.options and "clean" not in box.options  # siblings, never this run itself
    assert "Pick a second run" in at.info[0].value and not at.dataframe
    box.select(leak.resolve()).run()
    assert not at.exception
    _assert_table_is(_table(at), compare(summarize(neuron_prof.load(leak)), summarize(neuron_prof.load(clean))))


def test_without_a_second_run_the_page_says_how_to_pick_one(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert at.selectbox(key="diff_other").options == ["(none)"]  # demo_run has no sibling run
    msg = at.info[0].value
    assert "neuron-prof view RUN --diff OTHER_RUN" in msg and "no other run directory" in msg
    assert not at.dataframe and not at.metric


# --- compare() --------------------------------------------------------------------------------

def _summary(median=10.0, mean=11.0, breaks=0, events=0, recompiles=0, compile_ms=0.0, top=1.0,
             peak=1000, growth=0.0, memory=True) -> dict:
    return {
        "steps": [{"rank": 0, "steps": 4, "mean_ms": mean, "median_ms": median}],
        "ops": {"captured_steps": 4, "top_by_self_time": [{"name": "aten::mm", "module": "fc", "self_ms": 4 * top,
                                                           "self_ms_per_step": top}]},
        "compile": {"graph_breaks": breaks, "graph_break_events": events, "recompiles": recompiles,
                    "compile_ms": compile_ms},
        "memory": {"captured": True, "devices": [{"rank": 0, "device": "cpu", "growth_per_step": growth,
                                                  "peak_between_boundaries": peak}]} if memory else {"captured": False},
    }


def test_compare_rows_changes_and_verdicts():
    a = _summary()
    b = _summary(median=8.0, mean=11.2, breaks=2, events=6, recompiles=1, compile_ms=500.0, top=0.5, peak=900,
                 growth=64.0)
    t = compare(a, b)
    assert list(t.columns) == COLUMNS
    r = t.set_index("metric")
    assert r.loc["step time (median)", ["a", "b", "change"]].tolist() == [10.0, 8.0, -2.0]
    assert r.loc["step time (median)", "change_pct"] == pytest.approx(-20.0)
    assert r.loc["step time (median)", "verdict"] == "better"
    assert r.loc["step time (mean)", "verdict"] == "same"  # +1.8%: noise
    assert r.loc["graph break sites", "verdict"] == "worse" and r.loc["graph breaks", "change"] == 6
    assert r.loc["recompiles", "verdict"] == "worse"
    assert r.loc["compile time", "verdict"] == "worse" and np.isnan(r.loc["compile time", "change_pct"])
    assert r.loc["top op self time", "verdict"] == "better"
    assert r.loc["top op self time", "detail"] == "aten::mm (fc) -> aten::mm (fc)"
    assert r.loc["memory peak", "verdict"] == "better" and r.loc["memory peak", "change"] == -100
    assert r.loc["leak growth", "verdict"] == "worse"
    assert (compare(a, copy.deepcopy(a))["verdict"] == "same").all()


def test_compare_without_memory_on_one_side_is_not_applicable():
    t = compare(_summary(), _summary(memory=False)).set_index("metric")
    assert t.loc["memory peak", "verdict"] == "n/a" and t.loc["leak growth", "verdict"] == "n/a"
    assert np.isnan(t.loc["memory peak", "b"]) and np.isnan(t.loc["memory peak", "change"])
    assert t.loc["recompiles", "verdict"] == "same"


def test_verdict():
    assert verdict(10, 9) == "better" and verdict(10, 11) == "worse"
    assert verdict(100, 103) == "same" and verdict(100, 103, measured=False) == "worse"
    assert verdict(0, 0) == "same" and verdict(0, 1) == "worse" and verdict(None, 1) == "n/a"
