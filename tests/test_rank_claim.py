"""A rank folder that a live process is writing is never replaced, whoever asks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import neuron_prof
from conftest import cli, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

OTHER_RUN = """
import sys
import torch
import neuron_prof

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        prof.step()
print("other run done")
"""


def test_a_live_rank_folder_is_not_replaced_by_another_capture_into_the_same_directory(tmp_path):
    other = write_script(tmp_path / "other.py", OTHER_RUN)
    run_dir = tmp_path / "run"
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with neuron_prof.profile(run_dir) as prof:
        for step in range(4):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            prof.step()
            if step == 1:  # our rank 0 is on disk and being written: another run wants it
                res = subprocess.run([sys.executable, str(other), str(run_dir)], capture_output=True, text=True,
                                     cwd=tmp_path)
                assert res.returncode == 0 and "other run done" in res.stdout, res.stderr
                assert "is claimed by another process" in res.stderr
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 4 and run.health["closed"].all()
    assert run.rank_data[0].meta["pid"] == os.getpid()
    (c,) = run.conflicts.to_dict("records")
    assert c["live"] and c["holder_pid"] == os.getpid() and c["argv"][-1] == str(run_dir)
    rep = cli("report", run_dir)
    assert rep.returncode == 0 and f"also claimed by pid {c['pid']}" in rep.stdout

    # once the folder's writer is done, a new capture (another run) replaces it as before
    res = subprocess.run([sys.executable, str(other), str(run_dir)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 2 and run.rank_data[0].meta["pid"] != os.getpid()
    assert run.conflicts.empty  # the note was about the older run's folder
