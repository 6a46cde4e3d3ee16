"""A custom kernel on the emulated `neuron` device (examples/custom_kernel.py: an RMSNorm forward
and backward, each registered with ``neuron.custom_kernel``, the backward by
``register_autograd``), trained for real on the CPU, on the device and compiled for it
(tests/neuron_custom_kernel_script.py, a process of its own), and what a capture records of it:
one kernel per call, named after the op, holding exactly the op's ATen ops, never fused with its
neighbours, at the line that called it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import neuron_prof
from neuron_prof.reports.summary.build import summarize
from conftest import cli, line_of, script_facts, viewer_page

pytestmark = pytest.mark.multiprocess  # the training runs in a process of its own

SCRIPT = Path(__file__).with_name("neuron_custom_kernel_script.py")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_kernel.py"
FORWARD, BACKWARD = "neuron_prof_examples::rms_norm", "neuron_prof_examples::rms_norm_backward"
FORWARD_OPS = ["aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::mul"]  # rms_norm's body
BACKWARD_OPS = FORWARD_OPS + ["aten::sum", "aten::mul", "aten::mul", "aten::mean", "aten::mul", "aten::sub", "aten::mul"]


@pytest.fixture(scope="module")
def kernel_runs(tmp_path_factory) -> tuple[dict, neuron_prof.Run, neuron_prof.Run]:
    """(facts, the eager run, the compiled run)."""
    root = tmp_path_factory.mktemp("custom_kernel")
    facts = script_facts(SCRIPT, root / "eager", root / "compiled")
    return facts, neuron_prof.load(root / "eager"), neuron_prof.load(root / "compiled")


def test_the_kernels_results_are_bitwise_the_cpu_reference_eager_compiled_and_captured(kernel_runs):
    facts, _, _ = kernel_runs
    assert facts["cpu"] == facts["neuron"] == facts["compiled"] == facts["captured"] == facts["captured_compiled"]
    assert len(set(facts["cpu"])) == 4  # it trained


def _kernels(run: neuron_prof.Run, step: int) -> list[tuple[str, list[str]]]:
    """The device's kernels that ran in ``step``, in order: (name, the ops it ran)."""
    k, e = run.device_kernels, run.device_enqueues.set_index("id")
    k = k[k["step"] == step].sort_values("ts")
    return [(str(name), [str(e.loc[i, "op"]) for i in ids]) for name, ids in zip(k["name"], k["enqueue_ids"])]


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_each_call_is_one_kernel_of_its_own_with_exactly_its_ops(kernel_runs, which):
    run = kernel_runs[1 if which == "eager" else 2]
    for step in range(1, 4):
        kernels = _kernels(run, step)
        assert [ops for name, ops in kernels if name == FORWARD] == [FORWARD_OPS]
        assert [ops for name, ops in kernels if name == BACKWARD] == [BACKWARD_OPS]
        # no other kernel ran any of the op's own work: the kernels named after it hold all of it
        assert sum(ops.count("aten::rsqrt") for _, ops in kernels) == 2
    if which == "eager":
        # a pointwise GELU right after it would fuse into a kernel of fused ops; it runs alone
        kernels = _kernels(run, 1)
        after = kernels[[n for n, _ in kernels].index(FORWARD) + 1]
        assert after == ("gelu", ["aten::gelu"])


def test_the_capture_names_the_op_and_its_line_forward_and_backward(kernel_runs):
    _, run, _ = kernel_runs
    ops = run.ops
    calls = ops[ops["name"].isin([FORWARD, BACKWARD])]
    for step in range(4):
        in_step = calls[calls["step"] == step]
        assert sorted(zip(in_step["name"], in_step["bwd"])) == [(FORWARD, False), (BACKWARD, True)]
    line = f"examples/custom_kernel.py:{line_of(EXAMPLE, 'NORM-LINE')}"
    e, k = run.device_enqueues.set_index("id"), run.device_kernels
    for name in (FORWARD, BACKWARD):
        ids = [i for ids in k.loc[k["name"] == name, "enqueue_ids"] for i in ids]
        assert set(e.loc[ids, "user_source"]) == {line}  # the backward's too: the forward call's line


def test_the_report_json_text_and_device_page_give_each_custom_kernel_its_passes_time_and_line(
        kernel_runs, monkeypatch):
    _, run, _ = kernel_runs
    k = run.device_kernels
    busy = k["dur"].sum()  # one device: its busy time over the run
    line = f"examples/custom_kernel.py:{line_of(EXAMPLE, 'NORM-LINE')}"
    res = cli("report", run.path, "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)["device"]["custom_kernels"]}
    assert set(rows) == {FORWARD, BACKWARD}  # none of the fused or one-op kernels is taken for one
    for name, forward in ((FORWARD, True), (BACKWARD, False)):
        r, mine = rows[name], k.loc[k["name"] == name, "dur"]
        assert (r["calls"], r["forward_calls"], r["backward_calls"]) == ((4, 4, 0) if forward else (4, 0, 4))
        assert r["total_ms"] == pytest.approx(mine.sum() / 1e6)
        assert r["forward_ms" if forward else "backward_ms"] == r["total_ms"]
        assert r["pct"] == pytest.approx(100 * mine.sum() / busy) and r["user_sources"] == [line]
    coverage = sum(r["pct"] for r in rows.values())
    text = cli("report", run.path, timeout=300).stdout
    assert f"custom-kernel coverage: the share of device busy time in them: rank 0 neuron:0 {coverage:.1f}%" in text
    at = viewer_page(monkeypatch, run.path, "device", title="Device")
    assert "Custom kernels" in [h.value for h in at.subheader]
    table = next(d.value for d in at.dataframe if "forward calls" in d.value.columns)
    shown_rows = zip(table["kernel"], table["forward calls"], table["backward calls"], table["called at"])
    assert sorted(shown_rows) == sorted([(FORWARD, 4, 0, line), (BACKWARD, 0, 4, line)])


def test_the_report_names_the_compiled_graphs_holding_each_custom_kernel(kernel_runs):
    _, eager, compiled = kernel_runs
    assert all(k.graphs == [] for k in summarize(eager).device.custom_kernels)  # eager: no graph holds them
    rows = {k.name: k for k in summarize(compiled).device.custom_kernels}
    # the one frame compiled (before the capture: its graph's region ranges say which): the
    # forward kernel in its forward graph, the backward kernel in the backward graph compiled with it
    regions = compiled.ops[compiled.ops["name"].astype(str).str.startswith("Torch-Compiled Region: ")]
    (cid,) = {n.split(": ", 1)[1] for n in regions["name"].astype(str)}
    assert rows[FORWARD].graphs == [cid] and rows[BACKWARD].graphs == [f"{cid} backward"]
