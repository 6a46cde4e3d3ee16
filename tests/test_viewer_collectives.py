"""The viewer's Collectives page: the plain no-data message, and for two real gloo ranks the
per-rank step time and the straggler ranking (``analysis.steps.straggler_ranking``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from conftest import gloo_run, viewer_page
from neuron_prof.analysis.steps import straggler_ranking

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


def _page(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "collectives", title="Collectives")


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("viewer_ddp")
    return gloo_run(tmp, steps=4)


def test_a_single_rank_run_says_plainly_there_is_no_collective_data(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert len(at.info) == 1
    msg = at.info[0].value
    assert msg.startswith("This run has no collective data.")
    assert "`collectives` collector" in msg and "neuron-prof record" in msg and "torch.distributed" in msg
    assert any("one rank" in c.value for c in at.caption)
    assert not at.dataframe and not at.get("plotly_chart")


def test_two_ranks_show_step_time_per_rank_and_the_straggler_ranking(two_rank_run, monkeypatch):
    at = _page(monkeypatch, two_rank_run)
    assert at.info[0].value.startswith("This run has no collective data.")
    run = neuron_prof.load(two_rank_run)
    want = straggler_ranking(run.step_kinds)
    got = next(d.value for d in at.dataframe if "slowest" in d.value.columns)
    assert list(got["rank"]) == list(want["rank"]) and sorted(got["rank"]) == [0, 1]
    assert list(got["slowest"]) == list(want["slowest"]) and got["slowest"].sum() == 3  # steps 1-3: step 0 is warm-up
    assert got["mean_ms"].tolist() == pytest.approx(want["mean_ms"].tolist())
    top = want.iloc[0]
    assert any(f"rank {int(top['rank'])}** was the slowest in **{int(top['slowest'])} of 3" in m.value
               for m in at.markdown)
    # the step-time chart: one line per rank
    assert len(at.get("plotly_chart")) == 1
    # gloo's all-reduce shows up as communication time per rank
    comm = next(d.value for d in at.dataframe if "communication_ms" in d.value.columns)
    assert sorted(comm["rank"]) == [0, 1] and (comm["communication_ms"] > 0).all()


def _steps(ms: dict[int, list[float]], complete: bool = True) -> pd.DataFrame:
    """Step kinds where every complete step is steady (no warm-up: the ranking sees them all)."""
    rows = [{"rank": r, "step": i, "ts": i * 10**9, "dur": int(v * 1e6), "active": True, "complete": complete,
             "compile_ns": 0, "warmup": False, "steady": complete}
            for r, vals in ms.items() for i, v in enumerate(vals)]
    return pd.DataFrame(rows)


def test_straggler_ranking_leaves_out_the_first_step():
    """A rank's long first step (its start-up, its first compile) does not make it the straggler."""
    steps = _steps({0: [900, 10, 10, 10], 1: [12, 14, 15, 13]})[["rank", "step", "ts", "dur", "active", "complete"]]
    r = straggler_ranking(steps)
    assert r.iloc[0]["rank"] == 1 and (r["steps"] == 3).all()


def test_straggler_ranking_counts_the_slowest_rank_per_step():
    steps = _steps({0: [10, 10, 30, 10], 1: [12, 15, 11, 20], 2: [11, 11, 12, 12]})
    r = straggler_ranking(steps).set_index("rank")
    assert list(straggler_ranking(steps)["rank"]) == [1, 0, 2]
    assert r.loc[1, "slowest"] == 3 and r.loc[0, "slowest"] == 1 and r.loc[2, "slowest"] == 0
    assert r.loc[1, "slowest_pct"] == pytest.approx(75.0)
    assert (r["steps"] == 4).all()
    assert r.loc[0, "mean_ms"] == pytest.approx(15.0) and r.loc[0, "median_ms"] == pytest.approx(10.0)
    # behind the fastest: rank 1 is 2, 5, 0 (it is the fastest), 10 ms behind
    assert r.loc[1, "behind_fastest_ms"] == pytest.approx(np.mean([2, 5, 0, 10]))


def test_straggler_ranking_compares_only_steps_every_rank_completed():
    steps = _steps({0: [10, 10, 10], 1: [20, 20]})
    steps.loc[(steps["rank"] == 0) & (steps["step"] == 1), "complete"] = False
    r = straggler_ranking(steps)
    assert (r["steps"] == 1).all() and r.iloc[0]["rank"] == 1
    assert straggler_ranking(_steps({0: [10, 12]})).empty  # one rank: nothing to rank
    assert straggler_ranking(_steps({0: [10], 1: [12]}, complete=False)).empty
