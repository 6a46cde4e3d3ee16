"""Two real gloo ranks on 127.0.0.1: a rank folder each, one merged trace with two processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import neuron_prof
from conftest import check_trace, cli, free_port, gloo_run, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

def test_two_gloo_ranks_write_two_folders_and_one_trace(tmp_path):
    run_dir = gloo_run(tmp_path, steps=3)
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["rank-00000", "rank-00001"]
    run = neuron_prof.load(run_dir)
    assert run.ranks == [0, 1] and run.meta["world_size"] == 2
    assert run.steps.groupby("rank")["complete"].sum().to_dict() == {0: 3, 1: 3}
    assert set(run.ops["rank"]) == {0, 1}
    assert any("allreduce" in n for n in run.ops["name"].astype(str).unique())

    out = tmp_path / "ddp.perfetto-trace"
    assert cli("export", run_dir, "-o", out).returncode == 0
    report = check_trace(out)
    procs_in_trace = sorted(t["name"] for t in report.tracks.values() if t["kind"] == "process")
    assert len(procs_in_trace) == 2 and procs_in_trace[0].startswith("rank 0") and procs_in_trace[1].startswith("rank 1")
    assert report.stats["sequences"] >= 2


PLAIN_DDP = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def test_record_under_torchrun_captures_each_rank_but_not_the_launcher(tmp_path):
    script = write_script(tmp_path / "plain_ddp.py", PLAIN_DDP)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["rank-00000", "rank-00001"]
    run = neuron_prof.load(run_dir)
    assert run.steps.groupby("rank")["complete"].sum().to_dict() == {0: 4, 1: 4}
    pids = {rd.meta["pid"] for rd in run.rank_data}
    assert len(pids) == 2 and all(rd.meta["world_size"] == 2 for rd in run.rank_data)


ONE_RANK = """
import sys
import torch
import neuron_prof

model = torch.nn.Linear(4, 4)
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        prof.step()
"""


def test_rank_folders_left_by_an_earlier_larger_run_are_ignored(tmp_path):
    script = write_script(tmp_path / "one.py", ONE_RANK)
    run_dir = tmp_path / "run"
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    subprocess.run([sys.executable, str(script), str(run_dir)], env=env, check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    subprocess.run([sys.executable, str(script), str(run_dir)], env=env, check=True, cwd=tmp_path)
    run = neuron_prof.load(run_dir)
    assert run.ranks == [0] and [d.name for d in run.stale_rank_dirs] == ["rank-00001"]
    rep = cli("report", run_dir)
    assert rep.returncode == 0 and "ignored" in rep.stdout and "rank-00001" in rep.stdout
