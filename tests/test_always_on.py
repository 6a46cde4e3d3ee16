"""Always-on capture: light tables for the whole job, the last steps' detail written on a real
signal, a real hang (a thread holding a lock the training loop waits for), a real exception."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import neuron_prof
from neuron_prof.errors import NeuronProfError
from neuron_prof.summary.build import summarize
from neuron_prof.summary.text import render_text
from neuron_prof.run import Run
from conftest import check_trace, cli, line_of, one_line_error, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

LOOP = '''
import os, signal, sys, threading, time
import torch, torch.nn as nn
import neuron_prof

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters())
x = torch.randn(16, 32)
lock = threading.Lock()
held = threading.Event()


def holder():
    with lock:
        held.set()
        time.sleep(HANG_S)  # HOLDER-LINE


def train_step():
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
'''


def _always_on_script(tmp: Path) -> Path:
    return write_script(tmp / "always_on.py", LOOP + '''
HANG_S = 6.0  # the hang: 3x the timeout; a step of this loop takes milliseconds, even loaded (over 100x below it)
run = sys.argv[1]
with neuron_prof.profile(run, mode="always-on", ring_steps=4, hang_timeout_s=2.0) as prof:
    for i in range(40):
        train_step()
        prof.step()
        if i == 9:
            os.kill(os.getpid(), signal.SIGUSR1)  # USR1-LINE
        if i == 19:
            t = threading.Thread(target=holder, name="holder")
            t.start()
            held.wait()  # the holder has the lock
            with lock:  # WAIT-LINE
                pass
            t.join()
    raise RuntimeError("diverged at step 40")  # RAISE-LINE
''')


@pytest.fixture(scope="module")
def always_on_run(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("always_on")
    script = _always_on_script(tmp)
    run = tmp / "run"
    res = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "RuntimeError: diverged at step 40" in res.stderr, res.stderr
    return run, script


@pytest.mark.timing  # the hang watchdog: a 2 s timeout against millisecond steps and a 6 s hang
def test_each_trigger_writes_the_last_steps_with_where_each_thread_was(always_on_run):
    run_dir, script = always_on_run
    run = Run(run_dir)
    dumps = run.dumps
    reasons = list(dict.fromkeys(dumps["reason"].astype(str)))
    assert reasons[0] == "signal SIGUSR1"
    assert reasons[1].startswith("hang: no step completed for ")
    assert reasons[2] == "exception: RuntimeError: diverged at step 40"
    by_reason = {r: dumps[dumps["reason"].astype(str) == r] for r in reasons}
    # SIGUSR1 after step 9 ended: steps 6-9 whole (ring of 4), step 10 in flight
    usr1 = by_reason[reasons[0]]
    assert (int(usr1["first_step"].iloc[0]), int(usr1["last_step"].iloc[0])) == (6, 10)
    assert list(usr1["user_source"].astype(str)) == [f"{script}:{line_of(script, '# USR1-LINE')}"]
    # the hang: step 20 waits on the lock; both threads' stacks, each at the line it waits on
    hang = by_reason[reasons[1]]
    assert (int(hang["first_step"].iloc[0]), int(hang["last_step"].iloc[0])) == (16, 20)
    where = set(hang["user_source"].astype(str))
    assert f"{script}:{line_of(script, '# WAIT-LINE')}" in where
    assert f"{script}:{line_of(script, '# HOLDER-LINE')}" in where
    # the exception: where it was raised, the step in flight is the last
    exc = by_reason[reasons[2]]
    assert (int(exc["first_step"].iloc[0]), int(exc["last_step"].iloc[0])) == (36, 40)
    assert list(exc["user_source"].astype(str)) == [f"{script}:{line_of(script, '# RAISE-LINE')}"]


def test_detail_is_exactly_the_dumped_steps(always_on_run):
    run = Run(always_on_run[0])
    steps = run.steps
    assert len(steps) == 41 and steps["complete"].sum() == 40  # every step's time, the whole job
    active = sorted(steps.loc[steps["active"], "step"])
    assert active == [*range(6, 10), *range(16, 20), *range(36, 40)]
    ops = run.ops
    per_step = ops[ops["step"].isin(active)].groupby("step").size()
    assert set(per_step.index) == set(active)
    assert per_step.nunique() == 1 and per_step.iloc[0] > 20  # the same loop: the same ops each step
    # nothing of the steps no dump covered (the in-flight steps are there in part)
    assert set(ops["step"]) <= set(active) | {10, 20, 40}
    mem = run.memory_events
    assert set(mem.loc[mem["kind"].astype(str) == "alloc", "step"]) <= set(active) | {10, 20, 40}
    assert len(run.memory_steps) >= 40  # per-step memory for every step


def test_report_and_trace_show_the_dumps(always_on_run, tmp_path):
    run_dir, script = always_on_run
    s = summarize(Run(run_dir))
    assert [d["reason"].split(":")[0] for d in s.to_json()["dumps"]] == ["signal SIGUSR1", "hang", "exception"]
    assert "Always-on dumps" in render_text(s)
    res = cli("report", run_dir)
    assert res.returncode == 0, res.stderr
    assert "Always-on dumps" in res.stdout
    assert f"at {script}:{line_of(script, '# WAIT-LINE')}" in res.stdout
    finding = next(line for line in res.stdout.splitlines() if "always-on dump" in line and "hang" in line)
    assert finding.lstrip().startswith("!!") and "steps 16-20 in detail" in finding
    trace = tmp_path / "t.perfetto-trace"
    assert cli("export", run_dir, "-o", trace).returncode == 0
    check_trace(trace)


def test_a_job_that_ends_well_writes_no_detail(tmp_path):
    script = write_script(tmp_path / "ok.py", LOOP + '''
HANG_S = 0
with neuron_prof.profile(sys.argv[1], mode="always-on", ring_steps=3) as prof:
    for i in range(25):
        train_step()
        prof.step()
''')
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    run = Run(tmp_path / "run")
    assert len(run.steps) == 26 and not run.steps["active"].any()
    assert run.ops.empty and run.dumps.empty
    assert run.memory_events.empty and len(run.memory_steps) >= 25
    assert all(h["closed"] for h in summarize(run).to_json()["health"]["ranks"])


def test_record_always_on_sigterm_closes_the_run_and_dies_of_the_signal(tmp_path):
    script = write_script(tmp_path / "forever.py", LOOP + '''
HANG_S = 0
i = 0
while True:
    train_step()  # STEP-LINE
    i += 1
    if i == 30:
        print("ready", flush=True)
''')
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "neuron_prof", "record", "--always-on", "--ring-steps", "5",
                             "-o", str(run), "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        child = _child_pid(proc.pid)
        os.kill(child, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "killed by signal 15" in err or "SIGTERM" in err, err
    r = Run(run)
    assert list(r.dumps["reason"].astype(str)) == ["signal SIGTERM"]
    last = int(r.dumps["last_step"].iloc[0])
    assert int(r.dumps["first_step"].iloc[0]) == last - 5 and last >= 30
    assert sorted(r.steps.loc[r.steps["active"], "step"]) == list(range(last - 5, last))
    assert summarize(r).to_json()["health"]["ranks"][0]["closed"]  # closed by the handler before the signal's death


def test_a_programs_own_signal_handlers_are_left_alone(tmp_path):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR1, mine)
    try:
        with neuron_prof.profile(tmp_path / "run", mode="always-on", collectors=["eager"], hang_timeout_s=None):
            assert signal.getsignal(signal.SIGUSR1) is mine
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # ours, where nobody had one
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_wrong_settings_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        neuron_prof.profile(tmp_path / "a", mode="always_on")
    with pytest.raises(ValueError, match="takes no schedule"):
        neuron_prof.profile(tmp_path / "b", mode="always-on", schedule=neuron_prof.schedule(active=2))
    with pytest.raises(ValueError, match="ring_steps must be >= 1"):
        neuron_prof.profile(tmp_path / "c", mode="always-on", ring_steps=0)
    with neuron_prof.profile(tmp_path / "d", collectors=["eager"]) as prof:
        with pytest.raises(NeuronProfError, match='mode=\\\\?"always-on'):
            prof.dump()
    res = cli("record", "--always-on", "--schedule", "1,1,2", "-o", tmp_path / "e", "--", sys.executable, "-c", "0")
    one_line_error(res, "--always-on", "--schedule")
    res = cli("record", "--always-on", "--ring-steps", "0", "-o", tmp_path / "f", "--", sys.executable, "-c", "0")
    assert res.returncode == 2 and "invalid count '0'" in res.stderr


def _child_pid(pid: int, timeout: float = 30) -> int:
    """The one child process of ``pid`` (record's command)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child")


def test_an_out_of_memory_error_dumps_with_what_was_live(tmp_path):
    script = write_script(tmp_path / "oom.py", LOOP + '''
import resource
HANG_S = 0


def vm():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize"):
            return int(line.split()[1]) * 1024


with neuron_prof.profile(sys.argv[1], mode="always-on", ring_steps=3) as prof:
    for i in range(12):
        train_step()
        prof.step()
    limit = vm() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    big = torch.empty(1 << 30)  # OOM-LINE: 4 GiB of float32
''')
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1 and "can't allocate memory" in res.stderr, res.stderr
    run = Run(tmp_path / "run")
    dump = run.dumps
    assert len(dump) == 1 and str(dump["reason"].iloc[0]).startswith("exception: RuntimeError: ")
    assert str(dump["user_source"].iloc[0]) == f"{script}:{line_of(script, '# OOM-LINE')}"
    assert (int(dump["first_step"].iloc[0]), int(dump["last_step"].iloc[0])) == (9, 12)
    oom = run.memory_ooms
    assert len(oom) == 1 and oom["bytes"].iloc[0] == 1 << 32 and oom["step"].iloc[0] == 12
    live = run.memory_events[run.memory_events["kind"].astype(str) == "live"]
    assert live["bytes"].sum() > 0  # the model and Adam's state, live at the OOM


def test_a_signal_inside_our_own_work_waits_for_its_end(tmp_path):
    """A handler runs between bytecodes, so a signal can land while the session flushes (its lock
    held): the dump waits for that work to end instead of re-entering it half done."""
    import torch
    model = torch.nn.Linear(8, 8)
    with neuron_prof.profile(tmp_path / "run", mode="always-on", collectors=["eager"], hang_timeout_s=None) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
        with prof.session._lock:  # as inside a flush
            os.kill(os.getpid(), signal.SIGUSR1)  # delivered to this thread as the call returns
            deadline = time.monotonic() + 60  # its Python handler runs at the next bytecode boundary
            while prof.session._deferred is None and time.monotonic() < deadline:
                time.sleep(0.001)
            assert prof.session._deferred is not None  # the handler ran, and deferred the dump
        model(torch.randn(4, 8)).sum().backward()
        prof.step()  # its end writes the deferred dump
        assert prof.session._deferred is None
    dumps = Run(tmp_path / "run").dumps
    assert list(dumps["reason"].astype(str)) == ["signal SIGUSR1"] and int(dumps["last_step"].iloc[0]) == 4
