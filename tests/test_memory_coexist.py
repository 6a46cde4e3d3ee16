"""The job's own torch.profiler started inside a capture: it takes the allocator reports while it
runs (torch keeps one profiler state per thread), so memory capture cannot see those steps. The
run says so: a ``memory (memory_steps)`` failure naming exactly those steps, no live figure at
their boundaries, no leak verdict over them, in the Memory section, Findings and ``--json``; and a
real leak is still found, with its exact bytes, over the steps that were seen."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import neuron_prof
from conftest import cli, line_of, script_facts, write_script
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak as ml
from neuron_prof.reports.findings import findings
from neuron_prof.reports.summary.build import summarize

pytestmark = pytest.mark.timeout(180)

STEPS = 16
HERE = Path(__file__)


def train(run_dir: Path, leak: bool, user_steps: range, profile_memory: bool = True) -> torch.profiler.profile:
    """``STEPS`` steps of examples/memory_leak.py's model under a capture; the job's own
    torch.profiler runs from the start of the first of ``user_steps`` to the end of its last (to
    the end of capture if that is the last step). Returns the job's profiler."""
    model, opt = ml.model_and_optimizer()
    kept = []
    user = torch.profiler.profile(profile_memory=profile_memory)
    with neuron_prof.profile(run_dir) as prof:
        for step in range(STEPS):
            if step == user_steps.start:
                user.__enter__()
            loss = torch.nn.functional.mse_loss(model(torch.randn(ml.BATCH, ml.IN)), torch.randn(ml.BATCH, ml.OUT))
            opt.zero_grad()
            loss.backward()
            opt.step()
            x_val = torch.randn(ml.BATCH, ml.IN)  # VAL-INPUT-LINE
            if leak:
                kept.append(model(x_val).pow(2).mean())  # LEAK-LINE
            else:
                kept.append(loss.item())
            if step == user_steps[-1] and step < STEPS - 1:
                user.__exit__(None, None, None)
            prof.step()
    if user_steps[-1] == STEPS - 1:
        user.__exit__(None, None, None)
    return user


