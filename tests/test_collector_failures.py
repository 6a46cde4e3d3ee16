"""A collector hook that raises in a real capture: training finishes with the same result, and the
loss is in the run (``failures``, per-table dropped counts) and in the report's Capture health.

Faults are injected the way a bug of ours would show: an internal function a hook calls raises
(patched in this process), or a backend hands a report a value it cannot take.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch._dynamo

import neuron_prof
from conftest import cli, write_script
from neuron_prof.collectors import compiler as compiler_mod


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()  # two frames: a graph break and its resume function
        return self.fc2(y)


def _train_compiled(prof=None) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    losses = []
    for _ in range(3):
        loss = compiled(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    torch._dynamo.reset()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _dropped(run: neuron_prof.Run) -> dict[str, int]:
    """Rank 0's dropped events per table, as its last commit counted them."""
    return dict(run.rank_data[0].last_commit["dropped"])


def test_compiler_hook_and_parse_faults_are_counted_and_training_goes_on(tmp_path, monkeypatch):
    ref_losses, ref_state = _train_compiled()

    def caller_stack(self):  # runs in Dynamo's timed-event hook, on the training thread
        raise RuntimeError("injected fault: caller stack")

    def parse_graph_break(text):  # runs in the collector's flush, once per logged break
        raise ValueError("injected fault: graph-break text")

    monkeypatch.setattr(compiler_mod.CompilerCollector, "_caller_stack", caller_stack)
    monkeypatch.setattr(compiler_mod, "parse_graph_break", parse_graph_break)
    run_dir = tmp_path / "run"
    with neuron_prof.profile(run_dir) as prof:
        losses, state = _train_compiled(prof)
    monkeypatch.undo()

    assert losses == ref_losses
    assert state.keys() == ref_state.keys() and all(torch.equal(state[k], ref_state[k]) for k in state)

    run = neuron_prof.load(run_dir)
    # the collector went on: every compile is there, with the facts the faults did not touch
    assert len(run.compiles) >= 2 and set(run.compiles["status"]) == {"ok"}
    assert len(run.compile_phases) > 0
    assert len(run.graph_breaks) == 0  # every break's record was lost to the parse fault ...
    dropped = _dropped(run)
    # ... and counted, as was each frame compile's begin event (one per compile row)
    assert dropped["graph_breaks"] >= 1
    assert dropped["compile_phases"] == len(run.compiles)
    (h,) = run.health.to_dict("records")
    assert h["closed"] and h["events_dropped"] == sum(dropped.values())
    # the first loss of each table kept its message; the collector's own name was not failed
    failures = sorted(zip(run.failures["collector"], run.failures["message"]))
    assert failures == [("compiler (compile_phases)", "RuntimeError: injected fault: caller stack"),
                        ("compiler (graph_breaks)", "ValueError: injected fault: graph-break text")]

    rep = cli("report", run_dir)
    assert rep.returncode == 0, rep.stderr
    health = rep.stdout.split("\nCapture health\n", 1)[1]
    assert f"{h['events_dropped']} dropped" in health
    assert "rank 0: collector compiler (compile_phases) failed: RuntimeError: injected fault: caller stack" in health
    assert "rank 0: collector compiler (graph_breaks) failed: ValueError: injected fault: graph-break text" in health


DEVICE_TRAIN = """
import json
import sys
import time

import torch

import neuron_prof
from neuron_prof.collectors.device import report_kernel
from neuron_prof.testing import neuron

STEPS = 3


def train(device, prof=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            # a Python backend's report with a device it cannot parse: one kernel lost per step
            t = time.monotonic_ns()
            report_kernel("neuron:first", 0, "fused_step", t, t + 1000)
            prof.step()
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


neuron.enable(launch_us=1.0)
ref_losses, ref_state = train("neuron")
with neuron_prof.profile(sys.argv[1]) as prof:
    losses, state = train("neuron", prof)
print(json.dumps({"same_losses": losses == ref_losses,
                  "same_parameters": all(torch.equal(state[k], ref_state[k]) for k in state), "steps": STEPS}))
"""


@pytest.mark.multiprocess  # enabling the emulated device renames PrivateUse1 for the whole process
def test_device_report_a_capture_cannot_take_is_counted_and_training_goes_on(tmp_path):
    script = write_script(tmp_path / "train.py", DEVICE_TRAIN)
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-4000:]
    facts = json.loads(p.stdout.strip().splitlines()[-1])
    assert facts["same_losses"] and facts["same_parameters"]

    run = neuron_prof.load(run_dir)
    # the device's own reports (the C API) are all there; only the bad ones are lost
    assert len(run.device_kernels) > 0 and len(run.device_enqueues) > 0
    assert "fused_step" not in set(run.device_kernels["name"].astype(str))
    dropped = _dropped(run)
    assert dropped.get("device_kernels") == facts["steps"]
    (h,) = run.health.to_dict("records")
    assert h["closed"] and h["events_dropped"] == sum(dropped.values())
    message = "ValueError: invalid literal for int() with base 10: 'first'"
    assert list(zip(run.failures["collector"], run.failures["message"])) == [("device (device_kernels)", message)]
    assert "collector 'device (device_kernels)' failed" in p.stderr  # logged once
    assert p.stderr.count("collector 'device (device_kernels)' failed") == 1

    rep = cli("report", run_dir)
    assert rep.returncode == 0, rep.stderr
    health = rep.stdout.split("\nCapture health\n", 1)[1]
    assert f"{h['events_dropped']} dropped" in health
    assert f"rank 0: collector device (device_kernels) failed: {message}" in health
