"""The viewer's Compare page on real runs: its table is ``reports.compare.compare_runs``' checklist of the two
runs (what ``neuron-prof compare`` prints), whichever run is the baseline."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from conftest import viewer_page
from neuron_prof.analysis.compare import verdict
from neuron_prof.reports.compare import compare_runs

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


def _page(monkeypatch, run_dir: Path, diff: Path | None = None) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "compare", title="Compare", diff=diff)


def _table(at: AppTest) -> pd.DataFrame:
    t = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    # the run columns are named after the runs: a: NAME, b: NAME
    return t.rename(columns=lambda c: c.split(":")[0] if c.startswith(("a: ", "b: ")) else c)


def compare(a: Path, b: Path) -> pd.DataFrame:
    """The checklist of ``b`` against ``a``, as the page computes it."""
    return pd.DataFrame(compare_runs(neuron_prof.load(a), neuron_prof.load(b)).checklist.rows)


def _assert_table_is(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got["item"]) == list(want["item"])
    assert list(got["verdict"]) == list(want["verdict"])
    # step times and op times are the runs' own: equal to the last digit
    for col in ("a", "b", "ratio"):
        np.testing.assert_allclose(got[col].astype(float), want[col].astype(float), rtol=1e-9, equal_nan=True)


def test_leak_against_clean_shows_the_changes_compare_computes(memory_runs, monkeypatch):
    leak, clean = memory_runs("leak"), memory_runs("clean")
    at = _page(monkeypatch, leak, diff=clean)  # neuron-prof view leak --diff clean
    assert at.selectbox(key="diff_other").value == clean.resolve()
    got = _table(at)
    _assert_table_is(got, compare(clean, leak))
    rows = got.set_index("item")
    assert rows.loc["leak growth", "a"] == 0 and rows.loc["leak growth", "b"] > 0
    assert rows.loc["leak growth", "verdict"] == "worse"
    assert rows.loc["peak memory (busiest device)", "verdict"] == "worse"
    assert rows.loc["graph breaks", "verdict"] == "same"
    assert rows.loc["loss: max relative difference", "verdict"] == "n/a"  # captured without the loss collector
    assert any("leak growth" in w.value and "peak memory" in w.value for w in at.warning)
    cards = {m.label: m for m in at.metric}
    peak = cards["peak memory (busiest device) (b)"]
    assert peak.value.endswith("iB") and peak.delta.startswith("+")
    # this run as the baseline: the same numbers the other way round
    at.toggle(key="diff_swap").set_value(True).run()
    assert not at.exception
    swapped = _table(at)
    _assert_table_is(swapped, compare(leak, clean))
    assert swapped.set_index("item").loc["leak growth", "verdict"] == "better"


def test_the_second_run_can_be_picked_from_the_runs_next_to_this_one(memory_runs, monkeypatch):
    leak, clean = memory_runs("leak"), memory_runs("clean")
    at = _page(monkeypatch, clean)
    box = at.selectbox(key="diff_other")
    assert box.value is None and box.options[0] == "(none)"
    assert "leak" in box.options and "clean" not in box.options  # siblings, never this run itself
    assert "Pick a second run" in at.info[0].value and not at.dataframe
    box.select(leak.resolve()).run()
    assert not at.exception
    _assert_table_is(_table(at), compare(leak, clean))


def test_without_a_second_run_the_page_says_how_to_pick_one(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert at.selectbox(key="diff_other").options == ["(none)"]  # demo_run has no sibling run
    msg = at.info[0].value
    assert "neuron-prof view RUN --compare OTHER_RUN" in msg and "no other run directory" in msg
    assert not at.dataframe and not at.metric


def test_verdict():
    assert verdict(10, 9) == "better" and verdict(10, 11) == "worse"
    assert verdict(100, 103) == "same" and verdict(100, 103, measured=False) == "worse"
    assert verdict(0, 0) == "same" and verdict(0, 1) == "worse" and verdict(None, 1) == "n/a"
