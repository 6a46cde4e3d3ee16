"""``neuron-prof port-check RUN --target neuron``, checked against reality: a CUDA-written training
job (tests/port_check_script.py) captured on the CPU is checked for the emulated neuron device,
and the same job captured on the device falls back to the CPU for exactly the ops predicted, at
exactly the lines predicted. Its CUDA-only lines are found by their marker comments, none of them
ran; comments, docstrings and other strings are no call sites. Each job and port-check run in a
process of their own: enabling the device renames PrivateUse1 for a whole process."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import neuron_prof
from conftest import cli, line_of, one_line_error, script_facts, write_script
from neuron_prof.analysis.port import call_sites
from neuron_prof.backends.op_support import name_path
from neuron_prof.reports.port import PortCheck, render_text

SCRIPT = Path(__file__).with_name("port_check_script.py")

SITES = {  # marker -> the kinds of call site on its line
    "PORT-TRITON": ["triton"],
    "PORT-FLASH": ["flash_attn"],
    "PORT-TRITON-JIT": ["triton"],
    "PORT-CPPEXT-IMPORT": ["cpp_extension"],
    "PORT-LOAD-INLINE": ["cpp_extension"],
    "PORT-CUDA": ["cuda_call", "torch_cuda"],
    "PORT-SYNC": ["torch_cuda", "torch_cuda"],
    "PORT-DEVICE": ["cuda_device", "torch_cuda"],
    "PORT-RAN": ["cuda_device"],
}
RAN = {"PORT-RAN"}  # the marked lines that ran ops on the CPU (the rest is guarded off or never called)
FALLBACK_LINES = {  # op the device leaves to the CPU -> marker of the user's line that runs it
    "aten::cumsum": "OP-CUMSUM",  # forward and backward (the backward's ops carry the forward's line)
    "aten::topk": "OP-TOPK",
    "aten::sort": "OP-SORT",
    "aten::linalg_vector_norm": "OP-NORM",  # clip_grad_norm_
    "aten::embedding_dense_backward": "OP-EMBEDDING",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The job captured on the CPU and on the emulated device; the same losses on both."""
    root = tmp_path_factory.mktemp("port")
    facts = {device: script_facts(SCRIPT, root / device, device) for device in ("cpu", "neuron")}
    assert facts["cpu"]["losses"] == facts["neuron"]["losses"]
    return {device: root / device for device in facts}


@pytest.fixture(scope="module")
def check(runs) -> dict:
    """``port-check --json`` of the CPU run, with the module that registers its custom op imported."""
    res = cli("port-check", runs["cpu"], "--target", "neuron", "--json", "--import", "port_check_script",
              env={"PYTHONPATH": str(SCRIPT.parent)})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.multiprocess
def test_the_predicted_fallbacks_are_the_devices(runs, check):
    device = neuron_prof.load(runs["neuron"]).fallbacks
    observed = set(device["op"].astype(str))
    assert set(FALLBACK_LINES) <= observed  # the job exercises what it means to
    assert {f["op"] for f in check["fallbacks"]} == observed
    shown = neuron_prof.load(runs["cpu"]).display_path(str(SCRIPT))
    for f in check["fallbacks"]:
        ran_at = set(device.loc[device["op"] == f["op"], "user_source"].astype(str))
        assert set(f["lines"]) == ran_at == {f"{shown}:{line_of(SCRIPT, FALLBACK_LINES[f['op']])}"}, f
        assert f["calls"] > 0 and f["self_ns"] > 0 and 0 < f["pct"] < 100
    assert check["mixed"] == [] and check["unknown"] == []
    # the custom op has a CPU kernel only: no kernel for the device, whose fallback runs it there
    assert check["no_kernel"] == [{"op": "porttest::scale", "path": "device"}]
    assert "porttest::scale" in set(neuron_prof.load(runs["neuron"]).ops["name"].astype(str))
    paths = {o["op"]: o["path"] for o in check["ops"]}
    assert paths["aten::linear"] == "composite" and paths["aten::view"] == "kernel"
    assert paths["aten::mm"] == "device" and paths["aten::random_"] == "host"


