"""The viewer's Collectives page on a real 2-rank gloo DDP job where rank 1 sleeps before its
gradient all-reduce in known steps: the page names rank 1 and those steps, the heat map has rank
0 waiting about the sleep in exactly those steps, the lanes draw the wait; a single-rank run
shows the plain no-data message that says how to capture collectives."""
from __future__ import annotations

import ast
import re

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import plotly_array, shown, viewer_page
from ddp_straggler import straggler_run

pytest.importorskip("streamlit")

# The sleep only has to stand out: with two CPU burners on the 2 cores, waits outside the slow
# steps stay under ~60 ms (ranks run one intra-op thread each), over 10x below half of 1 s.
# Against the noise floor of the significance rule (median + 4.45 MAD of the 5 steady steps' top
# waits: 3 quiet, 2 slow) no quiet step can count (the median is the largest quiet wait), and
# the sleeps count unless quiet waits reach ~180 ms, 3x what a loaded machine showed. More quiet
# steps would let the largest of them out-run the floor (7 ms over it in 1 of 6 runs with 7).
SLOW_RANK, SLOW_STEPS, SLEEP_S, STEPS = 1, [2, 4], 1.0, 6
SLEEP_MS = SLEEP_S * 1e3


def _page(monkeypatch, run_dir: Path):
    return viewer_page(monkeypatch, run_dir, "collectives", title="Collectives")


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _heatmap(at) -> dict:
    """The heat map's cells: {rank: {step: ms}}."""
    hm = next(t for f in _figures(at) for t in f["data"] if t["type"] == "heatmap")
    z = plotly_array(hm["z"])
    return {int(y.split()[1]): {int(x): float(v) for x, v in zip(hm["x"], row)} for y, row in zip(hm["y"], z)}


def _wait_bars(at) -> dict[str, list[float]]:
    """The lanes' red bars: lane ("rank N") -> the waits drawn on it, ms."""
    bars: dict[str, list[float]] = {}
    for f in _figures(at):
        for t in f["data"]:
            if t["type"] == "bar" and t.get("name") == "wait for the last rank":
                for y, x in zip(plotly_array(t["y"]), plotly_array(t["x"])):
                    bars.setdefault(str(y), []).append(float(x))
    return bars


@pytest.fixture(scope="module")
def straggler(tmp_path_factory) -> Path:
    return straggler_run(tmp_path_factory.mktemp("viewer_coll"), steps=STEPS, slow_rank=SLOW_RANK,
                         slow_steps=SLOW_STEPS, sleep_s=SLEEP_S)


def test_a_run_without_collectives_says_so_and_how_to_capture_them(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert [i.value.split(".")[0] for i in at.info] == ["This run has no collective data"]
    msg = at.info[0].value
    assert "`collectives` collector" in msg and "init_process_group" in msg and "neuron-prof record" in msg
    assert not at.dataframe and not at.get("plotly_chart") and not at.selectbox


@pytest.mark.multiprocess
@pytest.mark.timing
def test_the_page_names_the_straggler_and_its_steps(straggler, monkeypatch):
    at = _page(monkeypatch, straggler)
    assert not at.info  # no "no collective data" above real data
    said = [shown(w.value) for w in at.warning]
    assert len(said) == 1, said  # the report's finding, word for word
    assert said[0].startswith(f"rank {SLOW_RANK} made the others wait ")
    # the slow steps are named; a loaded machine may stall a rank for tens of ms in another step,
    # which is real waiting too (the heat map test below pins the waits of about the sleep)
    named = [int(x) for x in re.findall(r"\d+", said[0].split(" in step")[1].split(" (all_reduce of ")[0])]
    assert set(SLOW_STEPS) <= set(named) and said[0].endswith(", backward)")
    ranking = next(d.value for d in at.dataframe if "wait caused (ms)" in d.value.columns)
    assert list(ranking["rank"]) == [SLOW_RANK, 1 - SLOW_RANK]
    assert set(SLOW_STEPS) <= set(ast.literal_eval(ranking["straggler in steps"].iloc[0]))
    assert ranking["straggler in steps"].iloc[1] == "[]"
    assert ranking["wait caused (ms)"].iloc[0] >= 0.5 * len(SLOW_STEPS) * SLEEP_MS  # the sleeps (margin above)


@pytest.mark.multiprocess
@pytest.mark.timing
def test_heat_map_has_the_other_rank_waiting_the_sleep_in_exactly_those_steps(straggler, monkeypatch):
    cells = _heatmap(_page(monkeypatch, straggler))
    assert sorted(cells) == [0, 1]
    waiter = cells[1 - SLOW_RANK]
    # step 0 (warm-up: ranks start their first step apart) aside, exactly the slow steps hold a
    # wait of half the sleep or more (margin above), each longer than any other step's on either rank
    assert sorted(s for s, ms in waiter.items() if ms >= SLEEP_MS / 2 and s > 0) == SLOW_STEPS
    quiet = max(ms for r in cells for s, ms in cells[r].items() if s > 0 and s not in SLOW_STEPS)
    assert all(waiter[s] > quiet for s in SLOW_STEPS)
    assert all(cells[SLOW_RANK][s] == 0 for s in SLOW_STEPS)  # the straggler arrived last: no wait


@pytest.mark.multiprocess
@pytest.mark.timing
def test_lanes_open_on_a_slow_step_and_follow_the_step_picked(straggler, monkeypatch):
    at = _page(monkeypatch, straggler)
    step = at.selectbox(key="coll_step")
    assert step.value in SLOW_STEPS  # the step with the most significant wait comes first
    cells = _heatmap(at)
    bars = _wait_bars(at)
    # the waiter's bar is its heat-map cell (one all-reduce a step); the straggler has none
    assert max(bars[f"rank {1 - SLOW_RANK}"]) == pytest.approx(cells[1 - SLOW_RANK][step.value])
    assert f"rank {SLOW_RANK}" not in bars
    calm = next(s for s in step.options if int(s) not in SLOW_STEPS and int(s) > 0)
    step.set_value(int(calm)).run()
    assert not at.exception
    assert all(x < min(cells[1 - SLOW_RANK][s] for s in SLOW_STEPS) for xs in _wait_bars(at).values() for x in xs)
    lanes = next(f for f in _figures(at) if any(t["type"] == "bar" for t in f["data"]))
    ops = {t["name"] for t in lanes["data"]} - {"wait for the last rank"}
    assert "all_reduce" in ops and all(np.isfinite(plotly_array(t["x"])).all() for t in lanes["data"])
