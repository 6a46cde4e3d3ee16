"""A side-stream prefetch whose event the compute stream waits for too early
(examples/stream_prefetch.py), against the same job waiting where the batch is used, on the
emulated `neuron` device (tests/neuron_prefetch_script.py, in a process of its own): the report
names the wait's line with the idle time it causes, the fixed job overlaps the streams instead.

Every kernel costs 2 ms of (sleep) launch on the device, so a prefetch is ~22 ms on the side
stream; the host queues it in well under a millisecond even on a loaded machine. The assertions
are causal order between recorded timestamps, and shares of at least half a prefetch: ten times
and more the host's queueing time."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import neuron_prof
from conftest import line_of, plotly_array, script_facts, viewer_page
from neuron_prof.examples import stream_prefetch
from neuron_prof.reports.summary.build import summarize

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]  # the training runs in a process of its own

SCRIPT = Path(__file__).with_name("neuron_prefetch_script.py")
EXAMPLE = Path(stream_prefetch.__file__)


@pytest.fixture(scope="module")
def prefetch_runs(tmp_path_factory) -> tuple[dict, neuron_prof.Run, neuron_prof.Run]:
    root = tmp_path_factory.mktemp("prefetch")
    facts = script_facts(SCRIPT, root / "early", root / "fixed")
    return facts, neuron_prof.load(root / "early"), neuron_prof.load(root / "fixed")


def _line(marker: str) -> str:
    return f"stream_prefetch.py:{line_of(EXAMPLE, marker)}"


def test_prefetching_on_a_side_stream_changes_no_result(prefetch_runs):
    facts, _, _ = prefetch_runs
    assert facts["early"] == facts["fixed"] == facts["cpu"]


@pytest.mark.timing  # the wait covers half a ~22 ms prefetch: ~11 ms against < 1 ms of host queueing
def test_a_wait_too_early_is_reported_at_its_line_with_the_idle_it_causes(prefetch_runs):
    _, run, _ = prefetch_runs
    kernels, waits, done = run.device_kernels, run.stream_waits, run.event_completions
    side = int(kernels.loc[kernels["stream"] != 0, "stream"].iloc[0])
    steps = run.steps[run.steps["complete"]].sort_values("step")
    early_steps = steps["step"].to_numpy()[1:-1]  # steps 1-4: each queues the next batch's prefetch
    for step in early_steps:
        mine = waits[(waits["step"] == step) & (waits["stream"] == 0)]
        assert len(mine) == 1, mine  # the compute stream waited once in the step: for the next batch
        w = mine.iloc[0]
        # the prefetch it waited for: the side stream's kernels up to the event's completion
        (completed,) = done.loc[done["event"] == w["event"], "ts"]
        prefetch = kernels[(kernels["stream"] == side) & (kernels["step"] == step)
                           & (kernels["ts"] + kernels["dur"] <= completed)]
        assert len(prefetch) >= stream_prefetch.PREP_KERNELS  # its matmuls never fuse with each other
        p0, p1 = int(prefetch["ts"].min()), int((prefetch["ts"] + prefetch["dur"]).max())
        # causal: the wait ended when the event completed, after the prefetch's last kernel
        assert w["ts"] + w["dur"] >= completed >= p1
        # it covers at least half the prefetch (~11 ms against the host's < 1 ms to queue it)
        assert min(w["ts"] + w["dur"], p1) - max(w["ts"], p0) >= (p1 - p0) / 2
        # and nothing ran on the compute stream meanwhile: it stood idle
        busy = kernels[(kernels["stream"] == 0) & (kernels["ts"] < w["ts"] + w["dur"])
                       & (kernels["ts"] + kernels["dur"] > w["ts"])]
        assert busy.empty
    device = summarize(run).device
    (site,) = [s for s in device.stream_waits if s.in_steps]
    assert site.user_source.endswith(_line("WAIT-TOO-EARLY")) and site.stream == 0 and site.waited_for == side
    basis = len(steps) - 1  # the steady steps: all complete steps but the first
    in_basis = waits[waits["step"].isin(steps["step"].to_numpy()[1:]) & (waits["stream"] == 0)]
    assert site.in_steps == len(early_steps) and np.isclose(site.per_step_ms, in_basis["dur"].sum() / 1e6 / basis)
    (compute,) = [s for s in device.streams if s.stream == 0]
    assert np.isclose(compute.waiting_ms, site.per_step_ms)  # the stream table's idle is those waits
    # the streams never ran at once: the compute stream waited for every prefetch, and .item()
    # drained both streams before the next one was queued (order, not timing)
    (overlap,) = device.stream_overlap
    assert overlap.overlap_ms < 0.05 * overlap.busy_ms


@pytest.mark.timing  # the streams overlap ~20 ms a step; the bound is ~6 ms, host queueing 1-3 ms
def test_waiting_where_the_batch_is_used_hides_the_prefetch(prefetch_runs):
    _, early, fixed = prefetch_runs
    device = summarize(fixed).device
    # the batch was ready when the compute stream reached its wait: no idle in any steady step
    assert not [s for s in device.stream_waits if s.in_steps]
    assert all(s.waiting_ms == 0 for s in device.streams)
    # the side stream's prefetch ran while the compute stream computed: ~20 ms of a ~24 ms busy step
    # (69% measured); a quarter of it is left even if queueing the step's compute lags ~10 ms
    (overlap,) = device.stream_overlap
    assert overlap.overlap_ms > 0.25 * overlap.busy_ms
    waited = summarize(early).device.streams
    assert [s.waiting_ms > 0 for s in waited if s.stream == 0] == [True]


def test_the_report_shows_the_streams_and_the_wait(prefetch_runs, tmp_path):
    _, run, _ = prefetch_runs
    p = subprocess.run([sys.executable, "-m", "neuron_prof", "report", str(run.path)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Stream waits" in p.stdout and _line("WAIT-TOO-EARLY") in p.stdout
    doc = json.loads(subprocess.run([sys.executable, "-m", "neuron_prof", "report", "--json", str(run.path)],
                                    capture_output=True, text=True, timeout=300).stdout)
    assert any(s["user_source"].endswith(_line("WAIT-TOO-EARLY")) for s in doc["device"]["stream_waits"])
    # per step (every complete step): the compute stream's idle is that step's waits, to the ns
    per_step = [r for r in doc["device"]["stream_steps"] if r["stream"] == 0]
    waits = run.stream_waits[run.stream_waits["stream"] == 0].groupby("step")["dur"].sum()
    assert len(per_step) == int(run.steps["complete"].sum())
    assert all(abs(r["waiting_ms"] - waits.get(r["step"], 0) / 1e6) < 1e-9 for r in per_step)


def test_the_device_page_shows_the_streams_and_the_wait(prefetch_runs, monkeypatch):
    _, run, _ = prefetch_runs
    at = viewer_page(monkeypatch, run.path, "device", title="Device")
    assert "Streams" in [h.value for h in at.subheader]
    waits = next(d.value for d in at.dataframe if "wait queued at" in d.value.columns)
    want = [s for s in summarize(run).device.stream_waits if s.in_steps]
    mine = waits[waits["wait queued at"].astype(str).str.endswith(_line("WAIT-TOO-EARLY"))]
    assert len(want) == 1 and mine["idle ms/step"].tolist() == [want[0].per_step_ms]
    (chart,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "streams per step" in json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "")]
    idle = next(t for t in chart["data"] if t["name"] == "stream 0 idle, waiting on another")
    assert max(plotly_array(idle["y"])) > 0
    streams = next(d.value for d in at.dataframe if "idle waiting on another stream ms/step" in d.value.columns)
    assert sorted(streams["stream"]) == sorted(s.stream for s in summarize(run).device.streams)
