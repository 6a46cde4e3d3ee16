"""Mixed precision (``torch.autocast(device_type="neuron")``) and activation checkpointing
(``torch.utils.checkpoint``, non-reentrant and reentrant) on the emulated `neuron` device, trained
for real (tests/neuron_precision_script.py, in a process of its own: enabling the device renames
PrivateUse1 for a whole process), and what a capture of them records."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof

pytestmark = pytest.mark.multiprocess  # the training runs in a process of its own

SCRIPT = Path(__file__).with_name("neuron_precision_script.py")


@pytest.fixture(scope="module")
def precision_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run]:
    root = tmp_path_factory.mktemp("precision")
    p = subprocess.run([sys.executable, str(SCRIPT), str(root / "run")], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), neuron_prof.load(root / "run")


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
    for step in range(4):
        in_step = low[low["step"] == step]
        assert sorted(in_step[~in_step["bwd"]]["module"]) == ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc"]
        assert sorted(in_step[in_step["bwd"]]["module"]) == ["blocks.0", "blocks.1", "blocks.2"]
    # autocast's casts are ops of their own on the device, fp32 -> bf16 (weights, the input)
    casts = ops[(ops["name"] == "aten::_to_copy") & (ops["dtypes"] == "float32") & (ops["step"] == 1)]
    assert len(casts) >= 3 * 2  # each block's weight and bias, at least, forward
