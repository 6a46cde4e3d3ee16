"""Device memory on a backend whose allocator does not report to the profiler (issue 43): the
emulated `neuron` device with ``allocator_reports=False`` keeps its counters (``torch.neuron.
memory_stats``) but reports no allocation, as PrivateUse1 backends may ship. A training that keeps
two 16 KiB device blocks a step is captured; the run reads the device's counters at each step
boundary, finds the leak with its bytes per step, and says where its figures come from. The same
training on the default device (its allocator reports) keeps the allocator events and their lines.
Each mode runs in a process of its own (``tests/device_memory_counters_script.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import check_trace, cli, line_of, script_facts, viewer_page

from neuron_prof.analysis import memory as mem
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.findings import LINES_NOTE, findings
from neuron_prof.reports.markdown import md
from neuron_prof.store.run import load
from neuron_prof.reports.summary.build import summarize
from neuron_prof.export.inspect import read_trace
from neuron_prof.units import format_bytes

SCRIPT = Path(__file__).with_name("device_memory_counters_script.py")
DEVICE = "neuron:0"
COUNTERS = "the backend's counters: totals only, no lines (torch.neuron.memory_stats)"

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """mode -> (its run, the script's facts: the device's counters read before each boundary)."""
    d = tmp_path_factory.mktemp("device_memory")
    return {mode: (d / mode, script_facts(SCRIPT, mode, d / mode)) for mode in ("counters", "events")}


def _device_steps(run):
    ms = run.memory_steps
    return ms[ms["device"].astype(str) == DEVICE].sort_values("step")


def test_counters_are_the_devices_figures_when_its_allocator_reports_nothing(runs):
    """No allocator event of the device reached the capture, yet each boundary has its row: the
    device's own allocated bytes and high-water mark, exactly as the script read them, under its
    name; the run says they are the backend's counters, read with torch.neuron.memory_stats."""
    path, facts = runs["counters"]
    run = load(path)
    assert not (run.memory_events["device"].astype(str) == DEVICE).any()  # the allocator reported nothing
    mine = _device_steps(run)
    assert mine["live"].tolist() == facts["allocated"] and mine["allocated"].tolist() == facts["allocated"]
    assert mine["peak"].tolist() == facts["peak"]
    (source,) = run.memory_sources.itertuples()
    assert (source.device, source.figures_from, source.api) == (DEVICE, "backend counters",
                                                                 "torch.neuron.memory_stats")
    figures = mem.figures_from(run.memory_steps, run.memory_sources).set_index("device")["figures_from"].to_dict()
    assert figures == {"cpu": "allocator events", DEVICE: "backend counters"}