@pytest.mark.multiprocess
def test_compare_prices_the_fallbacks_on_the_target_and_rates_mfu(runs):
    """``compare CPU DEVICE --target neuron --peak-tflops ...``: the "falls back on the target" row
    is each run's share of op time in the ops port-check predicts to fall back (for the device run
    they are the ones that did), and MFU is each run's model TFLOP/s over its given peak."""
    res = cli("compare", runs["cpu"], runs["neuron"], "--target", "neuron", "--peak-tflops", "A=0.5",
              "--peak-tflops", "B=0.25", "--json", env={"PYTHONPATH": str(SCRIPT.parent)})
    assert res.returncode == 0, res.stderr
    rows = {r["item"]: r for r in json.loads(res.stdout)["rows"]}
    for key, run in (("a", runs["cpu"]), ("b", runs["neuron"])):
        checked = cli("port-check", run, "--target", "neuron", "--json", env={"PYTHONPATH": str(SCRIPT.parent)})
        predicted = sum(f["pct"] for f in json.loads(checked.stdout)["fallbacks"])
        assert rows["falls back on the target"][key] == pytest.approx(predicted) and predicted > 0
    tflops = rows["model TFLOP/s"]
    assert tflops["a"] > 0 and tflops["b"] > 0
    assert rows["MFU"]["a"] == pytest.approx(100 * tflops["a"] / 0.5)
    assert rows["MFU"]["b"] == pytest.approx(100 * tflops["b"] / 0.25)
    bad = cli("compare", runs["cpu"], runs["neuron"], "--peak-device", "B=tpu9")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "tpu9" in bad.stderr, bad.stderr


@pytest.mark.multiprocess
def test_the_report_adds_the_inventory_when_given_a_target(runs, check):
    """``report RUN --target neuron``: the run's report, then port-check's inventory (text), or under
    ``port_check`` (JSON), the same fallbacks and call sites as ``port-check`` itself."""
    doc = cli("report", runs["cpu"], "--target", "neuron", "--json")
    assert doc.returncode == 0, doc.stderr
    inventory = json.loads(doc.stdout)["port_check"]
    assert {f["op"] for f in inventory["fallbacks"]} == {f["op"] for f in check["fallbacks"]}
    assert inventory["call_sites"] == check["call_sites"]
    text = cli("report", runs["cpu"], "--target", "neuron")
    assert text.returncode == 0, text.stderr
    assert text.stdout.index("\nSteps ") < text.stdout.index("What the ops need on neuron")
    assert inventory["verdict"] in text.stdout


@pytest.mark.multiprocess
def test_each_marked_line_is_found_with_its_kind(check):
    sites = check["call_sites"]
    assert {s["file"] for s in sites} == {str(SCRIPT)}
    for marker, kinds in SITES.items():
        here = [s for s in sites if s["line"] == line_of(SCRIPT, marker)]
        assert sorted(s["kind"] for s in here) == sorted(kinds), (marker, here)
        assert {s["ran"] for s in here} == {marker in RAN}, (marker, here)
    assert len(sites) == sum(map(len, SITES.values()))  # nothing else: comments and strings are no sites
    assert [s["text"] for s in sites if s["line"] == line_of(SCRIPT, "PORT-SYNC")] == [
        "torch.cuda.is_available()", "torch.cuda.synchronize()"]
    assert check["files"] == [{"file": str(SCRIPT), "read": True, "note": ""}]
    n_fallbacks = len(check["fallbacks"])
    pct = sum(f["pct"] for f in check["fallbacks"])
    assert check["verdict"] == (f"{len(sites)} call sites to change, {n_fallbacks} ops fall back: "
                                f"{pct:.1f}% of op time, 1 custom op without a neuron kernel")


@pytest.mark.multiprocess
def test_the_text_names_the_lines_and_unregistered_ops(runs):
    res = cli("port-check", runs["cpu"], "--target", "neuron")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    verdict = text.splitlines()[1].strip()
    assert re.fullmatch(r"\d+ call sites to change, 5 ops fall back: [\d.]+% of op time, "
                        r"1 op not registered in this process", verdict), verdict
    shown = neuron_prof.load(runs["cpu"]).display_path(str(SCRIPT))
    where = f"{shown}:{line_of(SCRIPT, 'PORT-SYNC')}"
    assert re.search(rf"{re.escape(where)}\s+torch_cuda\s+no\s+torch\.cuda\.synchronize\(\)", text), text
    cumsum = re.escape(f"{shown}:{line_of(SCRIPT, 'OP-CUMSUM')}")
    assert re.search(rf"aten::cumsum\s+\d+\s+[\d.]+\s+[\d.]+\s+{cumsum}\n", text), text
    assert "not registered in this process (--import the module that registers them): porttest::scale" in text


