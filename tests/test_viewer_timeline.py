"""The viewer's Timeline page on real runs: the bars it draws are the chosen step's ops (checked
against ``Run.ops``), the window narrows them, compiles and graph breaks show, live memory is the
memory timeline's, and "Open in Perfetto" writes the run's trace and hands it to the page."""
from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.runtime.media_file_manager import MediaFileManager  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import neuron_prof  # noqa: E402
from neuron_prof.analysis import memory as mem  # noqa: E402
from neuron_prof.analysis import timeline as tla  # noqa: E402
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak  # noqa: E402

from conftest import capture_graph_breaks, check_trace, viewer_page  # noqa: E402

TRACE = "trace.perfetto-trace"


def _page(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "timeline")


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _values(v) -> np.ndarray:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


def _figure(at: AppTest) -> dict:
    charts = at.get("plotly_chart")
    assert len(charts) == 1
    return json.loads(charts[0].proto.spec)


def _bars(at: AppTest) -> pd.DataFrame:
    """The op bars drawn: row, name, ts (ns), start and length (ms)."""
    rows = []
    for t in _figure(at)["data"]:
        if t["type"] == "bar" and t["name"] in ("forward", "backward"):
            for y, c, base, x in zip(t["y"], t["customdata"], _values(t["base"]), _values(t["x"])):
                rows.append({"row": y, "name": c[0], "ts": int(c[3]), "base": float(base), "ms": float(x),
                             "pass": t["name"]})
    return pd.DataFrame(rows, columns=["row", "name", "ts", "base", "ms", "pass"])


def _expected(run, step: int, lo_ns: int | None = None, hi_ns: int | None = None, depth: int = 0) -> pd.DataFrame:
    """Straight from Run.ops: rank 0's ops of ``step`` up to ``depth`` overlapping the window."""
    o = run.ops[(run.ops["rank"] == 0) & (run.ops["step"] == step) & (run.ops["depth"] <= depth)]
    if lo_ns is not None:
        o = o[(o["ts"] <= hi_ns) & (o["ts"] + o["dur"] >= lo_ns)]
    return o


def _step(run, step: int) -> pd.Series:
    s = run.steps
    return s[(s["rank"] == 0) & (s["step"] == step)].iloc[0]


@pytest.fixture(scope="module")
def compile_run(tmp_path_factory) -> Path:
    """examples/graph_breaks.py compiled (eager backend: quick) in three captured steps."""
    return capture_graph_breaks(tmp_path_factory.mktemp("timeline") / "compiled", "eager")


# ---------------------------------------------------------------- the analysis it uses
def _ops(rows: list[dict]) -> pd.DataFrame:
    base = {"rank": 0, "tid": 1, "thread": "MainThread", "module": "", "source": "", "bwd": False, "depth": 0}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_step_choices_and_default_step():
    steps = pd.DataFrame({"rank": [0, 0, 0, 1], "step": [0, 1, 2, 0], "ts": [100, 200, 300, 100],
                          "dur": [100, 100, 50, 10], "active": [False, True, True, True],
                          "complete": [True, True, False, True]})
    ops = _ops([{"name": "early", "ts": 10, "dur": 30, "step": -1}, {"name": "a", "ts": 110, "dur": 5, "step": 0},
                {"name": "b", "ts": 310, "dur": 5, "step": 2}, {"name": "c", "ts": 320, "dur": 5, "step": 2}])
    c = tla.step_choices(steps, ops, 0)
    assert c["step"].tolist() == [-1, 0, 1, 2] and c["ops"].tolist() == [1, 1, 0, 2]
    assert c.iloc[0][["ts", "dur"]].tolist() == [10, 30]  # before the first step: those ops' span
    assert tla.default_step(c) == 2  # step 1 is captured but has no ops
    assert tla.default_step(c.assign(active=False)) == -1  # else the first with ops
    assert tla.step_choices(steps, ops, 1)["step"].tolist() == [0]
    # with step kinds and a start-up span: -1 is the start-up, and a warm-up step is not the default
    kinds = steps.assign(warmup=[False, False, False, True], active=[True, True, True, True])
    spans = pd.DataFrame({"rank": [0], "ts": [0], "dur": [100], "tid": [1], "name": ["start-up"]})
    c = tla.step_choices(kinds.assign(warmup=[True, False, False, True]), ops, 0, spans)
    assert c.iloc[0][["step", "ts", "dur"]].tolist() == [-1, 0, 100]
    assert tla.default_step(c) == 2  # step 0 (warm-up) has ops, but step 2 is the first steady one with ops


