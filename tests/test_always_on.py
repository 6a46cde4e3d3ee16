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
from neuron_prof.reports.summary.build import summarize
from neuron_prof.reports.summary.text import render_text
from neuron_prof.store.run import Run
from conftest import (SMALL_MLP, child_pid, check_trace, cli, free_port, gloo_env, kill_group, line_of,
                      one_line_error, write_script)

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

LOOP = "import os, signal, sys, threading, time" + SMALL_MLP + '''lock = threading.Lock()
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
with neuron_prof.profile(run, mode="always-on", ring_steps=4, detail_every=2, hang_timeout_s=2.0) as prof:
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
    # detail every 2 steps (the odd ones), a ring of 4 sampled steps:
    # SIGUSR1 after step 9 ended: steps 3, 5, 7, 9 whole, step 10 in flight
    usr1 = by_reason[reasons[0]]
    assert (int(usr1["first_step"].iloc[0]), int(usr1["last_step"].iloc[0])) == (3, 10)
    assert list(usr1["user_source"].astype(str)) == [f"{script}:{line_of(script, '# USR1-LINE')}"]
    # the hang: step 20 waits on the lock; both threads' stacks, each at the line it waits on
    hang = by_reason[reasons[1]]
    assert (int(hang["first_step"].iloc[0]), int(hang["last_step"].iloc[0])) == (13, 20)
    where = set(hang["user_source"].astype(str))
    assert f"{script}:{line_of(script, '# WAIT-LINE')}" in where
    assert f"{script}:{line_of(script, '# HOLDER-LINE')}" in where
    # the exception: where it was raised, the step in flight is the last
    exc = by_reason[reasons[2]]
    assert (int(exc["first_step"].iloc[0]), int(exc["last_step"].iloc[0])) == (33, 40)
    assert list(exc["user_source"].astype(str)) == [f"{script}:{line_of(script, '# RAISE-LINE')}"]


def test_detail_is_exactly_the_dumped_steps(always_on_run):
    run = Run(always_on_run[0])
    steps = run.steps
    assert len(steps) == 41 and steps["complete"].sum() == 40  # every step's time, the whole job
    active = sorted(steps.loc[steps["active"], "step"])
    assert active == [3, 5, 7, 9, 13, 15, 17, 19, 33, 35, 37, 39]  # the sampled steps each dump wrote
    ops = run.ops
    per_step = ops[ops["step"].isin(active)].groupby("step").size()
    assert set(per_step.index) == set(active)
    assert per_step.nunique() == 1 and per_step.iloc[0] > 20  # the same loop: the same ops each step
    # nothing of the steps no dump covered, nor of those not sampled (the in-flight steps 10, 20, 40)
    assert set(ops["step"]) == set(active)
    mem = run.memory_events
    assert set(mem.loc[mem["kind"].astype(str) == "alloc", "step"]) <= set(active)
    assert len(run.process_memory) >= 40  # per-step memory for every step (the CPU's: resident memory)


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
    assert finding.lstrip().startswith("!!") and "(steps 13, 15, 17, 19 in detail)" in finding
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
    assert run.memory_events.empty and len(run.process_memory) >= 25
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
                             "--detail-every", "2", "--follow-cpu-memory",
                             "-o", str(run), "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        child = child_pid(proc.pid)
        os.kill(child, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "killed by signal 15" in err or "SIGTERM" in err, err
    r = Run(run)
    assert list(r.dumps["reason"].astype(str)) == ["signal SIGTERM"]
    last = int(r.dumps["last_step"].iloc[0])
    sampled = [s for s in range(last) if s % 2 == 1][-5:]  # the last 5 sampled steps (1 in 2: the odd ones)
    assert int(r.dumps["first_step"].iloc[0]) == sampled[0] and last >= 30
    assert sorted(r.steps.loc[r.steps["active"], "step"]) == sampled
    assert summarize(r).to_json()["health"]["ranks"][0]["closed"]  # closed by the handler before the signal's death
    cpu = r.memory_steps[r.memory_steps["device"].astype(str) == "cpu"]
    assert set(cpu["step"]) >= set(range(30))  # --follow-cpu-memory: the CPU allocator's figures at every step


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
    with pytest.raises(ValueError, match="detail_every must be >= 1"):
        neuron_prof.profile(tmp_path / "c", mode="always-on", detail_every=0)
    with pytest.raises(ValueError, match="follow_cpu_memory is for mode=\"always-on\""):
        neuron_prof.profile(tmp_path / "c", follow_cpu_memory=True)
    with neuron_prof.profile(tmp_path / "d", collectors=["eager"]) as prof:
        with pytest.raises(NeuronProfError, match='mode=\\\\?"always-on'):
            prof.dump()
    res = cli("record", "--always-on", "--schedule", "1,1,2", "-o", tmp_path / "e", "--", sys.executable, "-c", "0")
    one_line_error(res, "--always-on", "--schedule")
    res = cli("record", "--always-on", "--ring-steps", "0", "-o", tmp_path / "f", "--", sys.executable, "-c", "0")
    assert res.returncode == 2 and "invalid count '0'" in res.stderr
    res = cli("record", "--follow-cpu-memory", "-o", tmp_path / "g", "--", sys.executable, "-c", "0")
    one_line_error(res, "--follow-cpu-memory", "--always-on")
    assert not (tmp_path / "g").exists()  # refused before anything ran or was written


def test_an_out_of_memory_error_dumps_with_what_was_live(tmp_path):
    script = write_script(tmp_path / "oom.py", LOOP + '''
