"""kill -9 in the middle of an active window leaves a run that report and export read; a kill -9
between windows (a schedule's idle steps, always-on's unsampled ones, record's steps after its
budget cut) loses at most the step in flight (issue 41, case 6)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import zlib

import pandas as pd
import pytest

import neuron_prof
from conftest import check_trace, child_pid, cli, one_line_error, write_script
from neuron_prof.store.schema import STEP_RING
from neuron_prof.store.step_ring import SLOTS

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


BETWEEN_WINDOWS = """
import sys
import torch
import neuron_prof

torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
mode = sys.argv[2]
kwargs = ({"schedule": neuron_prof.schedule(wait=1, warmup=1, active=3, repeat=1)} if mode == "schedule"
          else {"mode": "always-on", "detail_every": 1000, "hang_timeout_s": None})
with neuron_prof.profile(sys.argv[1], **kwargs) as prof:
    step = 0
    while True:
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
        step += 1
        print("done", step, flush=True)
"""

RECORDED = """
import torch

torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()  # under record, the step ends here
    opt.zero_grad()
    step += 1
    print("done", step, flush=True)
"""
AFTER_WINDOW = 200
"""Steps the child completes past its last window before the kill: at a few per millisecond,
well within the second after which the old capture committed idle steps."""


def _kill_after(proc: subprocess.Popen, steps: int, pid: int | None = None) -> int:
    """SIGKILL the training (``pid``, default ``proc``) once it has said ``steps`` steps ended;
    the steps it said had ended when the kill was sent."""
    seen = 0
    for line in proc.stdout:
        seen = int(line.split()[1])
        if seen >= steps:
            break
    os.kill(pid or proc.pid, signal.SIGKILL)
    proc.wait()
    return seen


def _assert_keeps_every_ended_step(run_dir, ended: int) -> pd.DataFrame:
    """Every step the child said had ended is in the run, complete; the rank did not close."""
    run = neuron_prof.load(run_dir)
    done = run.steps[run.steps["complete"]]
    assert set(range(ended)) <= set(done["step"]), f"{ended} steps ended, the run has {len(done)}"
    assert list(done["step"]) == list(range(len(done)))  # in order, each once, no gap
    assert (done["dur"] > 0).all() and (done["ts"].diff().dropna() > 0).all()
    assert not run.health["closed"].any()
    return done


@pytest.mark.parametrize("mode,after", [("schedule", AFTER_WINDOW), ("always-on", AFTER_WINDOW),
                                        ("always-on", 2 * SLOTS)])  # more than the ring holds
def test_kill_9_between_windows_loses_at_most_the_step_in_flight(tmp_path, mode, after):
    """Steps outside detail windows are committed about once a second; the ones in between are
    in the step ring, so a kill -9 a few hundred short steps after the window keeps them all (and
    so do thousands: the capture commits before the ring laps a row it needs)."""
    script = write_script(tmp_path / "loop.py", BETWEEN_WINDOWS)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), mode], stdout=subprocess.PIPE, text=True)
    ended = _kill_after(proc, 5 + after)  # the schedule's window is steps 2-4; always-on samples step 1
    assert proc.returncode == -signal.SIGKILL
    assert (run_dir / "rank-00000" / STEP_RING).is_file()
    done = _assert_keeps_every_ended_step(run_dir, ended)
    active = set(done.loc[done["active"], "step"])
    assert active == ({2, 3, 4} if mode == "schedule" else set())  # a sampled step stays in memory without a dump
    rep = cli("report", run_dir, "--json")
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["health"]["ranks"][0]["closed"] is False


def test_kill_9_under_record_after_the_budget_cut_loses_at_most_the_step_in_flight(tmp_path):
    """``record`` with a budget the first step uses up: every later step keeps its time only,
    committed about once a second, and a kill -9 of the command still loses none that ended."""
    script = write_script(tmp_path / "train.py", RECORDED)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "neuron_prof", "record", "-q", "-o", str(run_dir), "--max-bytes",
                             "1", "--", sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    ended = _kill_after(proc, AFTER_WINDOW, pid=child_pid(proc.pid))
    assert proc.returncode == 128 + signal.SIGKILL  # record exits as a shell does for its killed command
    done = _assert_keeps_every_ended_step(run_dir, ended)
    assert not done["active"].iloc[1:].any()  # detail stopped after the first step: its rows only


def _ring_slot(step: int, ts: int, dur: int) -> bytes:
    """A whole step-ring slot as the capture writes one (schema.STEP_RING_SLOT, its CRC-32 last)."""
    row = struct.pack("<i??2xqq", step, False, True, ts, dur)
    return row + struct.pack("<I4x", zlib.crc32(row))


@pytest.fixture(scope="module")
def killed_between_windows(tmp_path_factory):
    """An always-on run killed with SIGKILL a few short steps in."""
    tmp = tmp_path_factory.mktemp("killed")
    script = write_script(tmp / "loop.py", BETWEEN_WINDOWS)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp / "run"), "always-on"], stdout=subprocess.PIPE,
                            text=True)
    _kill_after(proc, 20)
    return tmp / "run"


def test_the_reader_takes_whole_ring_slots_past_the_commit_and_no_torn_one(killed_between_windows, tmp_path):
    """The step after the last one read, written into the ring as the capture writes it, is read
    (complete, not active); the same slot with one byte flipped (a kill in the middle of its
    stores) is absent, as is a whole slot after a gap."""
    shutil.copytree(killed_between_windows, tmp_path / "run")
    ring = tmp_path / "run" / "rank-00000" / STEP_RING
    before = neuron_prof.load(tmp_path / "run").steps
    last, end = int(before["step"].max()), int((before["ts"] + before["dur"]).max())
    data = bytearray(ring.read_bytes())
    slots = int.from_bytes(data[16:24], "little")

    def put(step: int, slot: bytes) -> None:
        at = 64 + (step % slots) * len(slot)
        data[at:at + len(slot)] = slot
        ring.write_bytes(bytes(data))

    put(last + 1, _ring_slot(last + 1, end, 1234))
    put(last + 3, _ring_slot(last + 3, end + 5000, 1234))  # after a gap: not a step that follows
    row = neuron_prof.load(tmp_path / "run").steps.iloc[-1]
    assert (int(row["step"]), int(row["ts"]), int(row["dur"]), bool(row["complete"]), bool(row["active"])) == \
        (last + 1, end, 1234, True, False)
    torn = bytearray(_ring_slot(last + 1, end, 1234))
    torn[9] ^= 0x40  # a byte of its ts
    put(last + 1, bytes(torn))
    after = neuron_prof.load(tmp_path / "run").steps
    assert int(after["step"].max()) == last and len(after) == len(before)


@pytest.mark.parametrize("damage", ["truncated", "wrong magic"])
def test_a_damaged_step_ring_is_one_line(killed_between_windows, tmp_path, damage):
    shutil.copytree(killed_between_windows, tmp_path / "run")
    ring = tmp_path / "run" / "rank-00000" / STEP_RING
    data = ring.read_bytes()
    ring.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\0" * 8 + data[8:])
    one_line_error(cli("report", tmp_path / "run"), str(ring), "delete the file")