def test_window_ops_and_longest_ops():
    ops = _ops([{"name": "before", "ts": 0, "dur": 10, "step": 0},  # ends at the window's start: in
                {"name": "across", "ts": 5, "dur": 100, "step": 0},
                {"name": "inner", "ts": 20, "dur": 1, "step": 0, "depth": 1},
                {"name": "deep", "ts": 21, "dur": 1, "step": 0, "depth": 2},
                {"name": "late", "ts": 51, "dur": 1, "step": 0},  # starts after the window
                {"name": "other step", "ts": 30, "dur": 1, "step": 1},
                {"name": "other rank", "ts": 30, "dur": 1, "step": 0, "rank": 1}])
    assert tla.window_ops(ops, 0, 0, 10, 50)["name"].tolist() == ["before", "across"]
    assert tla.window_ops(ops, 0, 0, 10, 50, max_depth=1)["name"].tolist() == ["before", "across", "inner"]
    assert tla.window_ops(ops, 1, 0, 10, 50)["name"].tolist() == ["other rank"]
    ties = _ops([{"name": n, "ts": t, "dur": d, "step": 0} for n, t, d in
                 [("a", 1, 5), ("b", 2, 9), ("c", 3, 5), ("d", 4, 1)]])
    assert tla.longest_ops(ties, 2)["name"].tolist() == ["a", "b"]  # equal durations: the earlier; time order
    assert tla.longest_ops(ties, 10)["name"].tolist() == ["a", "b", "c", "d"]
    instants = pd.DataFrame({"rank": [0, 0, 0], "ts": [9, 10, 51]})
    assert tla.in_window(instants, 0, 10, 50)["ts"].tolist() == [10]


def test_memory_window_is_live_memory_inside_the_window():
    a = pd.DataFrame({"rank": 0, "device": "cpu", "category": pd.Categorical(["parameter"] * 4, mem.CATEGORIES),
                      "bytes": [100, 10, 1000, 5], "alloc_ts": [0, 15, 20, 60],
                      "free_ts": [mem.NEVER, 30, 70, 80]})
    w = tla.memory_window(a, 0, 10, 50)
    assert w["ts"].tolist() == [10, 15, 20, 30] and w["total"].tolist() == [100, 110, 1110, 1100]
    assert tla.memory_window(a, 1, 10, 50).empty


def test_memory_window_matches_live_at_on_a_real_run(memory_runs):
    run = neuron_prof.load(memory_runs("spike"))
    s = _step(run, 4)
    t0, t1 = int(s["ts"]), int(s["ts"] + s["dur"])
    w = tla.memory_window(analyze(run).memory_allocations, 0, t0, t1)
    assert w["ts"].iloc[0] == t0 and w["ts"].max() <= t1
    for ts, total in zip(w["ts"], w["total"]):
        assert total == mem.live_at(analyze(run).memory_allocations, int(ts), 0, "cpu")["bytes"].sum()
    assert w["total"].max() == analyze(run).memory_peaks.set_index("step").loc[4, "bytes"]


