"""The viewer's Memory page on real runs of examples/memory_leak.py and the transformer demo: every
number it shows is what neuron_prof's memory analyses return for the same run."""
from __future__ import annotations

import base64
import inspect
import json
import os
import pickle
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
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak  # noqa: E402
from neuron_prof.export import memory_snapshot  # noqa: E402

from conftest import MEMORY_STEPS, line_of, shown, viewer_page  # noqa: E402

SOURCE = Path(inspect.getsourcefile(memory_leak)).resolve()
LEAK = memory_leak.leaked_bytes_per_step()  # 24,708 bytes


def _page(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "memory")


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _table(at: AppTest, *columns: str) -> pd.DataFrame:
    """The one dataframe on the page that has these columns."""
    found = [d.value for d in at.dataframe if set(columns) <= set(d.value.columns)]
    assert len(found) == 1, [list(d.value.columns) for d in at.dataframe]
    return found[0].reset_index(drop=True)


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    return df.astype({c: str for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)}).reset_index(
        drop=True)


def _caption(at: AppTest, start: str) -> str:
    return next(c.value for c in at.caption if c.value.startswith(start))


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _chart(at: AppTest, key: str) -> dict:
    return next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith(f"-{key}"))


def _values(v) -> np.ndarray:
    """A plotly trace array as JSON holds it: a list, or typed base64 (``bdata``)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


def _size(n: float) -> str:
    """Sizes as the viewer writes them (and the Overview's findings)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------- the analysis it adds
def _allocs(rows: list[dict]) -> pd.DataFrame:
    base = {"rank": 0, "device": "cpu", "step": 0, "op": "aten::empty", "top_op": "aten::empty", "module": "",
            "user_source": "", "source_full": "", "stack": 0, "shape": "", "dtype": "float32", "bwd": False,
            "grad": False, "free_op": "", "free_bwd": False, "baseline": False, "category": "temporary",
            "free_ts": mem.NEVER}
    df = pd.DataFrame([{**base, **r} for r in rows])
    for c in ("device", "op", "top_op", "module", "source", "user_source", "source_full", "shape", "dtype", "free_op"):
        df[c] = df[c].astype("category")
    df["category"] = pd.Categorical(df["category"], categories=mem.CATEGORIES)
    return df[mem.ALLOC_COLUMNS]


def test_peak_site_details_adds_the_largest_block_of_each_site():
    a = _allocs([
        {"addr": 1, "bytes": 400, "alloc_ts": 10, "source": "a.py:1", "top_op": "aten::relu", "shape": "[10, 10]",
         "stack": 7, "category": "activation"},
        {"addr": 2, "bytes": 400, "alloc_ts": 20, "source": "a.py:1", "top_op": "aten::relu", "shape": "[100]",
         "stack": 8, "category": "activation"},  # as big as addr 1 and made later: it is the one shown
        {"addr": 3, "bytes": 40, "alloc_ts": 30, "source": "a.py:1", "top_op": "aten::relu", "shape": "[10]",
         "stack": 9, "category": "activation"},
        {"addr": 4, "bytes": 1000, "alloc_ts": 40, "source": "b.py:2", "top_op": "aten::cat", "shape": "[250]",
         "dtype": "int32", "stack": 3},
        {"addr": 5, "bytes": 5000, "alloc_ts": 5, "free_ts": 45, "source": "c.py:3", "shape": "[1250]"},  # gone
        {"addr": 6, "bytes": 9000, "alloc_ts": 50, "source": "d.py:4", "shape": "[9]"},  # not yet made
        {"addr": 7, "bytes": 7000, "alloc_ts": 1, "source": "e.py:5", "shape": "[7]", "device": "cuda:0"},
    ])
    got = mem.peak_site_details(a, 0, "cpu", 45)
    sites = mem.peak_sites(a, 0, "cpu", 45)
    pd.testing.assert_frame_equal(got[list(sites.columns)], sites)  # the same rows as peak_sites
    assert got["source"].astype(str).tolist() == ["b.py:2", "a.py:1"]
    assert got["bytes"].tolist() == [1000, 840] and got["blocks"].tolist() == [1, 3]
    assert got["shape"].tolist() == ["[250]", "[100]"] and got["dtype"].tolist() == ["int32", "float32"]
    assert got["largest"].tolist() == [1000, 400] and got["shapes"].tolist() == [1, 3]
    assert got["stack"].tolist() == [3, 8]
    assert mem.peak_site_details(a, 0, "cpu", 0).empty  # nothing live yet
    assert len(mem.peak_site_details(a, 0, "cpu", 45, top=1)) == 1


# ---------------------------------------------------------------- the page
def test_leak_run_shows_the_growth_per_step_and_the_leaking_line(memory_runs, monkeypatch):
    run_dir = memory_runs("leak")
    run = neuron_prof.load(run_dir)
    leaks = analyze(run).memory_leaks
    at = _page(monkeypatch, run_dir)
    assert leaks["growth_per_step"].iloc[0] == LEAK
    assert _metric(at, "growth per step") == _size(LEAK) == "24.1 KiB"
    assert _metric(at, "confidence") == f"{leaks['confidence'].iloc[0]:.2f}"
    assert "24,708 bytes/step" in at.error[0].value and "24.1 KiB per step" in at.error[0].value
    shown = _table(at, "bytes_per_step", "steps_seen")
    expect = _plain(leaks[leaks["source"] != ""])
    assert shown["source"].tolist() == expect["source"].tolist()
    assert shown["bytes_per_step"].tolist() == expect["bytes_per_step"].tolist()
    assert shown["op"].tolist() == expect["op"].tolist()
    leak_line = f"memory_leak.py:{line_of(SOURCE, 'LEAK-LINE')}"
    assert any(s.endswith(leak_line) for s in shown["source"])
    # the chart of live bytes at every step boundary is Run.memory_steps
    fig = _chart(at, "mem_steps_chart")
    live = next(t for t in fig["data"] if t["name"] == "live")
    np.testing.assert_array_equal(_values(live["y"]), run.memory_steps["live"].to_numpy())
    np.testing.assert_array_equal(np.diff(_values(live["y"])), LEAK)


def test_clean_run_has_no_leak(memory_runs, monkeypatch):
    at = _page(monkeypatch, memory_runs("clean"))
    assert at.success and at.success[0].value.startswith("No leak")
    assert not [m for m in at.metric if m.label == "growth per step"]


def test_spike_run_shows_the_worst_step_its_peak_and_the_spike_line(memory_runs, monkeypatch):
    run_dir = memory_runs("spike")
    run = neuron_prof.load(run_dir)
    at = _page(monkeypatch, run_dir)
    peaks = _table(at, "step", "bytes", "alloc_bytes")
    expect = _plain(analyze(run).memory_peaks[["step", "bytes", "op", "source", "user_source", "module", "alloc_bytes",
                                      "category"]])
    pd.testing.assert_frame_equal(peaks, expect, check_dtype=False)
    spike_line = f"memory_leak.py:{line_of(SOURCE, 'SPIKE-LINE')}"
    worst = peaks.loc[peaks["bytes"].idxmax()]
    assert worst["step"] == MEMORY_STEPS // 2 == 4
    assert worst["alloc_bytes"] == 2_097_152 and worst["source"].endswith(spike_line)
    assert at.selectbox(key="mem_peak_step").value == 4  # the run's worst step is the default
    assert f"Step 4 peaked at **{_size(worst['bytes'])}** ({worst['bytes']:,} bytes)" in at.markdown[0].value
    assert "2,097,152 bytes from aten::contiguous at " in shown(at.markdown[0].value)
    # what was live at that peak, by site, with the shape of the spike's temporary
    ts = int(analyze(run).memory_peaks.set_index("step").loc[4, "ts"])
    sites = _table(at, "blocks", "shape", "largest")
    expect = _plain(mem.peak_site_details(analyze(run).memory_allocations, 0, "cpu", ts, 10).drop(columns=["stack"]))
    pd.testing.assert_frame_equal(sites, expect, check_dtype=False)
    assert sites.loc[0, "source"].endswith(spike_line) and sites.loc[0, "shape"] == "[256, 32, 64]"
    assert sites.loc[0, "bytes"] == 2_097_152 and sites.loc[0, "op"] == "aten::contiguous"
    # and the user stack of the first site: innermost frame is the spike's line in train()
    code = at.code[0].value.splitlines()
    assert code[0] == f"{os.path.relpath(SOURCE, run.meta['cwd'])}:{line_of(SOURCE, 'SPIKE-LINE')}  train"
    # the highest point of the whole-capture chart is the spike's peak
    assert f"highest in this range: {_size(worst['bytes'])} ({worst['bytes']:,} bytes)" in _caption(at, "highest")


def test_choosing_another_step_and_site_changes_the_tables(memory_runs, monkeypatch):
    run_dir = memory_runs("spike")
    run = neuron_prof.load(run_dir)
    at = _page(monkeypatch, run_dir)
    at.selectbox(key="mem_peak_step").select(2).run()
    _ok(at)
    p = analyze(run).memory_peaks.set_index("step").loc[2]
    assert at.markdown[0].value.startswith(f"Step 2 peaked at **{_size(p['bytes'])}** ({int(p['bytes']):,} bytes)")
    sites = _table(at, "blocks", "shape", "largest")
    details = mem.peak_site_details(analyze(run).memory_allocations, 0, "cpu", int(p["ts"]), 10)
    pd.testing.assert_frame_equal(sites, _plain(details.drop(columns=["stack"])), check_dtype=False)
    assert "aten::contiguous" not in set(sites["op"])  # the spike is step 4's only
    # another site: its own stack
    box = at.selectbox(key="mem_site")
    assert len(box.options) == len(details)
    at.selectbox(key="mem_site").set_value(box.options[1]).run()
    _ok(at)
    frames = run.stack(0, int(details["stack"].iloc[1]))
    assert frames and at.code[0].value == "\n".join(f"{run.display_path(f)}:{line}  {func}"
                                                   for f, func, line in frames)
    # the timeline of one step: its highest point is that step's peak
    at.selectbox(key="mem_range").select(4).run()
    _ok(at)
    p4 = analyze(run).memory_peaks.set_index("step").loc[4]
    assert f"highest in this range: {_size(p4['bytes'])} ({int(p4['bytes']):,} bytes)" in _caption(at, "highest")


def test_diff_between_two_steps_of_the_leak_run_is_three_leaks(memory_runs, monkeypatch):
    run_dir = memory_runs("leak")
    run = neuron_prof.load(run_dir)
    at = _page(monkeypatch, run_dir)
    at.selectbox(key="mem_diff_a").select(2)
    at.selectbox(key="mem_diff_b").select(5).run()
    _ok(at)
    assert "From the end of step 2 to the end of step 5: net **+74,124 bytes**." in [m.value for m in at.markdown]
    assert 74_124 == 3 * LEAK
    assert _metric(at, "net growth") == "+" + _size(3 * LEAK)
    ts = dict(zip(*mem.step_boundaries(run.steps)[["step", "ts"]].to_numpy().T))
    expect = mem.snapshot_diff(analyze(run).memory_allocations, ts[2], ts[5], "source", 0, "cpu")
    pd.testing.assert_frame_equal(_table(at, "appeared", "net"), _plain(expect), check_dtype=False)
    at.selectbox(key="mem_diff_by").select("category").run()
    _ok(at)
    by_cat = _table(at, "appeared", "net")
    assert set(by_cat.columns) >= {"category"} and int(by_cat["net"].sum()) == 3 * LEAK


def test_snapshot_download_is_the_memory_viz_pickle(memory_runs, monkeypatch):
    run_dir = memory_runs("leak")
    made = {}
    add = MediaFileManager.add_deferred

    def keep(self, fn, mimetype, coordinates, file_name=None, **kw):  # the page's callable, then streamlit's own
        made[file_name] = fn
        return add(self, fn, mimetype, coordinates, file_name, **kw)

    monkeypatch.setattr(MediaFileManager, "add_deferred", keep)
    at = _page(monkeypatch, run_dir)
    assert at.get("download_button")[0].proto.deferred_file_id  # built only when clicked
    blob = made["memory-snapshot-rank0.pickle"]()
    snap = pickle.loads(blob)
    assert set(snap) == {"segments", "device_traces"}
    assert snap == memory_snapshot.snapshot(neuron_prof.load(run_dir), 0)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert len(allocs) == len(analyze(neuron_prof.load(run_dir)).memory_allocations)


def test_demo_run_renders_its_peaks(demo_run, monkeypatch):
    run = neuron_prof.load(demo_run)
    at = _page(monkeypatch, demo_run)
    peaks = _table(at, "step", "bytes", "alloc_bytes")
    assert peaks["step"].tolist() == analyze(run).memory_peaks["step"].tolist()
    assert peaks["bytes"].tolist() == analyze(run).memory_peaks["bytes"].tolist()
    assert at.selectbox(key="mem_diff_a").options  # captured steps only
    assert [int(o) for o in at.selectbox(key="mem_diff_a").options] == \
        run.steps[run.steps["active"] & run.steps["complete"]]["step"].tolist()


def test_run_without_memory_shows_only_the_message(tmp_path, monkeypatch):
    with neuron_prof.profile(tmp_path / "run", collectors=["eager"]) as prof:
        memory_leak.train(3, "leak", prof)
    at = _page(monkeypatch, tmp_path / "run")
    assert [i.value for i in at.info] and at.info[0].value.startswith("This run has no memory data.")
    assert "`memory` collector is on by default" in at.info[0].value
    assert not at.dataframe and not at.metric and not at.get("plotly_chart") and not at.selectbox


def test_an_always_on_run_shows_the_process_memory_of_every_step(tmp_path, monkeypatch):
    """Always-on capture follows the CPU allocator in its sampled steps only: with no dump its run
    has the process's resident memory at every step and no allocator figures, and the page shows
    that memory (not "no memory data"), saying the tensors were not followed."""
    import torch
    model = torch.nn.Linear(16, 16)
    with neuron_prof.profile(tmp_path / "run", mode="always-on", collectors=["eager", "memory"],
                             hang_timeout_s=None) as prof:
        for _ in range(6):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    run = neuron_prof.load(tmp_path / "run")
    assert run.memory_steps.empty and run.memory_events.empty and len(run.process_memory) == 6
    at = _page(monkeypatch, tmp_path / "run")
    _ok(at)
    assert not any(i.value.startswith("This run has no memory data.") for i in at.info)
    assert at.selectbox(key="mem_device").options == ["cpu"]
    assert _metric(at, "tracked tensors: growth per step") == "not followed"
    rss = _values(_chart(at, "mem_process_chart")["data"][0]["y"])
    assert rss.tolist() == run.process_memory.sort_values("step")["rss"].tolist()
    assert _caption(at, "Bytes the allocator was asked for in the sampled steps")


def test_an_always_on_dump_says_its_cpu_figures_are_the_sampled_steps(tmp_path, monkeypatch):
    """A dump's CPU allocations are those of its sampled steps, counted from zero in each: the page
    says so rather than "since capture began"; a detail run's page says "since capture began"."""
    import torch
    model = torch.nn.Linear(16, 16)
    for mode in ("always-on", "detail"):
        with neuron_prof.profile(tmp_path / mode, mode=mode, collectors=["eager", "memory"],
                                 **({"detail_every": 2, "hang_timeout_s": None} if mode == "always-on" else {})) as prof:
            kept = []
            for _ in range(6):
                kept.append(model(torch.randn(4, 16)).sum())  # live past its step: unfollowed at the window's end
                kept[-1].backward()
                prof.step()
            if mode == "always-on":
                prof.dump()
        at = _page(monkeypatch, tmp_path / mode)
        _ok(at)
        captions = [c.value for c in at.caption]
        sampled = any(c.startswith("Bytes the allocator was asked for in the sampled steps") for c in captions)
        since = "Bytes the allocator was asked for since capture began, per device." in captions
        assert (sampled, since) == ((True, False) if mode == "always-on" else (False, True)), (mode, captions)
    ev = neuron_prof.load(tmp_path / "always-on").memory_events
    assert (ev["kind"].astype(str) == "unfollowed").any()
