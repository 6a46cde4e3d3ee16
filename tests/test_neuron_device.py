"""The emulated `neuron` device (neuron_prof.testing.neuron) on a real training loop: the device's
API, bitwise CPU results, the host running ahead of the device, its memory, and a capture of it
through the backend hook API (kernels with the ops they fused, flushes with their reasons and
lines, CPU fallbacks with the bytes they moved). The workloads run in a process of their own
(tests/neuron_device_script.py): enabling the device renames PrivateUse1 for a whole process."""
from __future__ import annotations

from pathlib import Path

import pytest

import neuron_prof
from conftest import line_of, script_facts
from neuron_prof.analysis.memory import snapshot
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.sync import sync_points
from neuron_prof.reports.summary.build import summarize

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

SCRIPT = Path(__file__).with_name("neuron_device_script.py")


@pytest.fixture(scope="module")
def device_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run]:
    root = tmp_path_factory.mktemp("neuron")
    facts = script_facts(SCRIPT, root / "run", root / "oom")
    facts["oom_run"] = str(root / "oom")
    return facts, neuron_prof.load(root / "run")


def test_the_device_is_a_registered_privateuse1_backend(device_run):
    facts, _ = device_run
    assert facts["backend"] == "neuron" and facts["device_count"] == 2
    assert facts["device_strings"] == ["neuron:1", "neuron:0", "neuron:0"]
    assert facts["is_neuron"] == [True, False] and facts["round_trip"]
    assert facts["current_device"] == 0 and facts["accelerator"] == ["neuron", 2]
    assert facts["allocated_on_1"] == 6 * 4  # the 2x3 float32 tensor moved to neuron:1


def test_training_on_the_device_is_bitwise_the_cpu_with_and_without_capture(device_run):
    facts, _ = device_run
    assert facts["losses"]["neuron"] == facts["losses"]["cpu"] == facts["captured_losses"]
    assert facts["parameters_bitwise"] and facts["captured_parameters_bitwise"]
    assert all(facts["fallback_results_equal"].values()) and facts["random_as_cpu"]


@pytest.mark.timing  # the host's queueing against the device's sleeps: 20x
def test_the_host_runs_ahead_and_item_waits_for_the_queue(device_run):
    facts, _ = device_run
    r = facts["run_ahead"]
    # each of the 50 kernels (a matmul and its division, fused) sleeps the launch cost on the device
    # thread (100 ms in all): the enqueue returned long before the device could have run them (it
    # takes 2-5 ms, a margin of 20x), and the .item() waited for the rest (by construction: the
    # device's sleeps are a floor)
    assert r["enqueue_ns"] < r["device_floor_ns"]
    assert r["enqueue_ns"] + r["item_wait_ns"] >= r["device_floor_ns"]


def test_device_memory_is_allocated_and_an_oom_names_its_size(device_run):
    facts, run = device_run
    assert facts["allocated_grows_by"] == 1 << 20
    assert facts["oom"].startswith("neuron out of memory. Tried to allocate 128.00 MiB (device neuron:0")
    # the allocator reports to the profiler: the memory collector sees the device
    events = run.memory_events
    assert (events["device"].astype(str) == "neuron:0").sum() > 100
    assert "neuron:0" in set(run.memory_steps["device"].astype(str))
    assert run.ops["devices"].astype(str).str.contains("neuron:0").any()


def test_kernels_hold_the_ops_they_fused(device_run):
    _, run = device_run
    kernels, enqueues = run.device_kernels, run.device_enqueues
    steps = set(run.steps.loc[run.steps["complete"], "step"])
    kernels = kernels[kernels["step"].isin(steps)]
    assert len(kernels) and (kernels["device"].astype(str) == "neuron:0").all()
    assert (kernels["n_ops"] == kernels["enqueue_ids"].map(len)).all()
    fused = kernels[kernels["n_ops"] > 1]
    assert len(fused) and fused["name"].astype(str).str.contains(r"\+").all()
    # every op enqueued in a complete step ran in exactly one kernel; that kernel may have run in
    # the next step (a kernel belongs to the step in which it ran, as on a GPU), and it started
    # after the last of its ops was queued
    every = run.device_kernels
    ran = [i for ids in every["enqueue_ids"] for i in ids]
    assert len(ran) == len(set(ran))
    assert set(enqueues.loc[enqueues["step"].isin(steps), "id"]) <= set(ran)
    queued_at = enqueues.set_index("id")["ts"]
    last_queued = every["enqueue_ids"].map(lambda ids: queued_at.loc[list(ids)].max())
    assert (every["ts"] >= last_queued).all()
    # an addmm's epilogue: a matmul kernel followed by pointwise ops
    assert kernels["name"].astype(str).str.match(r"^(addmm|mm|bmm)\+").any()


