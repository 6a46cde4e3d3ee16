"""Mixed precision (``torch.autocast(device_type="neuron")``) and activation checkpointing
(``torch.utils.checkpoint``, non-reentrant and reentrant) on the emulated `neuron` device, trained
for real (tests/neuron_precision_script.py, in a process of its own: enabling the device renames
PrivateUse1 for a whole process), and what a capture of them records."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import line_of, script_facts, viewer_page
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.summary.build import summarize

pytestmark = pytest.mark.multiprocess  # the training runs in a process of its own

SCRIPT = Path(__file__).with_name("neuron_precision_script.py")


@pytest.fixture(scope="module")
def precision_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run]:
    root = tmp_path_factory.mktemp("precision")
    facts = script_facts(SCRIPT, root / "run", root / "gpt2")
    facts["gpt2_run"] = root / "gpt2"
    return facts, neuron_prof.load(root / "run")



def test_autocast_on_the_device_is_bitwise_cpu_autocast(precision_run):
    facts, _ = precision_run
    assert facts["amp_supported"] == ["torch.bfloat16", "torch.float16"]
    losses, dtypes = facts["neuron_autocast"]
    assert losses == facts["cpu_autocast"][0] and dtypes == facts["cpu_autocast"][1] == ["torch.bfloat16"] * 4
    # autocast did something: the same training in fp32 (bitwise the CPU's too) has other losses
    assert facts["neuron_fp32"] == facts["cpu_fp32"] and facts["neuron_fp32"][1] == ["torch.float32"] * 4
    assert all(a != b for a, b in zip(losses, facts["neuron_fp32"][0]))


def test_the_device_casts_by_pytorchs_generic_autocast_lists(precision_run):
    # the lists CUDA, XPU and MPS use (the CPU's own keep these three in bf16)
    assert precision_run[0]["generic_lists"] == {"linear": "torch.bfloat16", "layer_norm": "torch.float32",
                                                 "softmax": "torch.float32", "exp": "torch.float32"}


def test_checkpointed_training_on_the_device_is_bitwise_the_uncheckpointed(precision_run):
    facts, _ = precision_run
    plain = facts["neuron_autocast"][0]
    assert facts["neuron_checkpoint"][0] == plain
    assert facts["neuron_checkpoint_reentrant"][0] == plain == facts["cpu_checkpoint_reentrant"][0]


def test_a_capture_changes_nothing_and_records_the_casts_and_the_recompute(precision_run):
    facts, run = precision_run
    assert facts["captured"] == facts["neuron_checkpoint"]
    ops = run.ops
    assert sorted(run.steps["step"]) == [0, 1, 2, 3, 4] and run.steps["complete"].sum() == 4
    # the matmuls ran in bf16 on the device: per step, each of the 3 blocks' linear once forward
    # and once more in the backward pass (checkpointing recomputes the block there), attributed
    # to the checkpointed block
    low = ops[(ops["name"] == "aten::linear") & (ops["dtypes"] == "bfloat16,bfloat16,bfloat16")
              & (ops["devices"] == "neuron:0,neuron:0,neuron:0")]
    blocks = ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc"]
    for step in range(4):
        in_step = low[low["step"] == step]
        assert sorted(in_step[~in_step["bwd"]]["module"]) == blocks
        # re-run in the backward pass: marked recompute, named as forward names them
        assert sorted(in_step[in_step["bwd"]]["module"]) == blocks and in_step["recompute"].sum() == 3
    # autocast's casts are ops of their own on the device, fp32 -> bf16 (weights, the input)
    casts = ops[(ops["name"] == "aten::_to_copy") & (ops["dtypes"] == "float32") & (ops["step"] == 1)]
    assert len(casts) >= 3 * 2  # each block's weight and bias, at least, forward


def test_recomputed_ops_are_marked_and_a_phase_of_their_own(precision_run):
    _, run = precision_run
    ops = run.ops
    re = ops[ops["recompute"]]
    assert re["bwd"].all()  # only ever inside the backward pass
    # the backward pass's own ops (autograd nodes and what runs in them) are not recompute
    nodes = ops[ops["name"].astype(str).str.endswith("Backward0")]
    assert len(nodes) and not nodes["recompute"].any()
    # each step re-runs each block's linears (autocast's and the bf16 one inside it) with the
    # forward's dtypes, under blocks.N.fc, and starts its GELU (non-reentrant checkpointing stops
    # re-running once the last activation the backward needs is saved: GELU's input)
    def calls(rows, name: str) -> list[str]:
        return sorted(rows[rows["name"] == name]["dtypes"].astype(str))

    for step in range(4):
        mine = ops[ops["step"] == step]
        for n in range(3):
            block = mine[mine["module"].astype(str).str.startswith(f"blocks.{n}")]
            forward, again = block[~block["bwd"]], block[block["recompute"]]
            linears = calls(forward, "aten::linear")
            assert len(linears) == 2 and "bfloat16,bfloat16,bfloat16" in linears
            assert calls(again, "aten::linear") == linears
            assert calls(again, "aten::gelu") == ["bfloat16"]
    summary = summarize(run)
    (breakdown,) = summary.step_breakdown
    assert breakdown.recompute_ms > 0 and breakdown.backward_ms > 0
    # one re-run per steady step (1, 2, 3) per checkpointed block
    assert sorted((r.module, r.reruns) for r in summary.recompute) == [("blocks.0", 3), ("blocks.1", 3),
                                                                        ("blocks.2", 3)]
    # the op table: the same op of the same module forward, and apart as recompute
    table = analyze(run).op_time.stats
    linear = table[(table["name"] == "aten::linear") & (table["module"] == "blocks.0.fc")]
    assert sorted(zip(linear["recompute"], linear["backward"], linear["calls"])) == [(False, False, 6), (True, True, 6)]


def test_the_precision_mix_and_the_fp32_ops_autocast_left_at_their_line(precision_run):
    _, run = precision_run
    p = summarize(run).precision
    assert p.time == "device"  # the device reported its kernels: their time is what is split
    shares = {m.precision: m for m in p.mix}
    assert shares["bf16"].ms_per_step > 0 and shares["fp32"].ms_per_step > 0 and shares["cast"].ms_per_step > 0
    assert abs(sum(m.pct for m in p.mix) - 100) < 1e-6
    # the loss: autocast's fp32 list casts its input up and computes it in fp32, at the loss line
    mse = [o for o in p.left_in_fp32 if o.name == "aten::mse_loss"]
    loss_line = f"{SCRIPT.name}:{line_of(SCRIPT, 'LOSS-LINE')}"
    assert len(mse) == 1 and mse[0].calls == 3 and any(s.endswith(loss_line) for s in mse[0].user_sources)
    # the linears ran in bf16: never among the ops left in fp32
    assert not [o for o in p.left_in_fp32 if o.name in ("aten::linear", "aten::addmm")]


def test_gpt2_under_autocast_with_gradient_checkpointing_on_the_device(precision_run):
    facts, _ = precision_run
    # gradient checkpointing and the capture change nothing: the same losses, bitwise
    assert facts["gpt2_checkpointing"] == facts["gpt2"] == facts["gpt2_captured"]
    run = neuron_prof.load(facts["gpt2_run"])
    ops = run.ops
    # per step, each block's four Conv1D modules run their matmul (addmm) forward and once more
    # as recompute, in bf16 (non-reentrant checkpointing stops within the last one's nested calls)
    addmm = ops[(ops["name"] == "aten::addmm") & ops["module"].astype(str).str.startswith("transformer.h.")]
    addmm = addmm[addmm["dtypes"].astype(str).str.startswith("bfloat16,bfloat16,bfloat16")]
    for step in range(4):
        mine = addmm[addmm["step"] == step]
        for n in range(2):
            block = mine[mine["module"].astype(str).str.startswith(f"transformer.h.{n}.")]
            forward = set(block[~block["bwd"]]["module"].astype(str))
            assert len(forward) == 4 and set(block[block["recompute"]]["module"].astype(str)) == forward
    summary = summarize(run)
    assert sorted((r.module, r.reruns) for r in summary.recompute) == [("transformer.h.0", 3), ("transformer.h.1", 3)]
    (breakdown,) = summary.step_breakdown
    assert breakdown.recompute_ms > 0
    shares = {m.precision for m in summary.precision.mix}
    assert {"bf16", "fp32", "cast"} <= shares
    # the device's generic lists keep layer norm in fp32 (the CPU's would not): named with its module
    norms = {o.module for o in summary.precision.left_in_fp32 if o.name == "aten::native_layer_norm"}
    assert norms and all(m.startswith("transformer.") and m.rsplit(".", 1)[-1].startswith("ln_") for m in norms)
    text = subprocess.run([sys.executable, "-m", "neuron_prof", "report", str(facts["gpt2_run"])],
                          capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "Recomputed by activation checkpointing" in text.stdout and "transformer.h.1" in text.stdout
    assert "Forward ops autocast left in fp32" in text.stdout and "recompute" in text.stdout


def test_the_ops_page_shows_precision_and_recompute(precision_run, monkeypatch):
    facts, _ = precision_run
    run = neuron_prof.load(facts["gpt2_run"])
    at = viewer_page(monkeypatch, run.path, "ops", title="Ops")
    heads = [h.value for h in at.subheader]
    assert "Precision" in heads and "Recomputed by activation checkpointing" in heads
    summary = summarize(run)
    mix = next(d.value for d in at.dataframe if "precision" in d.value.columns)
    assert mix["precision"].tolist() == [m.precision for m in summary.precision.mix]
    again = next(d.value for d in at.dataframe if "reruns" in d.value.columns)
    assert sorted(again["module"]) == ["transformer.h.0", "transformer.h.1"]
    table = next(d.value for d in at.dataframe if "recompute" in d.value.columns and "self_ms" in d.value.columns)
    assert table["recompute"].any() and not table.loc[table["recompute"], "backward"].eq(False).any()
