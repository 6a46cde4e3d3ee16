"""Memory tracks in the exported trace: live-bytes counters, step peaks, large allocations as slices.

Real captures of examples/memory_leak.py (the ``memory_runs`` fixture) and of small loops made
here, exported with the CLI and read back with the shared Perfetto checker (or as Chrome JSON).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

import neuron_prof
from neuron_prof.analysis.memory import NEVER
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak
from neuron_prof.export.layout import LARGE_ALLOCATION_BYTES
from conftest import check_trace, cli, line_of

SPIKE_BYTES = 4 * memory_leak.SPIKE * memory_leak.BATCH * memory_leak.IN   # 2,097,152
EXAMPLE = Path(memory_leak.__file__)
TOTAL = "Memory cpu (live bytes)"
LARGE = "Large allocations cpu #"


def _export(run_dir: Path, out: Path, *fmt: str) -> Path:
    res = cli("export", run_dir, *fmt, "-o", out)
    assert res.returncode == 0, res.stderr
    return out


def _tracks(report) -> dict[str, list]:
    """Track name -> its slices/instants (ts, dur, name) or counter values, from the checker."""
    names = {u: t["name"] for u, t in report.tracks.items()}
    out: dict[str, list] = defaultdict(list)
    for track, ts, dur, _, name in report.slices:
        out[names[track]].append((ts, dur, name))
    for track, _, value in report.counters:
        out[names[track]].append(value)
    return out


def _offset(run) -> int:
    return int(run.rank_data[0].meta.get("clock_offset_ns", 0))


@pytest.fixture(scope="module")
def spike(memory_runs, tmp_path_factory):
    """The spike run, loaded, and its Perfetto trace's tracks."""
    run_dir = memory_runs("spike")
    report = check_trace(_export(run_dir, tmp_path_factory.mktemp("spike") / "t.perfetto-trace"))
    return neuron_prof.load(run_dir), _tracks(report)


def test_total_counter_reaches_the_step_peak(spike):
    run, tracks = spike
    peaks = analyze(run).memory_peaks[analyze(run).memory_peaks["device"].astype(str) == "cpu"]
    assert max(tracks[TOTAL]) == peaks["bytes"].max()
    assert peaks["bytes"].max() >= SPIKE_BYTES
    # the spike is a temporary, and its category track holds it too
    assert max(tracks["Memory cpu: temporary"]) >= SPIKE_BYTES


def test_spike_temporary_is_a_large_allocation_slice(spike):
    run, tracks = spike
    allocs = analyze(run).memory_allocations
    (block,) = allocs[allocs["bytes"] == SPIKE_BYTES].itertuples()
    large = [s for name, evs in tracks.items() if name.startswith(LARGE) for s in evs]
    assert len(large) == (allocs["bytes"] >= LARGE_ALLOCATION_BYTES).sum()
    hit = [s for s in large if s[0] == block.alloc_ts + _offset(run)]
    assert len(hit) == 1
    ts, dur, name = hit[0]
    assert block.free_ts != NEVER and dur == block.free_ts - block.alloc_ts
    assert name == "2.0 MiB aten::contiguous"


def test_memory_events_has_one_peak_per_captured_step(spike):
    run, tracks = spike
    steps = analyze(run).memory_peaks["step"].tolist()
    # every training step has its peak; the partial step at exit made no block, so it has none
    assert steps == run.steps[run.steps["active"] & run.steps["complete"]]["step"].tolist()
    peaks = {int(name.split(":")[0].split()[-1]): name for _, _, name in tracks["Memory events"]
             if name.startswith("peak step ")}
    assert sorted(peaks) == steps and len(tracks["Memory events"]) == len(steps)
    spike_line = f"memory_leak.py:{line_of(EXAMPLE, '# SPIKE-LINE')}"
    assert spike_line in peaks[4] and "aten::contiguous" in peaks[4]
    assert not any(spike_line in name for s, name in peaks.items() if s != 4)


