"""A collector hook that raises in a real capture: training finishes with the same result, and the
loss is in the run (``failures``, per-table dropped counts) and in the report's Capture health.

Faults are injected the way a bug of ours would show: an internal function a hook calls raises
(patched in this process), or a device backend writes a trace the capture cannot read.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch._dynamo

import neuron_prof
from neuron_prof.analysis.run_analysis import analyze
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

import torch

import neuron_prof
from neuron_prof.testing import neuron

STEPS = 6  # every other one captured in a window of its own (a Kineto session each)
FAULTY = 3  # the backend writes a trace that does not parse in this step


def train(device, prof=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)
    losses = []
    for step in range(STEPS):
        torch.neuron.set_trace_fault(prof is not None and step == FAULTY)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    torch.neuron.set_trace_fault(False)
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


neuron.enable(launch_us=1.0)
ref_losses, ref_state = train("neuron")
with neuron_prof.profile(sys.argv[1], schedule=neuron_prof.schedule(wait=1, warmup=0, active=1, repeat=3)) as prof:
    losses, state = train("neuron", prof)
print(json.dumps({"same_losses": losses == ref_losses,
                  "same_parameters": all(torch.equal(state[k], ref_state[k]) for k in state), "faulty": FAULTY}))
"""


@pytest.mark.multiprocess  # enabling the emulated device renames PrivateUse1 for the whole process
def test_a_device_trace_the_capture_cannot_read_is_a_gap_and_training_goes_on(tmp_path):
    """The device's backend writes a trace that does not parse (an op name with a raw quote in its
    activity metadata, which Kineto writes into the JSON as it is): that window's device activity is
    lost, named as a gap of its steps with the error, and the other windows' are all there."""
    script = write_script(tmp_path / "train.py", DEVICE_TRAIN)
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-4000:]
    facts = json.loads(p.stdout.strip().splitlines()[-1])
    assert facts["same_losses"] and facts["same_parameters"]

    run = neuron_prof.load(run_dir)
    captured = set(run.steps.loc[run.steps["active"], "step"])
    assert captured == {1, 3, 5}
    # the readable windows' kernels are all there, the faulty one's none
    assert set(run.device_kernels["step"]) == captured - {facts["faulty"]}
    (gap,) = run.device_gaps.itertuples()
    assert gap.step == facts["faulty"] and str(gap.reason).startswith("the device's trace could not be read: "
                                                                       "JSONDecodeError")
    step = run.steps.set_index("step").loc[facts["faulty"]]
    assert gap.ts <= step.ts + step.dur  # the session began with the window, before its step's end
    ((collector, message),) = zip(run.failures["collector"], run.failures["message"])
    assert collector == "device (device_kernels)" and message.startswith("JSONDecodeError")
    assert p.stderr.count("collector 'device (device_kernels)' failed") == 1  # logged once
    (h,) = run.health.to_dict("records")
    assert h["closed"]
    # the faulty step's device side is unknown, not idle: no verdict for it (a false "host-bound")
    assert set(analyze(run).device_steps["step"]) == captured - {facts["faulty"]}

    rep = cli("report", run_dir)
    assert rep.returncode == 0, rep.stderr
    health = rep.stdout.split("\nCapture health\n", 1)[1]
    assert f"rank 0: collector device (device_kernels) failed: {message}" in health
    assert f"rank 0: no device trace in step {facts['faulty']} (device figures leave them out): the device's trace could not be read" in health