def test_a_leak_on_counters_is_found_with_its_bytes_per_step(runs):
    """The leak is found on neuron:0 (never the CPU) from the counters alone: exactly 2 x 16,384
    bytes a step, at every boundary checked; it names no line, and says lines need the allocator
    to report to the profiler (analysis, report text and --json, findings)."""
    path, facts = runs["counters"]
    run = load(path)
    leak = facts["leak_bytes_per_step"]
    assert leak == 2 * 16_384
    assert (np.diff(_device_steps(run)["live"].to_numpy()) == leak).all()
    leaks = analyze(run).memory_leaks
    (row,) = leaks.itertuples()
    assert (row.device, row.growth_per_step, row.steps_growing, row.confidence) == (DEVICE, leak, 6, 1.0)
    assert row.source == row.op == ""  # totals only: no site
    summary = summarize(run)
    device = next(d for d in summary.memory.devices if d.device == DEVICE)
    assert (device.figures_from, device.counters_api) == ("backend counters", "torch.neuron.memory_stats")
    assert (device.live_first, device.live_last) == (facts["allocated"][0], facts["allocated"][-1])
    assert device.peak_between_boundaries == max(facts["peak"])
    (finding,) = [f.text for f in findings(summary) if f.text.startswith("memory grows")]
    assert finding.startswith(f"memory grows {format_bytes(leak)} per step on rank 0 {DEVICE},")
    assert LINES_NOTE in finding

    res = cli("report", path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert f"  rank 0 {DEVICE} ({COUNTERS}): allocated {format_bytes(facts['allocated'][0])} -> " \
           f"{format_bytes(facts['allocated'][-1])} over 8 step boundaries ({format_bytes(leak)}/step), " \
           f"high-water mark {format_bytes(max(facts['peak']))}" in lines
    at = lines.index(f"  !! LEAK on rank 0 {DEVICE}: +{format_bytes(leak)} per step (grew in 6 of the step "
                     "boundaries checked), confidence 1.00")
    # its pace against the device's peak (the figures are the counters: no second count to confirm them)
    assert lines[at + 1] == f"     it adds the device's peak ({format_bytes(max(facts['peak']))}) again every 9 steps"
    assert lines[at + 2] == f"     {LINES_NOTE}"
    assert "  rank 0 cpu (allocator events): live" in res.stdout
    # nothing calls the device's figures the CPU's
    assert not [x for x in lines if " cpu" in x and ("backend" in x or "LEAK" in x or "grows" in x)]

    res = cli("report", path, "--json")
    assert res.returncode == 0, res.stderr
    memory = json.loads(res.stdout)["memory"]
    by_device = {d["device"]: d for d in memory["devices"]}
    assert by_device[DEVICE]["figures_from"] == "backend counters"
    assert by_device["cpu"]["figures_from"] == "allocator events" and by_device["cpu"]["counters_api"] == ""
    assert [(x["device"], x["growth_per_step"]) for x in memory["leaks"]] == [(DEVICE, leak)]


def test_the_trace_draws_the_counters_on_the_devices_track(runs, tmp_path):
    """The Perfetto export has the device's allocated bytes at each boundary on a track named for
    it (its strict reader finds nothing wrong)."""
    path, facts = runs["counters"]
    res = cli("export", path, "-o", tmp_path / "run.pftrace")
    assert res.returncode == 0, res.stderr
    check_trace(tmp_path / "run.pftrace")
    trace = read_trace(tmp_path / "run.pftrace")
    (track,) = [t for t, v in trace.tracks.items()
                if v["name"] == f"Memory {DEVICE} (allocated bytes, backend counters)"]
    assert [c.value for c in trace.counters if c.track == track] == facts["allocated"]


def test_the_memory_page_says_where_the_devices_figures_come_from(runs, monkeypatch):
    pytest.importorskip("streamlit")
    path, facts = runs["counters"]
    at = viewer_page(monkeypatch, path, "memory", "Memory")
    at.selectbox(key="mem_device").set_value(DEVICE).run()
    assert not at.exception, [e.value for e in at.exception]
    assert f"Figures from {md(COUNTERS)}." in [c.value for c in at.caption]
    assert LINES_NOTE[1:] + "." in " ".join(i.value for i in at.info)
    (error,) = [e.value for e in at.error]
    assert f"grows **{format_bytes(facts['leak_bytes_per_step'])} per step**" in error and md(DEVICE) in error
    at.selectbox(key="mem_device").set_value("cpu").run()
    assert "Figures from allocator events." in [c.value for c in at.caption]


def test_a_reporting_allocator_keeps_its_events_and_lines(runs):
    """The default device reports every allocation: the same leak is found from allocator events,
    on the script's line, with its blocks; the run and the report say so."""
    path, facts = runs["events"]
    run = load(path)
    (source,) = run.memory_sources.itertuples()
    assert (source.device, source.figures_from, source.api) == (DEVICE, "allocator events", "")
    assert (run.memory_events["device"].astype(str) == DEVICE).any()
    leak = facts["leak_bytes_per_step"]
    assert (np.diff(_device_steps(run)["live"].to_numpy()) == leak).all()
    leaks = analyze(run).memory_leaks
    (row,) = leaks.itertuples()
    assert row.device == DEVICE and row.growth_per_step == row.bytes_per_step == leak
    assert row.blocks_per_step == facts["blocks_per_step"]
    assert row.source.endswith(f"device_memory_counters_script.py:{line_of(SCRIPT, 'LEAK-LINE')}")
    res = cli("report", path)
    assert res.returncode == 0, res.stderr
    assert f"  rank 0 {DEVICE} (allocator events): live " in res.stdout
    assert LINES_NOTE not in res.stdout


@pytest.fixture(scope="module")
def loss_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The loss collector on (every default collector): a loop that keeps only ``loss.item()``
    (the allocator reporting, or on its counters) and one that keeps each loss."""
    d = tmp_path_factory.mktemp("device_loss")
    modes = ("loss-item-events", "loss-item-counters", "loss-kept-events")
    return {mode: (d / mode, script_facts(SCRIPT, mode, d / mode)) for mode in modes}


@pytest.mark.parametrize("mode", ["loss-item-events", "loss-item-counters"])
def test_the_losses_neuron_prof_holds_are_no_leak_of_the_users(loss_runs, mode):
    """The loss collector keeps each step's loss on the device until it reads a batch of them: the
    device's own count grows 4 B a step (the script read it before each boundary), yet the run's
    live and allocated bytes stay flat (those blocks are neuron_prof's, not the loop's), and no
    leak is found or reported."""
    path, facts = loss_runs[mode]
    assert set(np.diff(facts["allocated"])[1:]) == {facts["loss_bytes"]}  # the device holds one more loss a step
    run = load(path)
    mine = _device_steps(run)
    assert len(mine) == 8 and set(np.diff(mine["live"].to_numpy())[1:]) == {0}
    assert set(np.diff(mine["allocated"].to_numpy())[1:]) == {0}
    assert analyze(run).memory_leaks.empty
    assert len(run.metrics[run.metrics["name"].astype(str) == "loss"]) == 8  # the losses were read all the same
    res = cli("report", path)
    assert res.returncode == 0, res.stderr
    assert "memory grows" not in res.stdout and "LEAK" not in res.stdout
    assert "  no leak: live memory does not grow step over step" in res.stdout


def test_a_kept_loss_is_a_leak_at_its_line_confirmed_and_ranked_by_its_cost(loss_runs):
    """The loop keeps each loss: exactly 4 B a step at the loss's line, confirmed by the allocator's
    own count; 4 B a step would take millions of steps to add the device's peak again, so the
    finding is a note ("-"), never "!!"."""
    path, facts = loss_runs["loss-kept-events"]
    run = load(path)
    (row,) = analyze(run).memory_leaks.itertuples()
    assert (row.device, row.growth_per_step, row.bytes_per_step) == (DEVICE, 4, 4)
    assert row.source.endswith(f"device_memory_counters_script.py:{line_of(SCRIPT, 'LOSS-LINE')}")
    assert (row.confirmed_by, row.allocator_growth_per_step) == ("the allocator's own count", 4)
    summary = summarize(run)
    (finding,) = [f for f in findings(summary) if f.text.startswith("memory grows")]
    peak = next(d for d in summary.memory.devices if d.device == DEVICE)
    assert finding.severity == "info" and peak.peak.bytes / 4 > 1_000_000
    assert "the allocator's own count grows 4 B per step too" in finding.text
    assert "again every" in finding.text and "M steps" in finding.text
    res = cli("report", path)
    assert res.returncode == 0, res.stderr
    assert f"  -  LEAK on rank 0 {DEVICE}: +4 B per step" in res.stdout
