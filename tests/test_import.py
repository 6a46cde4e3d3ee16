"""`neuron-prof import`: a real torch.profiler trace of a known loop as a run, checked against
torch.profiler's own key_averages() of the same capture, and bad traces refused in one line."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

import neuron_prof
from conftest import check_trace, cli, on_terminal
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.compare import compare_runs, to_json

HERE = Path(__file__)


def _loop(steps: int, on_step) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        on_step()


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A torch.profiler capture (wait 1, warm-up 1, active 3) exported as JSON and as gzip, and its
    key_averages()."""
    root = tmp_path_factory.mktemp("kineto")
    got = {}

    def ready(p) -> None:
        p.export_chrome_trace(str(root / "trace.json"))
        python = {e.key for e in p.events() if e.is_python_function}  # with_stack's Python calls
        got["averages"] = {e.key: (e.count, e.self_cpu_memory_usage) for e in p.key_averages() if e.key not in python}

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True, profile_memory=True,
                 with_modules=True, schedule=schedule(wait=1, warmup=1, active=3), on_trace_ready=ready) as p:
        _loop(5, p.step)
    (root / "trace.json.gz").write_bytes(gzip.compress((root / "trace.json").read_bytes()))
    return root, got["averages"]


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_ops_steps_and_memory_are_torch_profilers_own(traced, tmp_path, name):
    root, averages = traced
    done = cli("import", root / name, "-o", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    run = neuron_prof.load(tmp_path / "run")
    ops = run.ops
    # key_averages() merges an op into its parent of
    # the same name (aten::mean calling aten::mean.dim): the trace, like neuron_prof, keeps both
    skip = {k for k in averages if k.startswith("ProfilerStep")}
    want = {k: count for k, (count, _) in averages.items() if k not in skip}
    names = ops["name"].astype(str).to_numpy()
    parent = analyze(run).op_parent
    nested_twin = (parent >= 0) & (names[np.maximum(parent, 0)] == names)
    assert Counter(names[~nested_twin]) == want
    assert f"{len(ops):,} ops, 3 steps" in done.stdout
    # ProfilerStep#2..#4: the active steps, numbered as torch numbers its iterations
    assert run.steps["step"].tolist() == [2, 3, 4] and run.steps["complete"].all()
    # every allocator byte torch.profiler charged to an op is charged to the same op here
    mem = run.memory_events
    per_op = mem[mem["op"].astype(str) != ""].groupby(mem["op"].astype(str))["bytes"].sum()
    assert {k: v for k, v in per_op.items() if v} == {k: m for k, (_, m) in averages.items() if m and k not in skip}
    # with_stack: the Python calls open around the op (torch.profiler records calls, not the line
    # executing in them), torch's own left out: the innermost is the training loop's function
    addmm = ops[ops["name"].astype(str) == "aten::addmm"]
    for stack in addmm["stack"]:
        file, func, _ = run.stack(0, int(stack))[0]
        assert (Path(file).name, func) == ("test_import.py", "_loop")
    # with_modules: the module path as torch.profiler names modules
    assert set(addmm["module"].astype(str)) == {"Sequential_0.Linear_0", "Sequential_0.Linear_1"}
    assert set(addmm["shapes"].astype(str)) == {"[[32], [8, 16], [16, 32]]", "[[1], [8, 32], [32, 1]]"}
    assert (ops[ops["name"].astype(str).str.contains("Backward")]["bwd"]).all()
    # every reader opens it: its Perfetto trace passes the strict reader
    assert cli("export", tmp_path / "run", "-o", tmp_path / "t.pftrace").returncode == 0
    assert check_trace(tmp_path / "t.pftrace").stats["slices"] >= len(ops)


def test_an_imported_trace_compares_with_a_neuron_prof_run(traced, tmp_path):
    root, _ = traced
    assert cli("import", root / "trace.json", "-o", tmp_path / "imported").returncode == 0
    with neuron_prof.profile(tmp_path / "captured") as prof:
        _loop(5, prof.step)
    result = to_json(compare_runs(neuron_prof.load(tmp_path / "imported"), neuron_prof.load(tmp_path / "captured")))
    rows = {r["item"]: r for r in result["rows"]}
    # the imported run's steady steps are ProfilerStep#3 and #4 (#2 is its first: warm-up)
    kinds = analyze(neuron_prof.load(tmp_path / "imported")).step_kinds
    assert kinds[kinds["steady"]]["step"].tolist() == [3, 4]
    assert rows["step time (median)"]["a"] == pytest.approx(kinds[kinds["steady"]]["dur"].median() / 1e6)
    assert rows["step time (median)"]["b"] > 0
    # a torch.profiler trace has no loss: said, not compared
    assert result["loss"]["common_steps"] == 0 and rows["loss: max relative difference"]["verdict"] == "n/a"
    assert any("loss agreement not compared" in n for n in result["notes"])


@pytest.mark.parametrize("content, says", [
    (b"not json at all", "not JSON"),
    (gzip.compress(b'{"traceEvents": []}')[:-6], "not a readable gzip file"),
    (json.dumps({"events": []}).encode(), "without a traceEvents list"),
])
def test_traces_it_cannot_read_are_one_line_errors(tmp_path, content, says):
    bad = tmp_path / "trace.json"
    bad.write_bytes(content)
    done = cli("import", bad, "-o", tmp_path / "run")
    assert done.returncode == 2 and says in done.stderr and str(bad) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_import_never_writes_into_an_existing_run(traced, tmp_path):
    root, _ = traced
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    done = cli("import", root / "trace.json", "-o", tmp_path / "run")
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"
    missing = cli("import", tmp_path / "nowhere.json", "-o", tmp_path / "other")
    assert missing.returncode == 2 and "nowhere.json" in missing.stderr and "Traceback" not in missing.stderr


def test_import_and_export_show_progress_on_a_terminal(traced, tmp_path):
    root, _ = traced
    done, shown = on_terminal("import", root / "trace.json", "-o", tmp_path / "run")
    assert done.returncode == 0 and "import:" in shown and "nesting ops" in shown and "writing" in shown
    done, shown = on_terminal("export", tmp_path / "run", "-o", tmp_path / "t.pftrace")
    assert done.returncode == 0 and "export:" in shown and "rank 0" in shown and "flows" in shown
    check_trace(tmp_path / "t.pftrace")
    piped = cli("import", root / "trace.json", "-o", tmp_path / "again", env={"CI": ""})
    assert piped.returncode == 0 and piped.stderr == ""


def test_a_trace_of_the_device_alone_reports_its_kernels(tmp_path):
    """A trace with device activity and the runtime calls that launched it but no CPU op (a
    device-only torch.profiler trace): the kernels are the run's and every reader works; no host
    op is there to name them (it raised an IndexError before)."""
    events = []
    for i in range(3):
        t = 1000.0 + 100 * i
        events += [{"ph": "X", "cat": "privateuse1_runtime", "name": "launchKernel", "pid": 1, "tid": 1, "ts": t,
                    "dur": 5.0, "args": {"correlation": i + 1}},
                   {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": t + 10, "dur": 20.0,
                    "args": {"device": 0, "stream": 7, "correlation": i + 1}}]
    trace = tmp_path / "device.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    run = neuron_prof.load(tmp_path / "run")
    assert run.ops.empty and list(run.device_kernels["name"].astype(str)) == ["k0", "k1", "k2"]
    assert set(run.device_enqueues["host_op"].astype(str)) == {""}
    for args in (("report", tmp_path / "run"), ("report", tmp_path / "run", "--json"),
                 ("export", tmp_path / "run", "-o", tmp_path / "t.perfetto-trace")):
        done = cli(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    check_trace(tmp_path / "t.perfetto-trace")
