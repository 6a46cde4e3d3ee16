"""No device words on a run with no device, and no compile time "inside steps" without a step.

A CPU-only loop (AdamW, a ``.item()`` and a ``torch.equal`` each step) has nothing that waits for
a device: the report has no sync-point finding, and its Sync points section says the run has no
device and lists the reads as a porting note, by line and per step; ``port-check --target neuron``
lists the same reads as what would wait there. A torch.compile job that never calls prof.step()
gets no sync finding either, and its compile time is not said to be inside steps. Device runs keep
their sync findings: tests/test_sync_points.py, tests/test_shipped_backend.py and
tests/test_neuron_device.py check them, unchanged."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, line_of, write_script

STEPS = 6
LOOP = f"""
import sys
import torch
import neuron_prof

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ref = torch.zeros(4)
with neuron_prof.profile(sys.argv[1]) as prof:
    for i in range({STEPS}):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() > 1e9:  # ITEM-HERE
            print("diverged")
        if not torch.equal(ref, torch.zeros(4)):  # EQUAL-HERE
            print("changed")
        prof.step()
"""

COMPILED = """
import sys
import torch
import neuron_prof

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)),
                      backend="eager")
with neuron_prof.profile(sys.argv[1]) as prof:  # no prof.step(): no step completes
    for i in range(3):
        out = model(torch.randn(8, 16)).sum()
        print(out.item())  # ITEM-HERE
"""


def _recorded(tmp_path: Path, name: str, body: str) -> tuple[Path, Path]:
    """The script written and run under neuron_prof: (script, run directory)."""
    script = write_script(tmp_path / name, body)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(run_dir)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return script, run_dir


def _findings(text: str) -> list[str]:
    """The report's Findings lines."""
    _, _, rest = text.partition("Findings\n")
    return rest.split("\n\n", 1)[0].splitlines() if rest else []


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory) -> tuple[Path, Path]:
    return _recorded(tmp_path_factory.mktemp("cpu_loop"), "train_cpu.py", LOOP)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_cpu_loop_gets_a_porting_note_not_a_sync_finding(loop_run):
    script, run_dir = loop_run
    lines = {m: f"train_cpu.py:{line_of(script, m)}" for m in ("ITEM-HERE", "EQUAL-HERE")}
    text = cli("report", run_dir).stdout
    found = _findings(text)
    assert found, text[:2000]  # the report has findings, none of them about reads or waiting
    assert not [f for f in found if "sync" in f or "reads of" in f or "waits for the device" in f], found
    section = text.split("\nSync points (", 1)[1].split("\n\n", 1)[0]
    assert section.startswith("none: the run has no device; ")
    assert "would wait on an accelerator: a porting note" in section.splitlines()[0]
    assert "the host waits for the device" not in section and "stall" not in section
    for line in lines.values():
        row = next(r for r in section.splitlines() if r.lstrip().startswith(line + " "))
        assert row.split()[2:4] == [str(STEPS), "1.0"], row  # count, per steady step

    rep = cli("report", run_dir, "--json")
    assert rep.returncode == 0, rep.stderr
    sync = json.loads(rep.stdout)["sync_points"]
    assert sync["on_device"] is False
    rows = {r["source"]: r for r in sync["by_source"]}
    assert (rows[lines["ITEM-HERE"]]["name"], rows[lines["EQUAL-HERE"]]["name"]) == (
        "aten::_local_scalar_dense", "aten::equal")
    for line in lines.values():  # every step reads once; the first step is a warm-up step
        assert (rows[line]["count"], rows[line]["in_steps"], rows[line]["per_step"]) == (STEPS, STEPS - 1, 1.0)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)  # a fresh clone builds the emulated device's extension first (1-2 min)
def test_port_check_lists_the_reads_that_would_wait_on_the_target(loop_run):
    script, run_dir = loop_run
    done = cli("port-check", run_dir, "--target", "neuron", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    reads = {r["source"]: r for r in doc["host_reads"]}
    item = f"train_cpu.py:{line_of(script, 'ITEM-HERE')}"
    equal = f"train_cpu.py:{line_of(script, 'EQUAL-HERE')}"
    assert set(reads) == {item, equal}
    assert [(reads[x]["count"], reads[x]["per_step"]) for x in (item, equal)] == [(STEPS, 1.0)] * 2
    assert doc["read_basis"] == "steady" and doc["verdict"] == "runs as is"
    text = cli("port-check", run_dir, "--target", "neuron").stdout
    waits = text.split("\nWhat would wait on neuron (", 1)[1]
    assert waits.startswith(f"{2 * STEPS} host reads of tensor values")
    assert any(r.lstrip().startswith(item + " ") and r.split()[2:4] == [str(STEPS), "1.0"]
               for r in waits.splitlines()), waits


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_compiled_job_without_steps_gets_no_sync_finding_nor_compile_time_inside_steps(tmp_path):
    script, run_dir = _recorded(tmp_path, "compiled_cpu.py", COMPILED)
    doc = json.loads(cli("report", run_dir, "--json").stdout)
    assert doc["steps"] == [] and doc["compile"]["frames_compiled"] >= 1
    assert doc["compile"]["compile_in_steps_ms"] == 0.0  # the open tail of the capture is no step
    item = f"compiled_cpu.py:{line_of(script, 'ITEM-HERE')}"
    assert doc["sync_points"]["on_device"] is False
    assert [(r["source"], r["count"], r["per_step"]) for r in doc["sync_points"]["by_source"]] == [(item, 3, None)]

    text = cli("report", run_dir).stdout
    found = _findings(text)
    compiled = [f for f in found if "torch.compile compiled" in f]
    assert len(compiled) == 1 and compiled[0].endswith("; no step completed"), found
    assert not [f for f in found if "sync" in f or "reads of" in f], found
    assert "inside steps" not in text and "warm-up steps, left out" not in text
    header = next(line for line in text.splitlines() if line.startswith("Compile ("))
    assert "no step completed" in header, header
