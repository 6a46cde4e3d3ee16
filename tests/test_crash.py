"""kill -9 in the middle of an active window leaves a run that report and export read."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

import neuron_prof
from conftest import check_trace, cli, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

LOOP = """
import sys
import torch
import neuron_prof

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with neuron_prof.profile(sys.argv[1]) as prof:
    step = 0
    while True:
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
        step += 1
        print("done", step, flush=True)
"""


def test_kill_9_mid_window_keeps_completed_steps(tmp_path):
    script = write_script(tmp_path / "loop.py", LOOP)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE, text=True)
    seen = 0
    for line in proc.stdout:
        seen = int(line.split()[1])
        if seen >= 5:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    run = neuron_prof.load(run_dir)
    done = run.steps[run.steps["complete"]]
    assert len(done) >= 5  # at most the step in flight is lost
    assert list(done["step"]) == list(range(len(done)))
    assert not run.health["closed"].any()
    assert set(run.ops["step"]) <= set(done["step"]) and len(run.ops) > 0

    rep = cli("report", run_dir, "--json")
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["health"]["ranks"][0]["closed"] is False
    assert "did NOT close" in cli("report", run_dir).stdout
    out = tmp_path / "t.perfetto-trace"
    assert cli("export", run_dir, "-o", out).returncode == 0
    check_trace(out)
