"""``neuron-prof demo --device neuron``: the demo's training on the emulated neuron device, in a
process of its own (enabling the device renames PrivateUse1 for the whole process), captured,
reported and exported as on the CPU, with the device's kernels in the run."""
from __future__ import annotations

import re

import pytest

import neuron_prof
from conftest import cli

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture


def test_demo_trains_on_the_emulated_neuron_device(tmp_path):
    out = tmp_path / "demo"
    res = cli("demo", "--device", "neuron", "--no-view", "-o", out, "--steps", "8")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "on the emulated neuron device" in res.stderr
    run = neuron_prof.load(out)
    # the schedule (wait 2, warmup 1, active 5) over 8 steps; the kernels ran on the device
    steps = run.steps[run.steps["complete"]]
    assert len(steps) == 8 and steps["active"].sum() == 5
    kernels = run.device_kernels
    assert len(kernels) and (kernels["device"].astype(str) == "neuron:0").all()
    assert kernels["step"].isin(steps.loc[steps["active"], "step"]).any()
    assert run.ops["devices"].astype(str).str.contains("neuron:0").any()
    # the report: 8 steps, 1 warm-up, 7 steady, 5 captured; the loss's .item() a sync point on the device
    text = res.stdout
    assert "on neuron" in text and "--device neuron" in text
    assert re.search(r"^Steps ", text, re.M) and re.search(r"^\s*0\s+8\s+1\s+7\s+5\s", text, re.M), text
    assert re.search(r"train_transformer\.py:\d+\s+aten::_local_scalar_dense", text), text
    # the Device section: what bounded the captured steps, the kernels, the embedding's fallback
    device = text[text.index("\nDevice (rank 0 neuron:0: "):text.index("\nCompile")]
    assert re.search(r"rank 0: \d+ (host-bound|device-bound|balanced) steps? \(", device), device
    assert "Top kernels by device time" in device and "Fusion on rank 0 neuron:0" in device
    assert re.search(r"aten::embedding_dense_backward\s+neuron:0\s+examples/train_transformer\.py:\d+\s+5\s", device), device
    assert (out / "trace.perfetto-trace").exists()
    # the loop keeps only loss.item(): the losses the capture holds until it reads them are its own
    assert "memory grows" not in text and "LEAK" not in text, text
    assert "  no leak: live memory does not grow step over step" in text
    live = run.memory_steps[run.memory_steps["device"].astype(str) == "neuron:0"]["live"]
    assert len(live) == 8 and live.nunique() == 1


def test_cpu_demo_reports_no_leak(tmp_path):
    """``neuron-prof demo`` on the CPU: the same loop, no leak found or reported."""
    out = tmp_path / "demo"
    res = cli("demo", "--no-view", "-o", out, "--steps", "8")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "memory grows" not in res.stdout and "LEAK" not in res.stdout, res.stdout
    assert "  no leak: live memory does not grow step over step" in res.stdout


def test_demo_trains_data_parallel_on_the_device(tmp_path):
    """``demo --device neuron --ranks 2``: two DDP ranks on the device, captured into one run whose
    report shows the all-reduces as device kernels, with the demo's own command line; a bad rank
    count is a one-line error."""
    out = tmp_path / "ddp"
    res = cli("demo", "--device", "neuron", "--ranks", "2", "--no-view", "-o", out, "--steps", "8")
    assert res.returncode == 0, res.stderr[-4000:]
    run = neuron_prof.load(out)
    assert run.ranks == [0, 1]
    kernels = run.device_kernels
    for rank in (0, 1):  # DDP's gradient buckets all-reduced on each rank's device, in every active step
        mine = kernels[(kernels["rank"] == rank) & (kernels["name"].astype(str) == "c10d::allreduce_")]
        active = run.steps[(run.steps["rank"] == rank) & run.steps["active"] & run.steps["complete"]]["step"]
        assert set(active) <= set(mine["step"]), (set(active), set(mine["step"]))
    assert "Collectives on the device" in res.stdout and "train_ddp.py" in res.stdout
    assert (out / "trace.perfetto-trace").exists()
    bad = cli("demo", "--ranks", "0", "--no-view", "-o", tmp_path / "bad")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--ranks" in bad.stderr, bad.stderr
