"""A PrivateUse1 backend as it ships (issue 43): kernels only to Kineto, no runtime calls, no
correlation ids, ops left to PyTorch's boxed CPU fallback. The emulated `neuron` device in those
modes (``tests/shipped_backend_script.py``, a process each) is held against the dispatcher's own
word on which ops have no kernel there, the bytes PyTorch's fallback copies, and the order of the
recorded timestamps."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import check_trace, cli, line_of, script_facts

from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.store.run import load

SCRIPT = Path(__file__).with_name("shipped_backend_script.py")
STEPS = 4  # the script's captured steps

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("shipped") / "run"
    return run, script_facts(SCRIPT, "fallbacks", run)


@pytest.fixture(scope="module")
def synchronous_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("synchronous") / "run"
    script_facts(SCRIPT, "synchronous", run)
    return run


def test_fallbacks_are_the_ops_the_dispatcher_has_no_kernel_for(fallback_run):
    """Nothing but kernels reached the profiler, yet the fallbacks are named: exactly the ops
    that ran with the device's tensors and that the dispatcher says have no kernel there, each
    once per call, at its line, with the bytes PyTorch's fallback copied each way; the losses are
    bitwise those without capture."""
    run_dir, facts = fallback_run
    assert facts["captured"] == facts["plain"]
    assert set(facts["no_kernel"]) == {"aten::mse_loss", "aten::cumsum"}, facts["seen"]
    run = load(run_dir)
    assert run.fallbacks.empty and run.device_enqueues.empty  # the backend reported neither
    falls = analyze(run).cpu_fallbacks.table
    assert set(falls["op"].astype(str)) == set(facts["no_kernel"])
    line = {"aten::mse_loss": line_of(SCRIPT, "left to the CPU by enable()"), "aten::cumsum": line_of(SCRIPT, "(neuron.UNIMPLEMENTED)")}
    for op, rows in falls.groupby(falls["op"].astype(str)):
        assert len(rows) == STEPS, op  # once a step, not once per nested overload
        assert {s.rsplit("/", 1)[-1] for s in rows["user_source"].astype(str)} == {f"{SCRIPT.name}:{line[op]}"}, op
        assert set(rows["device"].astype(str)) == {"neuron:0"}
    f32 = 4
    cumsum = falls[falls["op"].astype(str) == "aten::cumsum"]
    # cumsum.out's fallback copies its input (16x32) and its out= tensor (16x32) to the host, and out= back
    assert (cumsum["bytes_to_host"] == 2 * 16 * 32 * f32).all() and (cumsum["bytes_from_host"] == 16 * 32 * f32).all()
    mse = falls[falls["op"].astype(str) == "aten::mse_loss"]
    assert (mse["bytes_to_host"] >= 2 * 16 * 8 * f32).all()  # input and target (and the 0-dim out=)


def test_fallback_copies_are_no_sync_points(fallback_run):
    """The fallbacks' copies to the host are theirs: the only sync points are the script's
    ``.item()`` reads, and the findings name the fallbacks first, not a sync."""
    run_dir, _ = fallback_run
    doc = json.loads(cli("report", run_dir, "--json").stdout)
    sites = doc["sync_points"]["by_source"]
    assert [(s["source"].rsplit(":", 1)[1], s["name"]) for s in sites] == \
        [(str(line_of(SCRIPT, "# the read of a device value")), "aten::_local_scalar_dense")]
    assert doc["sync_points"]["events"] == STEPS  # one read a captured step
    device = doc["device"]
    assert {f["op"] for f in device["fallbacks"]} == {"aten::mse_loss", "aten::cumsum"}
    cov = device["coverage"][0]
    assert cov["device"] == "neuron:0" and cov["fallback_ops"] == 2 * STEPS and cov["native_ops"] > 0
    text = cli("report", run_dir).stdout
    findings = text.split("\n\n")[1]
    first = [line for line in findings.splitlines() if line.startswith("  !")][0]
    assert "fell back from neuron:0 to the CPU" in first and ("most: aten::cumsum" in first or "most: aten::mse_loss" in first)
    assert "_to_copy" not in text.split("Sync points")[1].split("\n\n")[0]


def test_kernels_join_their_ops_by_thread_and_time(synchronous_run):
    """With no launch reported, each kernel is joined to the op open at its start: on a backend
    that runs each op's kernel before the op returns, the op that launched it. Every kernel lies
    inside its op's recorded time, and each matmul kernel's op is that matmul."""
    run = load(synchronous_run)
    assert run.device_enqueues.empty and run.kernel_enqueues.empty
    corr = analyze(run).device_correlation
    kernels = run.device_kernels
    assert len(corr) == len(kernels) > 0
    assert (corr["op_index"] >= 0).all()
    ops = run.ops.iloc[corr["op_index"].to_numpy()]
    start, end = ops["ts"].to_numpy(), ops["ts"].to_numpy() + ops["dur"].to_numpy()
    assert ((start <= corr["kernel_ts"].to_numpy()) & (corr["kernel_ts"].to_numpy() <= end)).all()
    assert all("neuron:0" in d for d in ops["devices"].astype(str))
    mm = corr["kernel_name"].astype(str).isin(["mm", "addmm"]).to_numpy()
    assert mm.sum() >= 5 * STEPS  # forward addmm x2, backward mm x3 per step
    assert set(ops["name"].astype(str).to_numpy()[mm]) <= {"aten::mm", "aten::addmm"}
    assert (corr["source"].astype(str) != "").all()


def test_reads_of_ready_values_are_not_stalls(synchronous_run):
    """Every value the host reads on a synchronous backend is ready: the device's own timeline
    shows no kernel running at any read, so no read is a stall and no sync finding has a "!"."""
    doc = json.loads(cli("report", synchronous_run, "--json").stdout)
    sync = doc["sync_points"]
    assert sync["events"] == STEPS and sync["stalls"] == 0
    run = load(synchronous_run)
    kernels = run.device_kernels
    reads = run.ops[run.ops["name"].astype(str) == "aten::_local_scalar_dense"]
    # causal order, no duration: with a queue of one every op returned after its kernel ended, so no
    # kernel's recorded span may contain a read's recorded start
    for t in reads["ts"]:
        assert not ((kernels["ts"] < t) & (kernels["ts"] + kernels["dur"] > t)).any()
    findings = cli("report", synchronous_run).stdout.split("\n\n")[1]
    assert not [line for line in findings.splitlines() if line.startswith("  !") and "sync" in line]
    assert "reads of device values, none waiting for the device" in findings


def test_fallbacks_in_the_trace_and_compare(fallback_run, synchronous_run, tmp_path):
    """The fallbacks the dispatcher named are slices of the Perfetto trace (which the strict
    reader accepts), and compare's fallback row counts them per step (the synchronous run leaves
    only cumsum to the CPU)."""
    run_dir, _ = fallback_run
    out = tmp_path / "trace.pftrace"
    assert cli("export", run_dir, "-o", out).returncode == 0
    names = [s[4] for s in check_trace(out).slices]
    assert sum(n.startswith("CPU fallback aten::cumsum") for n in names) == STEPS
    rows = cli("compare", run_dir, synchronous_run).stdout
    fallback_row = [line for line in rows.splitlines() if line.strip().startswith("CPU fallbacks per step")][0]
    assert np.allclose([float(x) for x in fallback_row.split()[4:6]], [2.0, 1.0])
