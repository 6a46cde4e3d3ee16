"""Under `neuron-prof record`, the processes of a command never destroy each other's capture.

Helper Python processes of a training script (a `python -c` that imports torch, as Inductor's
checks do; a helper that steps an optimizer of its own) leave the trainer's rank folder intact; a
command killed before its first step reads as such; rank folders of an older run in the same
directory are replaced, never read as this run's.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

import neuron_prof
from conftest import cli, free_port, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

STEPS = 6

TRAINER = """
import subprocess
import sys
import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 1:  # a helper that imports torch and never steps (Inductor's ISA check does this)
        subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2).sum())"], check=True)
    if step == 3:  # a helper that steps an optimizer of its own: it claims the trainer's rank 0
        subprocess.run([sys.executable, "-c", "import torch; m = torch.nn.Linear(2, 2); "
                        "o = torch.optim.SGD(m.parameters(), lr=0.1); m(torch.ones(1, 2)).sum().backward(); "
                        "o.step(); print('helper stepped')"], check=True)
print("trainer done")
""".replace("STEPS", str(STEPS))


def test_helper_processes_leave_the_trainers_rank_intact_and_a_second_claim_is_reported(tmp_path):
    script = write_script(tmp_path / "trainer.py", TRAINER)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "tensor(2.)" in res.stdout and "helper stepped" in res.stdout and "trainer done" in res.stdout

    # the trainer's folder is the only one, and it holds every step
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["rank-00000"]
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == STEPS
    assert run.health["closed"].all()
    (trainer,) = run.rank_data
    assert "exited with code 0" in res.stderr and "run written to" in res.stderr
    # exactly one conflict note: the helper that stepped; the one that never stepped left nothing
    notes = sorted(p.name for p in run_dir.iterdir() if p.is_file() and ".conflict-" in p.name)
    assert len(notes) == 1 and notes[0].startswith("rank-00000.conflict-")
    (conflict,) = run.conflicts.to_dict("records")
    assert conflict["rank"] == 0 and conflict["holder_pid"] == trainer.meta["pid"] and conflict["live"]
    assert conflict["pid"] != trainer.meta["pid"] and "o.step()" in " ".join(conflict["argv"])
    assert res.stderr.count("claimed by") == 1  # the helper's one line

    rep = cli("report", run_dir)
    assert rep.returncode == 0, rep.stderr
    assert f"rank 0: also claimed by pid {conflict['pid']}" in rep.stdout
    js = json.loads(cli("report", run_dir, "--json").stdout)
    assert [c["pid"] for c in js["health"]["conflicts"]] == [conflict["pid"]]
    assert js["health"]["command_exit"] == {"code": 0}


KILLED_IN_STEP_0 = """
import os
import signal
import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
os.kill(os.getpid(), signal.SIGKILL)  # before the first optimizer step
opt.step()
"""


def test_a_command_killed_during_step_0_reads_as_such(tmp_path):
    script = write_script(tmp_path / "killed.py", KILLED_IN_STEP_0)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, cwd=tmp_path)
    assert res.returncode == 128 + 9
    assert "run written" not in res.stderr
    assert "nothing captured" in res.stderr and "killed by signal 9 (SIGKILL)" in res.stderr
    rep = cli("report", run_dir)
    assert rep.returncode == 2 and rep.stderr.count("\n") == 1 and "Traceback" not in rep.stderr
    assert "no rank completed a step" in rep.stderr and "killed by signal 9 (SIGKILL) during step 0" in rep.stderr
    assert "not a neuron_prof run" not in rep.stderr


SHORT = """
import importlib.util
import sys

assert importlib.util.find_spec("torch") is not None  # as libraries look for torch before importing it
import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
"""


def test_a_reused_run_directory_is_replaced_by_the_new_run(tmp_path):
    script = write_script(tmp_path / "short.py", SHORT)
    killed = write_script(tmp_path / "killed.py", KILLED_IN_STEP_0)
    run_dir = tmp_path / "run"
    assert cli("record", "-o", run_dir, "--", sys.executable, script, "5", cwd=tmp_path).returncode == 0
    first = neuron_prof.load(run_dir)
    assert cli("record", "-o", run_dir, "--", sys.executable, script, "2", cwd=tmp_path).returncode == 0
    second = neuron_prof.load(run_dir)
    assert int(second.steps["complete"].sum()) == 2 and second.meta["run_id"] != first.meta["run_id"]
    assert second.rank_data[0].meta["run_id"] == second.meta["run_id"]
    # a new run that dies in step 0 does not show the older run's folder as its own
    assert cli("record", "-o", run_dir, "--", sys.executable, killed, cwd=tmp_path).returncode == 137
    rep = cli("report", run_dir)
    assert rep.returncode == 2 and "no rank completed a step" in rep.stderr


TWO_RANKS_ONE_KILLED = """
import os
import signal
import sys
import time
import torch