def test_call_sites_follow_imports_and_skip_comments_and_strings():
    source = '''
import torch as th
from torch import cuda
import torch.utils.cpp_extension as ce
from flash_attn import flash_attn_func as attend
x = th.ones(3).cuda(non_blocking=True)  # th.cuda.synchronize() in a comment
th.cuda.synchronize()
rank_device = f"cuda:{3}"
if x.device.type == "cuda":
    cuda.empty_cache()
y = th.device(
    "cuda", 0)
ce.load("ext", [])
attend(x, x, x)
doc = """th.cuda.synchronize() and "cuda" in a string"""
cuda_like = "cudaMalloc"
'''
    found = call_sites(source)
    lines = source.splitlines()
    got = [(lines[r.line - 1].split()[0], r.kind, r.end_line - r.line) for r in found.itertuples()]
    assert got == [("from", "torch_cuda", 0), ("import", "cpp_extension", 0), ("from", "flash_attn", 0),
                   ("x", "cuda_call", 0), ("th.cuda.synchronize()", "torch_cuda", 0),
                   ("rank_device", "cuda_device", 0), ("if", "cuda_device", 0), ("cuda.empty_cache()", "torch_cuda", 0),
                   ("y", "cuda_device", 1),  # a statement over two lines: either may be the one a stack shows
                   ("ce.load(\"ext\",", "cpp_extension", 0), ("attend(x,", "flash_attn", 0)]
    with pytest.raises(SyntaxError):
        call_sites("def (:\n")


