"""A collector that fails never breaks training: logged once, recorded in the run, reported."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import neuron_prof
from conftest import cli, write_script

TRAIN = """
import sys
import torch
import neuron_prof

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        prof.step()
print("trained")
"""


def test_op_collector_that_cannot_build_is_recorded_and_training_goes_on(tmp_path):
    script = write_script(tmp_path / "train.py", TRAIN)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the extension build directory should be")
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True,
                         env={**os.environ, "TORCH_EXTENSIONS_DIR": str(blocker / "ext")})
    assert res.returncode == 0 and "trained" in res.stdout, res.stderr
    assert res.stderr.count("collector 'eager' failed") == 1  # logged once

    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 3 and len(run.ops) == 0
    assert list(run.failures["collector"]) == ["eager", "memory"]  # the memory tracker lives in the same extension
    rep = cli("report", run_dir)
    assert rep.returncode == 0 and "collector eager failed" in rep.stdout
    health = json.loads(cli("report", run_dir, "--json").stdout)["health"]
    assert health["failures"][0]["collector"] == "eager"


def _train(run_dir, steps: int, **caps) -> None:
    model = torch.nn.Linear(8, 8)
    with neuron_prof.profile(run_dir, **caps) as prof:
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()


def test_buffer_cap_drops_and_counts(tmp_path):
    _train(tmp_path / "run", 3, max_buffered_events=10)
    run = neuron_prof.load(tmp_path / "run")
    per_step = run.ops.groupby("step").size()
    assert (per_step <= 10).all() and len(per_step) == 3
    (h,) = run.health.to_dict("records")
    assert h["events_dropped"] > 0 and h["events_written"] == len(run.ops) + len(run.marks)


def test_event_cap_ends_detailed_capture_but_keeps_step_times(tmp_path):
    _train(tmp_path / "run", 3, max_events=10_000)  # learn how many ops a step has
    per_step = len(neuron_prof.load(tmp_path / "run").ops) // 3
    _train(tmp_path / "capped", 8, max_events=2 * per_step)
    run = neuron_prof.load(tmp_path / "capped")
    assert sorted(run.ops["step"].unique()) == [0, 1]
    assert int(run.steps["complete"].sum()) == 8
    assert run.health.loc[0, "cap_reached_at_step"] == 1
    assert "event cap reached at step 1" in cli("report", tmp_path / "capped").stdout