# ---------------------------------------------------------------- the page
def test_bars_are_the_first_captured_steps_ops_and_follow_the_step(demo_run, monkeypatch):
    run = neuron_prof.load(demo_run)
    at = _page(monkeypatch, demo_run)
    first = int(run.steps[run.steps["active"]]["step"].min())
    assert at.selectbox(key="tl_step").value == first
    bars = _bars(at)
    expect = _expected(run, first)
    assert len(bars) == len(expect) > 0
    assert sorted(zip(bars["ts"], bars["name"])) == sorted(zip(expect["ts"], expect["name"].astype(str)))
    t0 = int(_step(run, first)["ts"])
    np.testing.assert_allclose(np.sort(bars["base"]), np.sort((expect["ts"] - t0) / 1e6), atol=1e-6)
    assert set(bars["pass"]) == {"forward", "backward"}
    assert bars[bars["pass"] == "backward"]["ts"].isin(expect[expect["bwd"]]["ts"]).all()
    assert set(bars["row"]) == set(expect["thread"].astype(str))
    assert f"all {len(expect)} ops the user called" in at.caption[0].value

    at.selectbox(key="tl_step").select(first + 1).run()
    _ok(at)
    bars = _bars(at)
    expect = _expected(run, first + 1)
    assert sorted(zip(bars["ts"], bars["name"])) == sorted(zip(expect["ts"], expect["name"].astype(str)))
    assert not set(bars["ts"]) & set(_expected(run, first)["ts"])
    assert at.slider(key="tl_window").value[0] == 0.0  # a new step shows all of it
    assert at.slider(key="tl_window").value[1] >= _step(run, first + 1)["dur"] / 1e6