def test_flushes_name_their_reason_and_line(device_run):
    _, run = device_run
    flushes = run.queue_flushes
    sync = flushes[flushes["reason"] == "sync"]
    lines = {f"neuron_device_script.py:{line_of(SCRIPT, m)}" for m in ("ITEM-LINE", "STATE-LINE")}
    assert set(sync["user_source"].astype(str).map(lambda s: s.rsplit("/", 1)[-1])) <= lines
    item = sync[sync["user_source"].astype(str).str.endswith(f"neuron_device_script.py:{line_of(SCRIPT, 'ITEM-LINE')}")]
    # a flush is reported when the queue holds work; each step's .item() follows AdamW's kernels
    # (200 us of launch each), so it finds work unless the host lost its core for all of them
    # (every .item() is a sync point: test_sync_points_name_the_item_line_on_the_device)
    assert 1 <= len(item) <= 3 and item["step"].is_unique
    assert (item["host_op"].astype(str) == "aten::_local_scalar_dense").all() and (item["ops"] > 0).all()
    # each wait ends after every kernel queued before it began had run
    kernels, enqueues = run.device_kernels, run.device_enqueues
    queued_at = enqueues.set_index("id")["ts"]
    first_queued = kernels["enqueue_ids"].map(lambda ids: queued_at.loc[list(ids)].min())
    for f in sync.itertuples():
        before = kernels[first_queued < f.ts]
        assert f.ts + f.dur >= (before["ts"] + before["dur"]).max(), f
    assert set(flushes["reason"]) <= {"sync", "fallback", "size", "synchronize", "other"}
    assert (flushes["dur"] > 0).all()


def test_cpu_fallbacks_with_the_bytes_they_moved(device_run):
    _, run = device_run
    fb = run.fallbacks
    cumsum = fb[fb["op"].astype(str) == "aten::cumsum"]
    line = line_of(SCRIPT, "CUMSUM-LINE")
    assert len(cumsum) == 3 and cumsum["user_source"].astype(str).str.endswith(f"neuron_device_script.py:{line}").all()
    # cumsum.out of the [BATCH, SEQ] int64 tokens: input and out copied to the host, the result back
    tokens = 4 * 8 * 8
    assert (cumsum["bytes_to_host"] == 2 * tokens).all() and (cumsum["bytes_from_host"] == tokens).all()
    emb = fb[fb["op"].astype(str) == "aten::embedding_dense_backward"]
    assert len(emb) == 3 and emb["bwd"].all() and (emb["module"].astype(str) == "emb").all()
    # its gradient of the [VOCAB, DIM] float32 table comes back
    assert (emb["bytes_from_host"] == 50 * 32 * 4).all()


def test_memory_categories_on_the_device_match_the_model(device_run):
    facts, run = device_run
    allocs = analyze(run).memory_allocations
    on = allocs[allocs["device"].astype(str) == "neuron:0"]
    assert len(on) and {"parameter", "gradient", "optimizer state"} <= set(on["category"].astype(str))
    # at the end of every complete step, what is live on the device by role: the parameters once,
    # their gradients once, AdamW's exp_avg and exp_avg_sq (its step counters stay on the CPU)
    size = facts["parameter_bytes"]
    steps = run.steps[run.steps["complete"]]
    assert len(steps) == 3
    for end in (steps["ts"] + steps["dur"]).tolist():
        live = snapshot(allocs, int(end), "category", device="neuron:0").set_index("category")["bytes"]
        assert live.get("parameter") == size and live.get("gradient") == size
        assert live.get("optimizer state") == 2 * size


def test_a_device_oom_in_a_capture_is_recorded_with_its_device_and_size(device_run):
    facts, _ = device_run
    assert facts["captured_oom"].startswith("neuron out of memory. Tried to allocate 128.00 MiB")
    ooms = neuron_prof.load(facts["oom_run"]).memory_ooms
    assert len(ooms) == 1
    assert ooms["device"].astype(str).tolist() == ["neuron:0"] and ooms["bytes"].tolist() == [128 << 20]
    assert ooms["message"].astype(str).str.startswith("OutOfMemoryError: neuron out of memory").all()


def test_sync_points_name_the_item_line_on_the_device(device_run):
    _, run = device_run
    line = f"neuron_device_script.py:{line_of(SCRIPT, 'ITEM-LINE')}"
    sync = sync_points(run.ops, analyze(run).op_parent)
    item = sync[sync["user_source"].astype(str).str.endswith(line)]
    assert len(item) == 3 and (item["name"].astype(str) == "aten::_local_scalar_dense").all()
    assert (item["devices"].astype(str) == "neuron:0").all()
    by_source = summarize(run).to_json()["sync_points"]["by_source"]
    assert any(r["source"].endswith(line) and r["name"] == "aten::_local_scalar_dense" for r in by_source)


def test_ops_carry_the_device_and_shapes_of_their_inputs(device_run):
    _, run = device_run
    ops = run.ops
    addmm = ops[ops["name"].astype(str) == "aten::addmm"]
    assert len(addmm)
    # addmm(bias, input, weight): all three on the device, with their shapes
    devices = addmm["devices"].astype(str).str.split(",").map(lambda d: d[:3])
    assert devices.map(lambda d: d == ["neuron:0"] * 3).all()
    assert addmm["shapes"].map(lambda s: len(s) >= 3 and all(len(x) for x in list(s)[:3])).all()