def capture(tmp_path: Path, body: str, collectors: list[str] | None = None) -> Path:
    """``body`` run under a capture into ``tmp_path/run``, by a script of its own in a process of
    its own: the run's stacks then name that script and what it runs, not this file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    given = f", collectors={collectors!r}" if collectors else ""
    job = write_script(tmp_path / "job.py", "import runpy, sys, torch, neuron_prof\n"
                       f"with neuron_prof.profile(sys.argv[1]{given}):\n" + textwrap.indent(body, "    "))
    done = subprocess.run([sys.executable, str(job), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "run"


@pytest.mark.multiprocess
def test_files_moved_or_changed_since_the_run_are_named(tmp_path):
    moved = write_script(tmp_path / "moved.py", "import torch\ntorch.ones(3).cumsum(0)\n")
    changed = write_script(tmp_path / "changed.py", "import torch\ntorch.ones(3).sort()\n")
    run = capture(tmp_path, f"runpy.run_path({str(moved)!r})\nrunpy.run_path({str(changed)!r})\n")
    moved.unlink()
    changed.write_text("import torch\ntorch.ones(3).cuda().sort()\n")
    res = cli("port-check", run, "--target", "neuron", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["files"] == [
        {"file": str(changed), "read": True, "note": "changed since the run: its lines may have moved"},
        {"file": str(tmp_path / "job.py"), "read": True, "note": ""},
        {"file": str(moved), "read": False, "note": f"{moved}: not found (moved or deleted since the run?)"}]
    assert [(s["file"], s["line"], s["kind"], s["ran"]) for s in out["call_sites"]] == [
        (str(changed), 2, "cuda_call", True)]  # read as it is now; its line 2 ran (another call, then)
    assert sorted(f["op"] for f in out["fallbacks"]) == ["aten::cumsum", "aten::sort"]


def test_an_imported_torch_profiler_trace_is_checked(tmp_path):
    """A fleet's existing traces are the baseline. torch.profiler names a file relative to the
    folder of the job's ``sys.path`` it is in (``job.py``), which the run's working folder (the
    importer's) does not hold: it is found from port-check's. The trace is made in a process of
    its own: torch.profiler reads ``sys.path`` once per process, at its first Python stack."""
    job = write_script(tmp_path / "job.py", """
        import torch
        x = torch.ones(3).cumsum(0)  # OP-CUMSUM
        if torch.cuda.is_available(): torch.cuda.synchronize()  # PORT-SYNC
        """)
    trace = tmp_path / "trace.json"
    profiler = write_script(tmp_path / "profile_job.py", f"""
        import runpy
        from torch.profiler import ProfilerActivity, profile, schedule
        with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=schedule(wait=1, warmup=1, active=1),
                     on_trace_ready=lambda p: p.export_chrome_trace({str(trace)!r})) as p:
            for _ in range(3):
                runpy.run_path({str(job)!r})
                p.step()
        """)
    made = subprocess.run([sys.executable, str(profiler)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    res = cli("port-check", tmp_path / "run", "--target", "neuron", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [f["read"] for f in out["files"] if f["file"] == job.name] == [True]
    sync = line_of(job, "PORT-SYNC")
    assert [(s["line"], s["kind"]) for s in out["call_sites"] if s["file"] == job.name] == [
        (sync, "torch_cuda"), (sync, "torch_cuda")]
    assert [f["op"] for f in out["fallbacks"]] == ["aten::cumsum"]


@pytest.mark.multiprocess
def test_a_clean_run_runs_as_is_and_bad_input_is_one_line(tmp_path):
    run = capture(tmp_path / "clean", "torch.ones(3).mul(2).sum()\n")
    res = cli("port-check", run, "--target", "neuron")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1] == "  runs as is"
    one_line_error(cli("port-check", run, "--target", "neuron", "--import", "no_such_module_here"),
                   "--import no_such_module_here", "PYTHONPATH")
    missing = tmp_path / "nope"
    one_line_error(cli("port-check", missing, "--target", "neuron"), str(missing), "neuron-prof record")
    one_line_error(cli("port-check", run, "--target", "tpu"), "--target", "'tpu'", "neuron")
    one_line_error(cli("port-check", run, "--json"), "--target")
    no_ops = capture(tmp_path / "memory", "torch.ones(3).sum()\n", collectors=["memory"])
    one_line_error(cli("port-check", no_ops, "--target", "neuron"), str(no_ops), "no op was captured", "eager")


def test_an_op_name_takes_the_path_of_the_overloads_that_reach_the_fallback():
    assert name_path({"aten::cumsum": "composite", "aten::cumsum.out": "cpu"}) == ("cpu", ["aten::cumsum.out"])
    assert name_path({"aten::_fused_adam_": "device", "aten::_fused_adam_.tensor_lr": "cpu"}) == (
        "mixed", ["aten::_fused_adam_.tensor_lr"])
    assert name_path({"aten::view": "kernel", "aten::view.dtype": "composite"}) == ("kernel", [])
    assert name_path({"aten::t": "composite"}) == ("composite", [])
    assert name_path({"aten::masked_select": "host", "aten::masked_select.out": "device"}) == ("device", [])


def test_the_text_shows_ops_that_fall_back_for_some_overloads():
    costs = pd.DataFrame({"op": ["aten::_fused_adam_"], "calls": [3], "self_ns": [2_500_000], "pct": [12.5],
                          "lines": [["train.py:40", "train.py:41", "train.py:42", "train.py:43"]]})
    empty = pd.DataFrame(columns=["file", "line", "end_line", "kind", "text", "ran"])
    check = PortCheck("runs/x", "neuron", "1 op falls back", empty,
                      pd.DataFrame({"file": ["/src/old.py"], "read": [False], "note": ["/src/old.py: not found"]}),
                      pd.DataFrame({"op": ["aten::_fused_adam_"], "path": ["mixed"], "cpu_overloads": [["x"]]}),
                      costs.iloc[:0], costs.assign(cpu_overloads=[["aten::_fused_adam_.tensor_lr"]]),
                      pd.DataFrame({"op": ["lib::k"], "path": ["cpu"]}), [])
    text = render_text(check)
    assert "  not read: /src/old.py: not found" in text
    assert re.search(r"aten::_fused_adam_\s+3\s+2\.500\s+12\.5\s+aten::_fused_adam_\.tensor_lr\n", text), text
    assert re.search(r"lib::k\s+falls back to the CPU\n", text), text
    assert "no op falls back to the CPU" in text
