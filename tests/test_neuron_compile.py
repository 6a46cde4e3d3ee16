"""torch.compile(backend="neuron") (neuron_prof.testing.neuron_compile) under capture: its graph
break and recompile, its own compile phases, fusion groups and cache lookups in the compiler
tables, each group one kernel on the device, results equal to eager on the device, and dynamic
shapes refused. The workload runs in its own process (tests/neuron_compile_script.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

import neuron_prof
from conftest import line_of, script_facts

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

SCRIPT = Path(__file__).with_name("neuron_compile_script.py")
PHASES = ("neuron lowering", "neuron partitioning", "neuron codegen")


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run]:
    run_dir = tmp_path_factory.mktemp("neuron_compile") / "run"
    return script_facts(SCRIPT, run_dir), neuron_prof.load(run_dir)


def test_compiled_results_equal_eager_on_the_device(compiled_run):
    facts, _ = compiled_run
    assert facts["equal"] == [True] * 4


def test_graph_break_and_shape_recompile(compiled_run):
    _, run = compiled_run
    line = line_of(SCRIPT, "BREAK-LINE")
    breaks = run.graph_breaks
    assert len(breaks) and (breaks["reason_class"].astype(str) == "print").all()
    assert breaks["user_source"].astype(str).str.endswith(f"neuron_compile_script.py:{line}").all()
    # batch 8, then 12: each of the two frames recompiles once, for the size of its input
    rec = run.recompiles
    assert sorted(rec["compile_id"].astype(str)) == ["0/1", "1/1"]
    assert rec["reason"].astype(str).str.contains("expected 8, actual 12").all()
    assert set(run.compiles["backend"].astype(str)) == {"neuron"}


def test_the_backends_own_phases_for_forward_and_backward(compiled_run):
    _, run = compiled_run
    phases = run.compile_phases["phase"].astype(str)
    # four frame compiles before the reset, two after, each a forward and a backward graph: all
    # are lowered; the two after the reset are found in the backend's cache, not partitioned again
    for p, compiles in zip(PHASES, (6, 4, 4)):
        assert (phases == p).sum() == compiles and (phases == f"{p} (backward)").sum() == compiles


def test_fusion_groups_run_as_one_kernel_each(compiled_run):
    _, run = compiled_run
    fusions = run.fusions
    fusions = fusions[fusions["backend"].astype(str) == "neuron"]
    assert len(fusions) and fusions["kernel"].astype(str).str.match(r"^neuron_graph_\d+_k\d+$").all()
    # the first layer's matmul and its GELU epilogue: one group of the forward graph
    assert any({"addmm", "gelu"} <= set(nodes) for nodes in fusions["nodes"])
    # attention compiled to the kernel the CPU would choose (chosen on fake tensors while tracing)
    nodes = {n for ns in fusions["nodes"] for n in ns}
    assert {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"} <= nodes
    kernels = run.device_kernels
    names = kernels["name"].astype(str)
    group_kernels = kernels[names.str.startswith("neuron_graph_")]
    # every kernel the device ran for a compiled graph is one of the reported groups
    assert len(group_kernels) and set(group_kernels["name"].astype(str)) <= set(fusions["kernel"].astype(str))
    assert (group_kernels["n_ops"] >= 1).all() and (group_kernels["n_ops"] > 1).any()


def test_the_backends_cache_misses_then_hits_after_a_reset(compiled_run):
    _, run = compiled_run
    cache = run.compile_cache
    cache = cache[cache["cache"].astype(str) == "neuron_graph"]
    results = cache.sort_values("ts")["result"].astype(str).tolist()
    # 4 frame compiles x (forward, backward) miss; after torch._dynamo.reset() the batch-8 graphs
    # come back: 2 frames x 2 graphs hit
    assert results == ["miss"] * 8 + ["hit"] * 4


def test_dynamic_shapes_are_refused_with_what_to_do(compiled_run):
    facts, _ = compiled_run
    assert "NeuronDynamicShapeError" in facts["dynamic_error"] and "dynamic=False" in facts["dynamic_error"]