def test_clean_run_has_memory_counters(memory_runs, tmp_path):
    run_dir = memory_runs("clean")
    tracks = _tracks(check_trace(_export(run_dir, tmp_path / "t.perfetto-trace")))
    run = neuron_prof.load(run_dir)
    assert max(tracks[TOTAL]) == analyze(run).memory_peaks["bytes"].max()
    assert {"Memory cpu: parameter", "Memory cpu: gradient", "Memory cpu: optimizer state"} <= set(tracks)
    assert (analyze(run).memory_allocations["bytes"] < LARGE_ALLOCATION_BYTES).all()
    assert not any(name.startswith(LARGE) for name in tracks)


def test_run_without_memory_collector_has_no_memory_tracks(tmp_path):
    with neuron_prof.profile(tmp_path / "r", collectors=["eager"]) as prof:
        memory_leak.train(3, "spike", prof)
    report = check_trace(_export(tmp_path / "r", tmp_path / "t.perfetto-trace"))
    names = {t["name"] for t in report.tracks.values()}
    assert "Steps" in names and not report.counters
    assert not [n for n in names if n.startswith(("Memory", "Large allocations"))]


def test_chrome_export_has_memory_counters_and_args(memory_runs, tmp_path):
    run_dir = memory_runs("spike")
    events = json.loads(_export(run_dir, tmp_path / "t.json", "--format", "chrome").read_text())["traceEvents"]
    run = neuron_prof.load(run_dir)
    total = [e["args"]["value"] for e in events if e.get("ph") == "C" and e["name"] == TOTAL]
    assert max(total) == analyze(run).memory_peaks["bytes"].max()
    spike_line = f"memory_leak.py:{line_of(EXAMPLE, '# SPIKE-LINE')}"
    (big,) = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("bytes") == SPIKE_BYTES]
    assert big["args"]["source"].endswith(spike_line) and big["args"]["category"] == "temporary"
    (peak,) = [e for e in events if e.get("ph") == "i" and e["name"].startswith("peak step 4:")]
    assert peak["args"]["source"].endswith(spike_line) and peak["args"]["alloc_bytes"] == SPIKE_BYTES


def _overlapping_blocks(steps: int, prof) -> list[torch.Tensor]:
    """Two 2 MiB inputs alive together each step, and their sum kept past the capture."""
    n = (2 << 20) // 4
    kept = []
    for _ in range(steps):
        a, b = torch.ones(n), torch.ones(n)
        kept.append(a + b)
        del a, b
        prof.step()
    return kept


def test_overlapping_and_live_blocks_get_separate_tracks(tmp_path):
    with neuron_prof.profile(tmp_path / "r", collectors=["eager", "memory"]) as prof:
        kept = _overlapping_blocks(3, prof)
    del kept  # alive until the capture ended: never freed during it
    tracks = _tracks(check_trace(_export(tmp_path / "r", tmp_path / "t.perfetto-trace")))
    run = neuron_prof.load(tmp_path / "r")
    a = analyze(run).memory_allocations
    a = a[a["bytes"] >= LARGE_ALLOCATION_BYTES]
    assert (a["free_ts"] == NEVER).sum() == 3
    # a block never freed ends with the run's last event
    all_a = analyze(run).memory_allocations
    last = max(int((run.steps["ts"] + run.steps["dur"]).max()), int((run.ops["ts"] + run.ops["dur"]).max()),
               int(all_a["alloc_ts"].max()), int(all_a["free_ts"][all_a["free_ts"] != NEVER].max()))
    end = np.where(a["free_ts"] == NEVER, last, a["free_ts"])
    want = sorted(zip((a["alloc_ts"] + _offset(run)).tolist(), (end - a["alloc_ts"]).tolist()))
    lanes = {name: sorted(evs) for name, evs in tracks.items() if name.startswith(LARGE)}
    assert sorted((ts, dur) for evs in lanes.values() for ts, dur, _ in evs) == want
    for evs in lanes.values():  # one track never holds two blocks at once
        assert all(t1 + d1 <= t2 for (t1, d1, _), (t2, _, _) in zip(evs, evs[1:]))
    alive = max(int(((a["alloc_ts"] <= s) & (s < end)).sum()) for s in a["alloc_ts"])
    assert len(lanes) == alive == 5
