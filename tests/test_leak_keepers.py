"""A leak named where the user can act: the line in the step loop its blocks were made from, and
what keeps them alive (collectors/_keepers.py), on real jobs written here: a validation forward run
with grad enabled whose loss goes to a global ``history`` list, a trainer that keeps its outputs in
``self.cache``, a loop that keeps only ``loss.item()``, and a run whose capture never ended (no walk:
the keeper is "not recorded", as for a run recorded before walks)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, line_of, viewer_page, write_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

BATCH, IN, HIDDEN = 256, 256, 1024  # float32: a (BATCH, HIDDEN) activation is 1 MiB
STEPS = 8

MODEL = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(%(IN)d, %(HIDDEN)d)
        self.fc2 = torch.nn.Linear(%(HIDDEN)d, %(IN)d)

    def forward(self, x):
        h = torch.relu(self.fc1(x))  # RELU-LINE
        return self.fc2(h)
''' % {"IN": IN, "HIDDEN": HIDDEN}

HEAD = '''
import os, signal, sys
import torch
import neuron_prof
from model import Net

torch.manual_seed(0)
torch.set_num_threads(1)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
lossf = torch.nn.MSELoss()
'''

VALIDATION = HEAD + '''
history = []
with neuron_prof.profile(sys.argv[1], collectors=["eager", "memory"]) as prof:
    for step in range(%(STEPS)d):
        x, y = torch.randn(%(BATCH)d, %(IN)d), torch.randn(%(BATCH)d, %(IN)d)
        loss = lossf(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        xv, yv = torch.randn(%(BATCH)d, %(IN)d), torch.randn(%(BATCH)d, %(IN)d)
        val_loss = lossf(model(xv), yv)  # VAL-LINE
        history.append(val_loss)
        prof.step()
    if len(sys.argv) > 2:  # killed: the capture never ends
        os.kill(os.getpid(), signal.SIGKILL)
''' % {"STEPS": STEPS, "BATCH": BATCH, "IN": IN}

TRAINER = HEAD + '''

class Trainer:
    def __init__(self):
        self.cache = {}

    def train_step(self, step, x, y):
        out = model(x)
        loss = lossf(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        self.cache[step] = out


trainer = Trainer()
with neuron_prof.profile(sys.argv[1], collectors=["eager", "memory"]) as prof:
    for step in range(%(STEPS)d):
        trainer.train_step(step, torch.randn(%(BATCH)d, %(IN)d), torch.randn(%(BATCH)d, %(IN)d))  # STEP-LINE
        prof.step()
''' % {"STEPS": STEPS, "BATCH": BATCH, "IN": IN}

ITEM = HEAD + '''
losses = []
with neuron_prof.profile(sys.argv[1], collectors=["eager", "memory"]) as prof:
    for step in range(%(STEPS)d):
        loss = lossf(model(torch.randn(%(BATCH)d, %(IN)d)), torch.randn(%(BATCH)d, %(IN)d))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        prof.step()
''' % {"STEPS": STEPS, "BATCH": BATCH, "IN": IN}


def record(tmp_path: Path, body: str, *args: str, killed: bool = False) -> Path:
    """Runs ``body`` as ``train.py`` beside ``model.py`` in ``tmp_path``; the run's folder."""
    write_script(tmp_path / "model.py", MODEL)
    write_script(tmp_path / "train.py", body)
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "train.py", str(run), *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240)
    assert (p.returncode == -9) if killed else (p.returncode == 0), p.stderr[-3000:]
    return run


def headline(run: Path) -> str:
    report = cli("report", run)
    assert report.returncode == 0, report.stderr
    return next(line for line in report.stdout.splitlines() if "memory grows" in line)


def json_leaks(run: Path) -> list[dict]:
    out = cli("report", run, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["memory"]["leaks"]


def test_validation_with_grad_names_the_loops_line_and_history(tmp_path, monkeypatch):
    run = record(tmp_path, VALIDATION)
    val = f"train.py:{line_of(tmp_path / 'train.py', 'VAL-LINE')}"
    relu = f"model.py:{line_of(tmp_path / 'model.py', 'RELU-LINE')}"
    text = headline(run)
    # the user's line in the loop first, the model's line after it, and the list that keeps it
    assert f"from {val} via {relu} aten::relu" in text, text
    assert "kept alive by list history (global in train.py)" in text, text
    leaks = json_leaks(run)
    # every kept val_loss keeps its graph: the relu output (1 MiB), the fc2 output, the mse_loss
    # result, and the validation inputs xv and yv (each BATCH x IN), all float32
    assert leaks[0]["growth_per_step"] == 4 * (BATCH * HIDDEN + 4 * BATCH * IN) == 2 * 2**20
    assert sum(x["bytes_per_step"] for x in leaks) == leaks[0]["growth_per_step"]
    assert leaks[0]["op"] == "aten::relu" and leaks[0]["bytes_per_step"] == 4 * BATCH * HIDDEN
    assert {x["keeper"] for x in leaks} == {"list history (global in train.py)"}
    assert leaks[0]["keeper_via"] == "autograd graph" and leaks[0]["made_at"] == val
    at = viewer_page(monkeypatch, run, "memory", "Memory")  # the Memory page says the same
    said = [m.value.replace("\\", "") for m in at.markdown if "Made from" in m.value]
    assert said and f"Made from** {val} via {relu}" in said[0] and "list history (global in train.py)" in said[0]


def test_trainer_cache_names_self_cache(tmp_path):
    run = record(tmp_path, TRAINER)
    text = headline(run)
    assert "kept alive by dict self.cache (Trainer attribute)" in text, text
    step_line = f"train.py:{line_of(tmp_path / 'train.py', 'STEP-LINE')}"
    (leak,) = [x for x in json_leaks(run) if x["op"] == "aten::linear"]
    assert leak["bytes_per_step"] == 4 * BATCH * IN and leak["keeper_via"] == "tensor"
    assert leak["made_at"] == step_line  # the outermost frame in the file that runs the loop


def test_keeping_only_item_names_no_leak(tmp_path):
    run = record(tmp_path, ITEM)
    report = cli("report", run)
    assert report.returncode == 0 and "memory grows" not in report.stdout and "no leak" in report.stdout
    assert json_leaks(run) == []


def test_run_without_a_walk_reads_as_before_with_keeper_not_recorded(tmp_path):
    run = record(tmp_path, VALIDATION, "kill", killed=True)
    relu = f"model.py:{line_of(tmp_path / 'model.py', 'RELU-LINE')}"
    text = headline(run)
    assert f"from {relu} (aten::relu)" in text and "keeper not recorded" in text, text
    leaks = json_leaks(run)
    assert leaks and {(x["keeper"], x["keeper_note"], x["made_at"]) for x in leaks} == {("", "not recorded", "")}
