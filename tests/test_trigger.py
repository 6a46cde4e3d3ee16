"""`neuron-prof trigger PID` and `neuron_prof.trigger`: a running always-on job captures its next
steps in full detail, with no restart; bad input is one line."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import neuron_prof
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.reports.summary.build import summarize
from conftest import SMALL_MLP, child_pid, check_trace, cli, kill_group, one_line_error, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own

MODEL = "import os, sys" + SMALL_MLP

JOB = MODEL + '''
stop = sys.argv[1]
step = 0
while not os.path.exists(stop):  # trains until the test says stop
    model(x).square().mean().backward()
    opt.step()  # under record --always-on: each optimizer step ends a step
    opt.zero_grad()
    step += 1
    if step == 5:
        print("ready", flush=True)
'''


def test_trigger_captures_exactly_the_next_steps_of_a_running_job(tmp_path):
    runtime = tmp_path / "runtime"  # the per-user folder of announcements: this test's own
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    script = write_script(tmp_path / "job.py", JOB)
    run_dir, stop = tmp_path / "run", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "neuron_prof", "record", "--always-on", "--detail-every", "1000",
                             "-o", str(run_dir), "--", sys.executable, str(script), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env})
    try:
        assert proc.stdout.readline().strip() == "ready"
        job = child_pid(proc.pid)
        # record itself captures nothing: the error names the process that does
        one_line_error(cli("trigger", proc.pid, "--steps", "3", env=env), f"process {proc.pid} runs no always-on "
                       "capture", f"its child process {job} does", "neuron-prof record --always-on")
        res = cli("trigger", job, "--steps", "3", "--wait", "120", env=env)
        assert res.returncode == 0, res.stderr
        first = int(res.stdout.split("captured steps ")[1].split("-")[0])
        assert f"captured steps {first}-{first + 2} in full detail into {run_dir} (rank 0)" in res.stdout
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # the Python API, from this process
        try:
            again = neuron_prof.trigger(job, steps=2, wait_s=120)
        finally:
            os.environ.pop("XDG_RUNTIME_DIR")
        assert again.run_dir == run_dir and again.rank == 0 and again.pid == job
        assert len(again.steps) == 2 and again.steps[0] > first + 2 and again.steps[1] == again.steps[0] + 1
        stop.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    assert not list(runtime.rglob("*.json")) and not list(runtime.rglob("*.request"))  # withdrawn at the end
    run = Run(run_dir)
    captured = [*range(first, first + 3), *again.steps]
    assert sorted(run.steps.loc[run.steps["active"], "step"]) == captured  # on-demand steps only: no dump happened
    per_step = run.ops.groupby("step").size()
    assert sorted(per_step.index) == captured and per_step.nunique() == 1  # the same loop: the same ops each step
    assert run.dumps.empty
    summary = summarize(run)
    assert summary.ops.captured_steps == len(captured)
    report = cli("report", run_dir)
    assert report.returncode == 0 and "aten::addmm" in report.stdout, report.stderr
    trace = tmp_path / "t.perfetto-trace"
    assert cli("export", run_dir, "-o", trace).returncode == 0
    check_trace(trace)
    one_line_error(cli("trigger", job, env=env), f"no process {job}")  # it ended


ADJACENT = MODEL + '''
# sampled: steps 1, 4, 7 (one in 3); steps end at the optimizer's step (its range still open)
with neuron_prof.profile(sys.argv[1], mode="always-on", detail_every=3, auto_step=True) as prof:
    for step in range(9):
        model(x).square().mean().backward()
        if step == 1:
            prof.capture_next(2)  # in a sampled step: 2 and 3 on disk, 4 sampled again
        opt.step()
        opt.zero_grad()
'''


def test_steps_on_demand_next_to_sampled_steps_hold_exactly_their_own_ops(tmp_path):
    """A sampled step's detail goes to the ring, an on-demand step's to disk: the optimizer's range,
    open at the boundary between the two, ends in the step it began in, on its side (it once went
    with the step after: step 1's into the on-demand data, step 3's into the ring)."""
    script = write_script(tmp_path / "adjacent.py", ADJACENT)
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    run = Run(run_dir)
    assert sorted(run.steps.loc[run.steps["active"], "step"]) == [2, 3]
    ops = run.ops.astype({"name": str})
    per_step = ops.groupby("step").size()
    assert list(per_step.index) == [2, 3] and per_step.nunique() == 1  # the same loop: the same ops each step
    optimizer_steps = ops[ops["name"].str.startswith("Optimizer.step#")].groupby("step").size()
    assert optimizer_steps.to_dict() == {2: 1, 3: 1}


def test_bad_input_is_one_line(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    one_line_error(cli("trigger", os.getpid(), env=env), f"process {os.getpid()} runs no always-on capture",
                   'profile(mode="always-on")')
    one_line_error(cli("trigger", os.getpid(), "--steps", "0", env=env), "--steps", ">= 1")
    one_line_error(cli("trigger", "nope", env=env), "invalid int value")
    dead = subprocess.Popen([sys.executable, "-c", "0"])
    dead.wait()
    one_line_error(cli("trigger", dead.pid, env=env), f"no process {dead.pid}")
    with pytest.raises(ValueError, match="steps must be"):
        neuron_prof.trigger(os.getpid(), steps=0)
    # a folder others could write to (or a link) is never trusted: someone could plant requests
    shared = tmp_path / "shared"
    (shared / "neuron_prof").mkdir(parents=True, mode=0o777)
    os.chmod(shared / "neuron_prof", 0o777)
    one_line_error(cli("trigger", os.getpid(), env={"XDG_RUNTIME_DIR": str(shared)}), "not a private folder")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "neuron_prof").symlink_to(runtime)
    one_line_error(cli("trigger", os.getpid(), env={"XDG_RUNTIME_DIR": str(linked)}), "not a private folder")


def test_the_channel_answers_only_its_own_process(tmp_path, monkeypatch):
    """An announcement outlives a process killed with -9; the pid's next owner is not it."""
    from neuron_prof.capture.ondemand import ControlChannel, request
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    channel = ControlChannel.open(tmp_path / "run", 3)
    try:
        assert channel.poll() is None
        first = request(os.getpid(), 4)
        assert (first.run_dir, first.rank, first.steps) == (tmp_path / "run", 3, [])
        request(os.getpid(), 2)
        assert channel.poll() == 4 and channel.poll() is None  # the most asked for, consumed
        announcement = tmp_path / "neuron_prof" / f"{os.getpid()}.json"
        text = announcement.read_text()
        announcement.write_text(text.replace('"start": ', '"start": 1'))  # as if left by an earlier owner
        with pytest.raises(NeuronProfError, match="runs no always-on capture"):
            request(os.getpid(), 1)
    finally:
        channel.close()
    assert not list((tmp_path / "neuron_prof").iterdir())