def memory_text(report: str) -> str:
    return report.split("\nMemory (", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("profile_memory", [True, False])
def test_the_jobs_profiler_inside_a_capture_is_a_named_memory_gap(tmp_path, profile_memory):
    user = train(tmp_path / "run", leak=False, user_steps=range(4, 8), profile_memory=profile_memory)
    # the job's profiler worked, with the allocator reports while it ran
    assert any(e.name == "aten::addmm" for e in user.events())
    assert any(e.cpu_memory_usage > 0 for e in user.events()) == profile_memory

    run = neuron_prof.load(tmp_path / "run")
    (failure,) = run.failures.itertuples()
    assert failure.collector == "memory (memory_steps)"
    assert "the job's own torch.profiler held the allocator's reports in steps 4-7:" in failure.message
    # no live figure at the boundaries of the steps it held the reports in, every other one there
    assert sorted(run.memory_steps["step"]) == [s for s in range(STEPS) if s not in range(4, 8)]
    assert int(run.health["events_dropped"].iloc[0]) >= 4

    summary = summarize(run)
    (cpu,) = summary.memory.devices
    # boundaries 0-3 and 8-15: 3 + 7 differences of consecutive steps, less the run's first
    assert cpu.unseen_steps == [4, 5, 6, 7] and cpu.checked == 3 + 7 - 1
    assert analyze(run).memory_leaks.empty
    texts = [f.text for f in findings(summary) if f.severity == "high"]
    assert any("memory (memory_steps)" in t and "steps 4-7" in t for t in texts), texts

    rep = cli("report", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    memory = memory_text(rep.stdout)
    assert "rank 0 cpu: no live bytes at the boundaries of steps 4-7" in memory
    assert "no leak: live memory does not grow step over step" not in memory
    assert "no leak over the step boundaries seen" in memory
    findings_block = rep.stdout.split("\nFindings\n", 1)[1].split("\n\n", 1)[0]
    assert "held the allocator's reports in steps 4-7" in findings_block
    assert "held the allocator's reports in steps 4-7" in rep.stdout.split("\nCapture health\n", 1)[1]

    js = cli("report", tmp_path / "run", "--json")
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert [d["unseen_steps"] for d in doc["memory"]["devices"]] == [[4, 5, 6, 7]]
    assert any("steps 4-7" in f["message"] for f in doc["health"]["failures"])


def test_a_leak_is_found_over_the_steps_that_were_seen(tmp_path):
    train(tmp_path / "run", leak=True, user_steps=range(4, 8))
    run = neuron_prof.load(tmp_path / "run")
    leaks = analyze(run).memory_leaks
    assert set(leaks["device"]) == {"cpu"}
    assert leaks["growth_per_step"].iloc[0] == ml.leaked_bytes_per_step()
    assert all(s.split(":")[0].endswith(HERE.name) for s in leaks["source"])
    by_line = leaks.groupby(leaks["source"].str.rsplit(":", n=1).str[-1].astype(int))["bytes_per_step"].sum()
    assert by_line[line_of(HERE, "LEAK-LINE")] == 4 * (ml.BATCH * ml.HIDDEN + ml.BATCH * ml.OUT + 1)
    assert by_line[line_of(HERE, "VAL-INPUT-LINE")] == 4 * ml.BATCH * ml.IN
    # judged over the seen steps only: candidates 0-3 and 8-14 (before the last), none of 4-7
    assert set(leaks["steps_checked"]) == {11} and set(leaks["steps_seen"]) == {11}
    rep = cli("report", tmp_path / "run")
    assert "!! LEAK on rank 0 cpu: +24.1 KiB per step" in memory_text(rep.stdout)


def test_a_profiler_that_outlasts_the_capture_leaves_leaks_not_judged(tmp_path):
    train(tmp_path / "run", leak=True, user_steps=range(2, STEPS))
    run = neuron_prof.load(tmp_path / "run")
    (failure,) = run.failures.itertuples()
    assert f"in steps 2-{STEPS - 1} (until capture ended):" in failure.message
    assert sorted(run.memory_steps["step"]) == [0, 1]
    assert analyze(run).memory_leaks.empty  # two boundaries seen: one difference, nothing to judge
    memory = memory_text(cli("report", tmp_path / "run").stdout)
    assert f"no live bytes at the boundaries of steps 2-{STEPS - 1}" in memory
    assert "leaks not judged" in memory and "no leak" not in memory


NEURON_SCRIPT = """
    import json, sys
    import torch
    import neuron_prof
    from neuron_prof.analysis.run_analysis import analyze
    from neuron_prof.testing import neuron

    neuron.enable()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    user = torch.profiler.profile(profile_memory=True)
    with neuron_prof.profile(sys.argv[1]) as prof:
        for step in range(12):
            if step == 3:
                user.__enter__()
            loss = model(torch.randn(8, 64, device="neuron")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            x_val = torch.randn(8, 64, device="neuron")  # VAL-LINE
            kept.append(model(x_val).sum())  # the graph keeps x_val for the weight's gradient
            if step == 5:
                user.__exit__(None, None, None)
            prof.step()
    run = neuron_prof.load(sys.argv[1])
    ms = run.memory_steps
    leaks = analyze(run).memory_leaks
    print(json.dumps({
        "failures": run.failures[["collector", "message"]].values.tolist(),
        "steps": {d: sorted(g["step"].tolist()) for d, g in ms.groupby(ms["device"].astype(str))},
        "leaks": leaks[["device", "growth_per_step", "source", "bytes_per_step", "steps_checked"]].values.tolist(),
    }))
"""


@pytest.mark.multiprocess  # the emulated device renames PrivateUse1 for its whole process
@pytest.mark.timeout(600)  # a fresh clone builds the emulated device first
def test_the_emulated_device_has_the_same_gap_and_its_leak_is_still_found(tmp_path):
    script = write_script(tmp_path / "neuron_coexist.py", NEURON_SCRIPT)
    facts = script_facts(script, tmp_path / "run")
    ((collector, message),) = facts["failures"]
    assert collector == "memory (memory_steps)" and "reports in steps 3-5:" in message
    seen = [s for s in range(12) if s not in (3, 4, 5)]
    assert facts["steps"] == {"cpu": seen, "neuron:0": seen}
    devices = {row[0] for row in facts["leaks"]}
    assert devices == {"neuron:0"}
    growth = {row[1] for row in facts["leaks"]}
    assert growth == {4 * 8 * 64 + 4}  # x_val and the kept scalar, every step
    val = f"neuron_coexist.py:{line_of(script, 'VAL-LINE')}"
    assert [row[3] for row in facts["leaks"] if row[2].endswith(val)] == [4 * 8 * 64]
    assert {row[4] for row in facts["leaks"]} == {8}  # steps 0-2 and 6-10: none of 3-5