rank = int(os.environ["RANK"])
done = os.path.join(sys.argv[1], "rank0-done")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if rank == 1:  # dies in step 0, once rank 0 has finished its steps
    model(torch.randn(2, 4)).sum().backward()
    while not os.path.exists(done):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
open(done, "w").close()
"""


def test_a_rank_killed_in_step_0_is_listed_as_missing(tmp_path):
    script = write_script(tmp_path / "two.py", TWO_RANKS_ONE_KILLED)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, tmp_path, cwd=tmp_path)
    assert res.returncode != 0
    run = neuron_prof.load(run_dir)
    assert run.ranks == [0] and run.missing_ranks == [1] and run.meta["world_size"] == 2
    assert int(run.steps["complete"].sum()) == 3
    rep = cli("report", run_dir)
    assert rep.returncode == 0, rep.stderr
    assert "rank 1: no folder" in rep.stdout
    assert json.loads(cli("report", run_dir, "--json").stdout)["health"]["missing_ranks"] == [1]
    assert not any(".conflict-" in p for p in os.listdir(run_dir))


def test_a_second_process_of_the_run_that_wants_a_written_rank_writes_nothing(tmp_path):
    # two mains one after the other (a shell in between makes each the command's own process),
    # both rank 0: the first one's rank stays as it wrote it
    script = write_script(tmp_path / "short.py", SHORT)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", "sh", "-c", f"{sys.executable} {script} 2 && {sys.executable} {script} 3",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 2
    (c,) = run.conflicts.to_dict("records")
    assert not c["live"] and c["holder_pid"] == run.rank_data[0].meta["pid"] and c["argv"][-1] == "3"
    assert "1 process(es) wanted a rank another process owned" in res.stderr


SPAWNED_DDP = """
import os
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    print("parent", os.getpid(), flush=True)
    mp.spawn(rank_main, args=(int(sys.argv[1]),), nprocs=2)
"""


def test_ranks_spawned_by_the_training_script_are_captured_and_their_parent_leaves_nothing(tmp_path):
    # torch.multiprocessing.spawn: the ranks are helpers of a main that imports torch and never steps
    script = write_script(tmp_path / "spawned.py", SPAWNED_DDP)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, free_port(), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    parent = int(res.stdout.split()[1])
    run = neuron_prof.load(run_dir)
    assert run.ranks == [0, 1] and run.missing_ranks == [] and run.conflicts.empty
    assert parent not in {rd.meta["pid"] for rd in run.rank_data}
    # captured from the first optimizer step on: that step ends step 0
    assert run.steps.groupby("rank")["complete"].sum().to_dict() == {0: 3, 1: 3}
    assert not any(".conflict-" in p for p in os.listdir(run_dir))


WRAPPER = """
import subprocess
import sys

# a Python wrapper that never imports torch (as poetry/pipenv/hatch run are): what it starts are
# the command's own processes. The first one runs an op and no step; the second one trains.
subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2).sum())"], check=True)
subprocess.run([sys.executable, sys.argv[1], "4"], check=True)
"""


def test_processes_started_by_a_wrapper_without_torch_are_mains_and_a_stepless_one_gives_way(tmp_path):
    wrapper = write_script(tmp_path / "wrapper.py", WRAPPER)
    script = write_script(tmp_path / "short.py", SHORT)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, wrapper, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 4 and run.conflicts.empty
    # captured from its import of torch (a main), not from its first optimizer step (a helper)
    assert (run.ops["name"] == "aten::linear").sum() == 4
    assert "claimed by" not in res.stderr


SELF_LAUNCHED_RANKS = """
import os
import subprocess
import sys
import torch
import torch.distributed as dist

if "RANK" not in os.environ:  # rank 0 starts rank 1 itself, as Lightning's DDP launcher does
    child = subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "RANK": "1", "LOCAL_RANK": "1"})
    os.environ.update(RANK="0", LOCAL_RANK="0")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=int(os.environ["RANK"]),
                        world_size=2)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
if os.environ["RANK"] == "0":
    assert child.wait(timeout=120) == 0
"""


def test_a_rank_its_trainer_starts_with_a_rank_in_its_environment_is_captured_from_its_start(tmp_path):
    """Not a helper: its collectives from init_process_group on (DDP's constructor broadcast
    included) are recorded like rank 0's, and its start-up is its own span."""
    script = write_script(tmp_path / "self_launched.py", SELF_LAUNCHED_RANKS)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, free_port(), cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    run = neuron_prof.load(run_dir)
    assert run.ranks == [0, 1] and run.conflicts.empty
    assert sorted(run.spans["rank"]) == [0, 1]  # both captured from the interpreter's start
    coll = run.collectives
    per_rank = {r: list(zip(g["op"], g["seq"])) for r, g in coll.groupby("rank")}
    assert per_rank[0] == per_rank[1] and per_rank[0][0][1] == 1  # from the group's first collective
    assert ("broadcast" in {op for op, _ in per_rank[1]}) and coll.loc[coll["step"] == -1, "rank"].nunique() == 2