def test_window_slider_narrows_the_bars(demo_run, monkeypatch):
    run = neuron_prof.load(demo_run)
    at = _page(monkeypatch, demo_run)
    step = at.selectbox(key="tl_step").value
    full = len(_bars(at))
    t0 = int(_step(run, step)["ts"])
    # a window from the start of the op a quarter of the way through the step's top-level ops to
    # the end of the one halfway: never empty, whatever the machine made of the step's timing
    tops = _expected(run, step).sort_values("ts")
    first, last = tops.iloc[len(tops) // 4], tops.iloc[len(tops) // 2]
    lo = np.floor((first["ts"] - t0) / 1e3) / 1e3
    hi = np.ceil((last["ts"] + last["dur"] - t0) / 1e3) / 1e3
    at.slider(key="tl_window").set_value((lo, hi)).run()
    _ok(at)
    bars = _bars(at)
    expect = _expected(run, step, t0 + int(round(lo * 1e6)), t0 + int(round(hi * 1e6)))
    assert 0 < len(bars) < full
    assert sorted(bars["ts"]) == sorted(expect["ts"])
    assert _figure(at)["layout"]["xaxis"]["range"] == [lo, hi]


def test_depth_one_and_the_bar_limit(demo_run, monkeypatch):
    run = neuron_prof.load(demo_run)
    at = _page(monkeypatch, demo_run)
    step = at.selectbox(key="tl_step").value
    at.toggle(key="tl_depth1").set_value(True).run()
    _ok(at)
    bars = _bars(at)
    expect = _expected(run, step, depth=1)
    assert sorted(bars["ts"]) == sorted(expect["ts"])
    assert (bars["row"].str.endswith("› depth 1") == bars["ts"].isin(expect[expect["depth"] == 1]["ts"])).all()
    at.number_input(key="tl_max_bars").set_value(100).run()
    _ok(at)
    bars = _bars(at)
    assert len(bars) == 100 < len(expect)
    drawn = expect[expect["ts"].isin(bars["ts"])]
    assert drawn["dur"].min() >= expect[~expect["ts"].isin(bars["ts"])]["dur"].max()  # the longest
    assert f"the 100 longest of the {len(expect)} ops" in at.caption[0].value


def test_compile_spans_graph_breaks_and_memory_line(compile_run, monkeypatch):
    run = neuron_prof.load(compile_run)
    assert len(run.compiles) and len(run.graph_breaks)
    at = _page(monkeypatch, compile_run)
    step = at.selectbox(key="tl_step").value
    s = _step(run, step)
    _, top = at.slider(key="tl_window").value
    t0, t1 = int(s["ts"]), int(s["ts"]) + int(round(top * 1e6))
    fig = _figure(at)
    compiles = next(t for t in fig["data"] if t["name"] == "compile")
    c = run.compiles[(run.compiles["ts"] <= t1) & (run.compiles["ts"] + run.compiles["dur"] >= t0)]
    assert len(c) > 0 and sorted(x[1] for x in compiles["customdata"]) == sorted(c["compile_id"].astype(str))
    np.testing.assert_allclose(np.sort(_values(compiles["x"])), np.sort(c["dur"] / 1e6))
    breaks = next(t for t in fig["data"] if t["name"] == "graph break")
    g = run.graph_breaks[(run.graph_breaks["ts"] >= t0) & (run.graph_breaks["ts"] <= t1)]
    assert len(g) > 0 and sorted(x[0] for x in breaks["customdata"]) == sorted(g["reason_class"].astype(str))
    assert f"{len(c)} compiles, {len(g)} graph breaks" in at.caption[0].value
    line = next(t for t in fig["data"] if t["name"] == "live bytes cpu")
    w = tla.memory_window(analyze(run).memory_allocations, 0, t0, t1, 2000)
    np.testing.assert_array_equal(_values(line["y"])[:-1], w["total"].to_numpy())


def test_open_in_perfetto_writes_the_trace_and_hands_it_to_the_page(memory_runs, tmp_path, monkeypatch):
    run_dir = tmp_path / "leak"
    shutil.copytree(memory_runs("leak"), run_dir)
    made = {}
    add = MediaFileManager.add_deferred

    def keep(self, fn, mimetype, coordinates, file_name=None, **kw):
        made[file_name] = fn
        return add(self, fn, mimetype, coordinates, file_name, **kw)

    monkeypatch.setattr(MediaFileManager, "add_deferred", keep)
    at = _page(monkeypatch, run_dir)
    trace = run_dir / TRACE
    assert not trace.exists() and not at.get("iframe")  # nothing is written or embedded before the click
    at.button(key="tl_perfetto").click().run()
    _ok(at)
    assert trace.exists()
    report = check_trace(trace)
    assert report.ok
    frames = at.get("iframe")
    assert len(frames) == 1
    page = frames[0].proto.srcdoc
    assert base64.b64encode(trace.read_bytes()).decode() in page
    for part in ('"https://ui.perfetto.dev"', 'postMessage("PING", ORIGIN)', 'evt.data !== "PONG"',
                 "perfetto: {buffer: bytes.buffer, title: TITLE", "window.open(ORIGIN)"):
        assert part in page, part
    assert made[TRACE]() == trace.read_bytes()  # the download button hands over the same file

    # a run that grew since is exported again; an unchanged one is not
    first = trace.stat().st_mtime_ns
    at.button(key="tl_perfetto").click().run()
    assert trace.stat().st_mtime_ns == first
    manifest = next(run_dir.glob("rank-*/manifest.jsonl"))
    os.utime(manifest, ns=(first + 1000, first + 1000))  # committed to after the trace was written
    at.button(key="tl_perfetto").click().run()
    _ok(at)
    assert trace.stat().st_mtime_ns > manifest.stat().st_mtime_ns > first
    check_trace(trace)


def test_leak_and_spike_runs_render(memory_runs, monkeypatch):
    for mode in ("leak", "spike"):
        run = neuron_prof.load(memory_runs(mode))
        at = _page(monkeypatch, memory_runs(mode))
        assert at.selectbox(key="tl_step").value == 1  # the first steady step: step 0 is warm-up
        assert sorted(_bars(at)["ts"]) == sorted(_expected(run, 1)["ts"])


def test_run_without_ops_shows_the_message(tmp_path, monkeypatch):
    with neuron_prof.profile(tmp_path / "run", collectors=["memory"]) as prof:
        memory_leak.train(3, "leak", prof)
    assert neuron_prof.load(tmp_path / "run").ops.empty
    at = _page(monkeypatch, tmp_path / "run")
    assert at.info and at.info[0].value.startswith("This run has no ops.")
    assert not at.get("plotly_chart") and not at.selectbox