import resource
HANG_S = 0


def vm():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize"):
            return int(line.split()[1]) * 1024


with neuron_prof.profile(sys.argv[1], mode="always-on", ring_steps=3, detail_every=2,
                         follow_cpu_memory=True) as prof:  # the CPU's live set at every step
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
    assert (int(dump["first_step"].iloc[0]), int(dump["last_step"].iloc[0])) == (7, 12)  # sampled 7, 9, 11
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


@pytest.mark.parametrize("follow", [False, True])
def test_cpu_allocations_are_followed_in_sampled_steps_unless_asked(tmp_path, follow):
    """Between sampled steps the CPU allocator is left alone (c10 reports nothing, keeps no size
    table): a block made in a sampled step and freed after it ends its known life when the window
    closes, one made outside and freed in a sampled step is not seen at all, and the CPU's per-step
    figure is the process's resident memory. ``follow_cpu_memory`` follows it at every step."""
    import torch

    from neuron_prof.analysis.memory import allocations

    a_bytes, b_bytes = 4 * 11_111, 4 * 22_222  # sizes nothing else in this loop allocates
    model = torch.nn.Linear(16, 16)
    held = {}
    with neuron_prof.profile(tmp_path / "run", mode="always-on", detail_every=3, collectors=["eager", "memory"],
                             hang_timeout_s=None, follow_cpu_memory=follow) as prof:
        for i in range(8):  # sampled: steps 1, 4, 7
            model(torch.randn(4, 16)).sum().backward()
            if i == 1:
                held["a"] = torch.empty(a_bytes // 4)  # made in a sampled step ...
            if i == 2:
                del held["a"]  # ... freed in the next one, not sampled
            if i == 3:
                held["b"] = torch.empty(b_bytes // 4)  # made between sampled steps ...
            if i == 4:
                del held["b"]  # ... freed in a sampled one
            prof.step()
        prof.dump()
    run = Run(tmp_path / "run")
    steps = run.steps.set_index("step")
    ev = run.memory_events
    kind = ev["kind"].astype(str)
    a_rows = ev[ev["bytes"].abs() == a_bytes]
    b_rows = ev[ev["bytes"].abs() == b_bytes]
    cpu_steps = run.memory_steps[run.memory_steps["device"].astype(str) == "cpu"]
    assert set(run.process_memory["step"]) >= set(range(8))  # the CPU's resident memory, every step
    a = allocations(ev, None, run.steps)
    a = a[a["bytes"] == a_bytes]
    assert len(a) == 1 and int(a["step"].iloc[0]) == 1
    if follow:
        assert sorted(kind[a_rows.index]) == ["alloc", "late_free"]  # its free, in step 2
        assert steps.loc[2, "ts"] <= int(a["free_ts"].iloc[0]) < steps.loc[3, "ts"]
        assert sorted(kind[b_rows.index]) == ["baseline", "free"]  # live when step 4 began, freed in it
        assert set(cpu_steps["step"]) >= set(range(8))
    else:
        assert sorted(kind[a_rows.index]) == ["alloc", "unfollowed"]  # let go when step 1's window closed
        assert int(a["free_ts"].iloc[0]) <= steps.loc[2, "ts"]
        assert b_rows.empty and not (kind == "late_free").any()  # nothing reported between sampled steps
        assert cpu_steps.empty


def test_steps_between_samples_end_quickly_and_still_open_every_window(tmp_path):
    """Between sampled steps a boundary takes the short way (``Session._quiet_step``), up to the
    step before the next sampled one, whose end must turn the window on; ``capture_next`` in such
    a step must still begin its window at the next boundary. Every step keeps its row, resident
    memory and contiguous time; the detail is exactly that of the sampled and requested steps."""
    import torch
    model = torch.nn.Linear(8, 8)
    with neuron_prof.profile(tmp_path / "run", mode="always-on", detail_every=5, ring_steps=100,
                             collectors=["eager", "memory"], hang_timeout_s=None) as prof:
        for i in range(24):  # sampled: 1, 6, 11, 16, 21; steps 2-4, 7-9, ... end the short way
            model(torch.randn(4, 8)).sum().backward()
            if i == 12:
                prof.capture_next(2)  # in a short-way step: 13 and 14 on disk
            prof.step()
        quiet_until = prof.session._quiet_until
        prof.dump()
    assert quiet_until == 25  # the step before the next sampled one (26) ends the whole way
    run = Run(tmp_path / "run")
    steps = run.steps.sort_values("step")
    assert list(steps["step"]) == list(range(25)) and steps["complete"].sum() == 24
    ends = (steps["ts"] + steps["dur"]).to_numpy()[:-1]
    assert (steps["ts"].to_numpy()[1:] >= ends).all()  # contiguous, in order
    assert sorted(set(run.ops["step"])) == [1, 6, 11, 13, 14, 16, 21]
    assert set(run.process_memory["step"]) >= set(range(24))


BROKEN_COUNTERS = """
import sys, types
import torch
import neuron_prof

torch.utils.rename_privateuse1_backend("brokenmem")


def device_count():
    raise RuntimeError("brokenmem driver gone")


torch._register_device_module("brokenmem", types.SimpleNamespace(device_count=device_count))
model = torch.nn.Linear(8, 8)
with neuron_prof.profile(sys.argv[1], mode="always-on", detail_every=100, collectors=["memory"],
                         hang_timeout_s=None) as prof:
    for _ in range(6):  # steps 2-5 between sampled steps: the short way
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
"""


def test_a_backend_whose_memory_counters_fail_loses_them_not_the_memory_collector(tmp_path):
    """A registered backend whose counters cannot be probed (its ``device_count`` raises) costs
    the run those counters, named once in Capture health, at the short way between sampled steps
    as at a full boundary: the memory collector goes on (the process's RSS at every step)."""
    script = write_script(tmp_path / "broken_counters.py", BROKEN_COUNTERS)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    run = Run(tmp_path / "run")
    failures = run.failures
    named = dict(zip(failures["collector"].astype(str), failures["message"].astype(str)))
    assert named == {"memory (memory_steps)": "RuntimeError: brokenmem driver gone"}
    assert set(run.process_memory["step"]) >= set(range(6))


def _written_by_thread(tid: int) -> int:
    """Bytes this process's thread ``tid`` handed to write() and its kin (/proc/PID/task/TID/io)."""
    for line in Path(f"/proc/self/task/{tid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar line")


def test_a_step_boundary_writes_nothing_the_background_thread_writes_the_steps(tmp_path):
    """Always-on: the training thread's step boundaries between sampled steps make no write
    (the kernel's own per-thread count says so); the background thread writes their rows."""
    import threading
    import torch
    model = torch.nn.Linear(8, 8)
    me = threading.get_native_id()
    with neuron_prof.profile(tmp_path / "run", mode="always-on", detail_every=1000, hang_timeout_s=None) as prof:
        for _ in range(3):  # step 1 is a sampled one: its detail goes to memory, not to disk either
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
        background = next(t for t in threading.enumerate() if t.name == "neuron_prof always-on")
        mine, its = _written_by_thread(me), _written_by_thread(background.native_id)
        for _ in range(50):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
        assert _written_by_thread(me) == mine  # 50 boundaries, not one byte written by this thread
        deadline = time.monotonic() + 60  # the background thread writes about once a second
        while _written_by_thread(background.native_id) == its and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _written_by_thread(background.native_id) > its
    steps = Run(tmp_path / "run").steps
    assert len(steps) == 54 and steps["complete"].sum() == 53


HANG_IN_ALL_REDUCE = """
import sys, time
import torch, torch.distributed as dist
import neuron_prof

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(16, 16)
x = torch.randn(4, 16)
with neuron_prof.profile(sys.argv[1], mode="always-on", ring_steps=2, detail_every=2, hang_timeout_s=1.5) as prof:
    for i in range(6):
        model(x).sum().backward()
        t = torch.ones(256)
        if i == 4 and rank == 1:
            time.sleep(5.0)  # BLOCK-LINE: rank 1 is late; rank 0 waits in the all_reduce
        dist.all_reduce(t)  # ALLREDUCE-LINE
        prof.step()
dist.destroy_process_group()
"""


@pytest.mark.timing  # the hang watchdog: a 1.5 s timeout against a 5 s block and millisecond steps
def test_a_hang_dump_shows_the_collective_in_flight_and_the_blocking_line(tmp_path):
    script = write_script(tmp_path / "hang.py", HANG_IN_ALL_REDUCE)
    run_dir, port = tmp_path / "run", free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(run_dir)], cwd=tmp_path,
                              env={**os.environ, **gloo_env(r, 2, port)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for r in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            kill_group(p)
    run = Run(run_dir)
    dumps = run.dumps
    assert set(dumps["rank"]) == {0, 1} and all(r.startswith("hang: ") for r in dumps["reason"].astype(str))
    assert set(dumps["last_step"]) == {4}
    where = dict(zip(dumps["rank"], dumps["user_source"].astype(str)))
    # paths as the report shows them: relative to the job's working directory
    assert where == {0: f"hang.py:{line_of(script, '# ALLREDUCE-LINE')}", 1: f"hang.py:{line_of(script, '# BLOCK-LINE')}"}
    stuck = run.dump_collectives
    assert list(stuck["rank"]) == [0]  # rank 1 has issued nothing it waits for
    row = stuck.iloc[0]
    assert (str(row["op"]), str(row["group"]), int(row["seq"]), int(row["bytes"])) == ("all_reduce", "0", 5, 1024)
    # issued a few ms after step 4 began, dumped once no step completed for 1.5 s (checked every 0.375 s)
    assert 1.0e9 <= int(row["ts"]) - int(row["since"]) < 5e9 and int(row["step"]) == 4
    issued = run.collectives[(run.collectives["rank"] == 0) & (run.collectives["seq"] == 5)]
    assert issued["ts"].tolist() == [row["since"]] and issued["status"].astype(str).tolist() == ["completed"]
    res = cli("report", run_dir)
    assert res.returncode == 0, res.stderr
    assert "    in flight: all_reduce (group 0, seq 5) for " in res.stdout
    finding = next(line for line in res.stdout.splitlines() if "always-on dump on rank 0" in line)
    assert finding.lstrip().startswith("!!") and "; in flight: all_reduce (group 0, seq 5)" in finding
    assert f"at hang.py:{line_of(script, '# ALLREDUCE-LINE')}" in finding


QUEUE_DUMP = """
import sys
import torch
import neuron_prof
from neuron_prof.testing import neuron

mod = neuron.enable(launch_us=2000.0)  # slow kernels: .item() waits for the queue
torch.manual_seed(0)
model = torch.nn.Linear(16, 16).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16).to("neuron")
with neuron_prof.profile(sys.argv[1], mode="always-on", detail_every=1, hang_timeout_s=None) as prof:
    for i in range(3):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()  # the host waits for the queue: a sync flush
        prof.step()
    mod.set_launch_us(20_000.0)  # 20 ms kernels: the host is far ahead of the device
    y = x
    for _ in range(4):
        y = y @ y.T / 16  # a matmul does not fuse with a matmul: kernels queue behind each other
    prof.dump("look at the queue")  # DUMP-LINE
    torch.neuron.synchronize()
"""


def test_a_dump_shows_the_device_queue(tmp_path):
    script = write_script(tmp_path / "device_queue.py", QUEUE_DUMP)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    run = Run(tmp_path / "run")
    assert list(run.dumps["user_source"].astype(str)) == [f"{script}:{line_of(script, '# DUMP-LINE')}"]
    queues = run.dump_queues
    assert len(queues) == 1
    q = queues.iloc[0]
    assert str(q["device"]) == "neuron:0" and int(q["step"]) == 3
    assert 1 <= int(q["depth"]) <= 8 and int(q["depth_ts"]) <= int(q["ts"])  # 8 ops queued at most, 4 kernels' worth
    assert str(q["flush_reason"]) == "sync" and int(q["flush_ops"]) > 0 and 0 < int(q["flush_ts"]) < int(q["depth_ts"])
    flushes = run.queue_flushes
    # the last before the dump: the hook API's state is on the run clock, the flush row came through
    # Kineto's epoch clock and back (two offsets measured apart, each to within tens of ns): 1 us
    assert abs(int(q["flush_ts"]) - int(flushes.loc[flushes["ts"] < q["ts"] + 1000, "ts"].max())) < 1000
    report = cli("report", tmp_path / "run")
    assert report.returncode == 0, report.stderr
    assert f"    device queue neuron:0: {int(q['depth'])} ops queued (" in report.stdout
    assert f"last flush: sync, {int(q['flush_ops'])} ops, " in report.stdout


QUEUE_DUMP_BETWEEN_SAMPLES = """
import sys, time
import torch
import neuron_prof
from neuron_prof.testing import neuron

mod = neuron.enable(launch_us=2000.0)
torch.manual_seed(0)
model = torch.nn.Linear(16, 16).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16).to("neuron")
with neuron_prof.profile(sys.argv[1], mode="always-on", detail_every=1000, hang_timeout_s=None) as prof:
    for i in range(4):  # step 1 is sampled; 0, 2, 3 and 4 (the dump's) are not
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()  # a sync flush in every step
        prof.step()
    mod.set_launch_us(20_000.0)  # 20 ms kernels: the host is far ahead of the device
    y = x
    for _ in range(3):
        y = y @ y.T / 16
    before = time.monotonic_ns()
    y.sum().item()  # the last flush before the dump: the host waits for 3 matmuls
    after = time.monotonic_ns()
    for _ in range(4):
        y = y @ y.T / 16  # a matmul does not fuse with a matmul: kernels queue behind each other
    prof.dump("look at the queue")  # DUMP-LINE
    torch.neuron.synchronize()
print(before, after)
"""


def test_a_dump_between_sampled_steps_shows_the_queue_as_it_is(tmp_path):
    """The backend reports its queue all through an always-on capture: a dump in a step that is not
    sampled shows that step's last flush and the depth queued since, not the last sampled step's."""
    script = write_script(tmp_path / "device_queue.py", QUEUE_DUMP_BETWEEN_SAMPLES)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    before, after = (int(t) for t in res.stdout.split())
    run = Run(tmp_path / "run")
    assert list(run.dumps["user_source"].astype(str)) == [f"{script}:{line_of(script, '# DUMP-LINE')}"]
    for table in (run.device_enqueues, run.queue_flushes, run.device_kernels):
        assert set(table["step"]) == {1}  # rows: the sampled step's only
    queues = run.dump_queues
    assert len(queues) == 1
    q = queues.iloc[0]
    assert str(q["device"]) == "neuron:0" and int(q["step"]) == 4
    # the flush just before the dump, in step 4: the .item() between `before` and `after`
    assert str(q["flush_reason"]) == "sync" and int(q["flush_ops"]) > 0
    assert before <= int(q["flush_ts"]) and int(q["flush_ts"]) + int(q["flush_dur"]) <= after
    assert int(q["flush_ts"]) > int(run.queue_flushes["ts"].max())  # newer than any sampled step's
    # the depth after the last enqueue: the 4 matmuls queued since, 8 ops at most, 4 kernels' worth
    assert 1 <= int(q["depth"]) <= 8 and after <= int(q["depth_ts"]) <= int(q["ts"])
    report = cli("report", tmp_path / "run")
    assert report.returncode == 0, report.stderr
    assert f"    device queue neuron:0: {int(q['depth'])} ops queued (" in report.stdout
    assert f"last flush: sync, {int(q['flush_ops'])} ops, " in report.stdout
