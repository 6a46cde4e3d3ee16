"""Memory debugging on real CPU training loops (examples/memory_leak.py): leaks, peaks,
categories, snapshots, OOM, and living next to torch.profiler."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import neuron_prof
from conftest import MEMORY_STEPS, cli, line_of, viewer_page, write_script
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak as ml
from neuron_prof.reports.findings import findings
from neuron_prof.reports.summary.build import summarize
from neuron_prof.units import format_bytes

EXAMPLE = Path(ml.__file__).resolve()
F32 = 4


def src(marker: str) -> str:
    """``file:line`` of the example's marked line as the run spells sources (relative to cwd)."""
    import os
    rel = os.path.relpath(EXAMPLE, os.getcwd())
    return f"{rel if not rel.startswith('..') else EXAMPLE}:{line_of(EXAMPLE, marker)}"


def test_leak_is_found_with_its_bytes_per_step_and_lines(memory_runs):
    run = neuron_prof.load(memory_runs("leak"))
    leaks = analyze(run).memory_leaks
    assert len(leaks) and set(leaks["device"]) == {"cpu"}
    # live memory grows by exactly what one kept validation result holds (see the example)
    assert leaks["growth_per_step"].iloc[0] == ml.leaked_bytes_per_step() == 24_708
    assert leaks["confidence"].iloc[0] >= 0.9
    by_site = leaks.groupby("source")["bytes_per_step"].sum().to_dict()
    # the line that creates the kept graph's tensors: relu output + model output + the scalar
    assert by_site[src("LEAK-LINE")] == F32 * (ml.BATCH * ml.HIDDEN + ml.BATCH * ml.OUT + 1)
    # the validation input, saved by the first Linear for its weight gradient
    assert by_site[src("VAL-INPUT-LINE")] == F32 * ml.BATCH * ml.IN
    assert sum(by_site.values()) == ml.leaked_bytes_per_step()
    cats = dict(zip(leaks["source"] + "|" + leaks["op"], leaks["category"]))
    assert cats[src("LEAK-LINE") + "|aten::relu"] == "activation"
    assert cats[src("VAL-INPUT-LINE") + "|aten::randn"] == "input"
    assert set(leaks["steps_seen"]) == {MEMORY_STEPS - 1}  # survivors from every step before the last
    steps = run.memory_steps["live"].to_numpy()
    assert (np.diff(steps) == ml.leaked_bytes_per_step()).all()
    # every step captured: the process's growth is not judged, but the kept results carry a
    # grad_fn, and the finding says what that may mean
    finding = next(f.text for f in findings(summarize(run)) if f.text.startswith("memory grows"))
    assert "made with a grad_fn" in finding and "keeps its whole autograd graph" in finding


def test_clean_loop_reports_no_leak(memory_runs):
    run = neuron_prof.load(memory_runs("clean"))
    assert analyze(run).memory_leaks.empty
    live = run.memory_steps["live"].to_numpy()
    assert len(live) == MEMORY_STEPS and (live == live[0]).all()
    report = cli("report", memory_runs("clean"))
    assert report.returncode == 0 and "no leak" in report.stdout


def test_huge_temporary_is_the_peak_with_its_line_and_size(memory_runs):
    run = neuron_prof.load(memory_runs("spike"))
    peaks = analyze(run).memory_peaks
    spike_step = MEMORY_STEPS // 2
    worst = peaks.loc[peaks["bytes"].idxmax()]
    size = F32 * ml.SPIKE * ml.BATCH * ml.IN
    assert size == 2_097_152
    assert (worst["step"], worst["source"], worst["alloc_bytes"]) == (spike_step, src("SPIKE-LINE"), size)
    assert worst["op"] == "aten::contiguous" and worst["category"] == "temporary"
    others = peaks[(peaks["step"] != spike_step) & (peaks["step"] < MEMORY_STEPS)]
    assert worst["bytes"] - others["bytes"].max() >= size - 64 * 1024  # the spike is what makes this peak
    sites = mem.peak_sites(analyze(run).memory_allocations, 0, "cpu", int(worst["ts"]))
    assert (sites["source"].iloc[0], sites["bytes"].iloc[0], sites["blocks"].iloc[0]) == (src("SPIKE-LINE"), size, 1)
    # the temporary lives and dies inside its line's op: it is freed before the step ends
    spike = analyze(run).memory_allocations[analyze(run).memory_allocations["bytes"] == size]
    assert len(spike) == 1 and spike["step"].iloc[0] == spike_step and spike["free_ts"].iloc[0] != mem.NEVER
    assert (spike["shape"].iloc[0], spike["dtype"].iloc[0]) == (f"[{ml.SPIKE}, {ml.BATCH}, {ml.IN}]", "float32")
    # shapes of blocks whose kernels allocate without a dispatched aten::empty come from outputs
    a = analyze(run).memory_allocations
    relu = a[(a["top_op"] == "aten::relu") & (a["step"] == 1)]
    assert set(relu["shape"]) == {f"[{ml.BATCH}, {ml.HIDDEN}]"} and (relu["bytes"] == F32 * ml.BATCH * ml.HIDDEN).all()
    assert a[a["shape"].astype(str) != ""]["bytes"].sum() >= 0.99 * a["bytes"].sum()
    js = json.loads(cli("report", memory_runs("spike"), "--json").stdout)["memory"]
    assert js["devices"][0]["peak"]["source"] == src("SPIKE-LINE") and js["devices"][0]["peak"]["alloc_bytes"] == size


def _model_bytes() -> tuple[int, int]:
    model, _ = ml.model_and_optimizer()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params, len(list(model.parameters()))


def test_parameter_gradient_and_adam_state_match_the_model(memory_runs):
    run = neuron_prof.load(memory_runs("clean"))
    params, n_tensors = _model_bytes()
    for step in (1, MEMORY_STEPS - 2):
        snap = analyze(run).memory_snapshot(step).set_index("category")["bytes"]
        assert snap["parameter"] == params == F32 * (ml.IN * ml.HIDDEN + ml.HIDDEN + ml.HIDDEN * ml.OUT + ml.OUT)
        assert snap["gradient"] == params
        # Adam: exp_avg and exp_avg_sq per parameter (2x), plus its float32 `step` scalar per parameter
        assert snap["optimizer state"] == 2 * params + F32 * n_tensors
    # known roles come from Python at captured boundaries; their blocks keep the role in allocations
    a = analyze(run).memory_allocations
    grads = a[a["category"] == "gradient"]
    assert set(grads["bwd"]) == {True}  # gradients are made by backward ops


def test_snapshot_diff_between_two_steps_names_the_leak(memory_runs):
    run = neuron_prof.load(memory_runs("leak"))
    b = mem.step_boundaries(run.steps).set_index("step")["ts"]
    diff = mem.snapshot_diff(analyze(run).memory_allocations, int(b[2]), int(b[5]))
    top = diff.iloc[0]
    assert top["source"] == src("LEAK-LINE")
    assert top["net"] == 3 * F32 * (ml.BATCH * ml.HIDDEN + ml.BATCH * ml.OUT + 1)
    val = diff.set_index("source").loc[src("VAL-INPUT-LINE")]
    assert val["net"] == 3 * F32 * ml.BATCH * ml.IN


def test_timeline_is_downsampled_without_losing_the_peak(memory_runs):
    run = neuron_prof.load(memory_runs("spike"))
    full = mem.timeline(analyze(run).memory_allocations, max_points=10**9)
    small = mem.timeline(analyze(run).memory_allocations, max_points=40)
    assert len(small) <= 40 < len(full)
    assert small["total"].max() == full["total"].max() == analyze(run).memory_peaks["bytes"].max()
    assert small["total"].min() == full["total"].min()
    cats = [c for c in mem.CATEGORIES]
    assert (full[cats].sum(axis=1) == full["total"]).all()


def test_torch_profiler_inside_a_memory_capture(tmp_path):
    """torch.profiler refuses to start while another profiler state owns the thread; ours steps
    aside for it and comes back."""
    with neuron_prof.profile(tmp_path / "r", collectors=["eager", "memory"]) as prof:
        a = torch.ones(1000)
        prof.step()
        with torch.profiler.profile(profile_memory=True, record_shapes=True) as tp:
            b = torch.ones(2000)
        c = torch.ones(3000)  # ALLOC-AFTER
        prof.step()
    assert any(e.name == "aten::ones" for e in tp.events())
    ev = neuron_prof.load(tmp_path / "r").memory_events
    sizes = set(ev[ev["kind"] == "alloc"]["bytes"])
    assert {4000, 12000} <= sizes and 8000 not in sizes  # b went to torch.profiler, c back to us
    del a, b, c


def test_memory_collector_refuses_a_running_torch_profiler_and_training_goes_on(tmp_path):
    with torch.profiler.profile():
        with neuron_prof.profile(tmp_path / "r", collectors=["eager", "memory"]) as prof:
            ml.train(2, "clean", prof)
    run = neuron_prof.load(tmp_path / "r")
    f = run.failures
    assert list(f["collector"]) == ["memory"] and "torch.profiler is running" in f["message"].iloc[0]
    assert len(run.steps) >= 2 and len(run.ops) > 0  # the eager collector kept going


OOM_SCRIPT = """
    import resource, sys
    import torch
    import neuron_prof
    from neuron_prof.examples import memory_leak as ml

    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

    try:
        with neuron_prof.profile(sys.argv[1], collectors=["eager", "memory"]) as prof:
            history = ml.train(3, "leak", prof)
            limit = vm() + (1 << 30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # the limit we impose: +1 GiB
            big = torch.empty(1 << 30)  # OOM-LINE: 4 GiB of float32
    except RuntimeError as e:
        print("re-raised:", type(e).__name__)
        sys.exit(3)
"""


@pytest.mark.multiprocess
def test_oom_writes_what_was_live_and_reraises(tmp_path):
    script = write_script(tmp_path / "oom.py", OOM_SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 3 and "re-raised: RuntimeError" in res.stdout, res.stderr
    run = neuron_prof.load(tmp_path / "run")
    oom = run.memory_ooms
    assert len(oom) == 1 and oom["bytes"].iloc[0] == 1 << 32 and oom["device"].iloc[0] == "cpu"
    assert "can't allocate memory" in oom["message"].iloc[0] and oom["step"].iloc[0] == 3
    ev = run.memory_events
    live = ev[ev["kind"] == "live"]
    assert (live["ts"] == oom["ts"].iloc[0]).all()
    # what was live: everything allocated since capture began and not freed (the model and its
    # optimizer went with train()'s locals; the returned history keeps the leaked graphs)
    at_oom = mem.live_at(analyze(run).memory_allocations, int(oom["ts"].iloc[0]))
    assert live["bytes"].sum() == at_oom["bytes"].sum() > 0
    assert (live["source"].astype(str) == src("LEAK-LINE")).sum() == 3 * 3  # relu, linear, mean x 3 steps
    assert live[live["source"].astype(str) == src("VAL-INPUT-LINE")]["bytes"].sum() == 3 * F32 * ml.BATCH * ml.IN
    assert (ev["kind"] == "recent").sum() > 0
    report = cli("report", tmp_path / "run")
    assert "OUT OF MEMORY on rank 0 cpu in step 3" in report.stdout


@pytest.mark.multiprocess
def test_oom_under_record_is_recorded_and_the_exit_code_kept(tmp_path):
    script = write_script(tmp_path / "oom.py", """
        import resource
        import torch
        from neuron_prof.examples import memory_leak as ml

        ml.train(3, "clean")
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                limit = int(line.split()[1]) * 1024 + (1 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        torch.empty(1 << 30)
    """)
    res = cli("record", "-o", tmp_path / "run", "--collectors", "eager,memory", "--", sys.executable, script)
    assert res.returncode == 1 and "can't allocate memory" in res.stderr
    oom = neuron_prof.load(tmp_path / "run").memory_ooms
    assert len(oom) == 1 and oom["bytes"].iloc[0] == 1 << 32


def test_leak_found_when_only_a_few_steps_are_captured(tmp_path):
    """Live bytes are read at every boundary; detail only in the window (steps 3-5 of 10). Blocks
    made before the window arrive as ``baseline`` rows, frees after it as ``late_free``."""
    sched = neuron_prof.schedule(wait=2, warmup=1, active=3)
    with neuron_prof.profile(tmp_path / "r", schedule=sched, collectors=["eager", "memory"]) as prof:
        history = ml.train(10, "leak", prof)
        del history  # frees every kept graph inside the capture: late frees
    run = neuron_prof.load(tmp_path / "r")
    assert len(run.memory_steps) == 10
    assert (np.diff(run.memory_steps["live"].to_numpy()) == ml.leaked_bytes_per_step()).all()
    kinds = run.memory_events["kind"].value_counts()
    assert kinds["baseline"] > 0 and kinds["late_free"] > 0
    leaks = analyze(run).memory_leaks
    assert leaks["growth_per_step"].iloc[0] == ml.leaked_bytes_per_step()
    by_site = leaks.groupby("source")["bytes_per_step"].sum()
    assert by_site.sum() == ml.leaked_bytes_per_step() and set(leaks["steps_checked"]) == {3}  # steps 3-5


def test_oom_messages_give_size_and_device():
    from neuron_prof.collectors.memory import is_out_of_memory, oom_device, requested_bytes
    cpu = "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes."
    cuda = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total capacity; "
            "14.90 GiB already allocated)")
    assert requested_bytes(cpu) == 1 << 32 and requested_bytes(cuda) == 20 << 20 and requested_bytes("boom") == 0
    assert oom_device(cpu, {"cpu", "cuda:0"}) == "cpu"
    assert oom_device(cuda, {"cpu", "cuda:1"}) == "cuda:1"
    assert oom_device("MemoryError: ", {"cpu"}) == "cpu"
    assert is_out_of_memory(RuntimeError(cpu)) and is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and not is_out_of_memory(ValueError("out of memory"))


KEPT_GRAPH_STEPS, KEPT_GRAPH_SECONDS = 100, 8  # the process is judged at boundaries of uncaptured steps in
# the second half of the run, 4 s or more after the last captured step: the example trains for the
# seconds, then for the seconds again and the steps, so a machine stalled in the first phase still
# leaves enough of them (a CI run that made 7 steps in its first 10 s, then 60, judged ~30 steps and
# read -5.7 KiB a step: 2 MiB of kept graph is lost in the C allocator's reuse of freed memory)
KEPT_GRAPH_DEPTH = 128  # layers of the history run's model (the example's DEPTH is 32): each kept loss
# keeps ~4x the nodes, so the process grows ~277 KiB a step (measured on the loaded 2-core machine;
# 52 KiB at depth 32, where RSS's steps of 0-128 KiB and 2 MiB trims moved a least-squares slope to
# 20 KiB), 17x the 16 KiB a step (mem.PROCESS_MIN_BYTES) that "the process outgrows" needs. The
# detached run keeps the example's depth: its process grows 0.2-0.4 KiB a step, 40x under it
KEPT_GRAPH_SCRIPT = """
    import sys
    from neuron_prof.examples import memory_leak as ml

    mode, steps, seconds, depth = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    ml.DEPTH = depth
    ml.train_history(steps, mode, seconds=seconds)
"""


@pytest.fixture(scope="module")
def kept_graph_runs(tmp_path_factory):
    """examples/memory_leak.py's ``history`` (``history.append(loss)``) and ``detached``
    (``history.append(loss.detach())``) recorded as a user would, side by side, each for
    KEPT_GRAPH_SECONDS, then KEPT_GRAPH_SECONDS and KEPT_GRAPH_STEPS steps more, capturing steps 2-4 (``--schedule 1,1,3,1``):
    the process's resident memory is judged at the boundaries of later steps, which the capture
    does not touch. The history run's model is KEPT_GRAPH_DEPTH layers deep."""
    root = tmp_path_factory.mktemp("kept_graph")
    script = write_script(root / "kept_graph.py", KEPT_GRAPH_SCRIPT)
    depth = {"history": KEPT_GRAPH_DEPTH, "detached": ml.DEPTH}
    procs = {mode: subprocess.Popen(
        [sys.executable, "-m", "neuron_prof", "record", "-o", str(root / mode), "--schedule", "1,1,3,1", "--",
         sys.executable, str(script), mode, str(KEPT_GRAPH_STEPS), str(KEPT_GRAPH_SECONDS), str(depth[mode])],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for mode in ml.HISTORY_MODES}
    for p in procs.values():
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    return {mode: root / mode for mode in procs}


def kept_graph_test(fn):
    """A test of kept_graph_runs: two subprocess trainings side by side (KEPT_GRAPH_SECONDS twice and
    KEPT_GRAPH_STEPS steps each), 28 s on the quiet 2-core machine, 100-160 s loaded, about twice
    that with two more busy processes. Its limit covers the fixture's two waits of up to 600 s each."""
    return pytest.mark.multiprocess(pytest.mark.timeout(1500)(fn))


def _loss_storage_bytes() -> int:
    """The storage one kept loss of the example holds (mse_loss over a [BATCH, 1] output)."""
    loss = torch.nn.functional.mse_loss(torch.randn(ml.BATCH, 1, requires_grad=True), torch.randn(ml.BATCH, 1))
    return loss.untyped_storage().nbytes()


@kept_graph_test
def test_kept_graph_grows_the_process_far_beyond_its_tensors(kept_graph_runs):
    run = neuron_prof.load(kept_graph_runs["history"])
    leaks = analyze(run).memory_leaks
    (site,) = leaks.itertuples()
    # tracked tensors: the kept losses alone (backward freed the graphs' saved tensors) ...
    example = Path(ml.__file__).resolve()
    assert site.source.endswith(f"memory_leak.py:{line_of(example, 'LOSS-LINE')}") and site.op == "aten::mse_loss"
    assert site.grad and site.blocks_per_step == 1 and site.growth_per_step == _loss_storage_bytes()
    assert (np.diff(run.memory_steps["live"].to_numpy()) == site.growth_per_step).all()
    # ... while each kept loss keeps every node of its graph: the process grows far faster
    growth = mem.process_growth(run.process_memory, run.steps).iloc[0]
    assert growth["judged"] >= mem.PROCESS_MIN_BOUNDARIES
    assert site.process_growth_per_step == growth["growth_per_step"]
    # ~277 KiB a step against max(4 x 128 B, 16 KiB): 17x (see KEPT_GRAPH_DEPTH)
    assert site.process_growth_per_step > max(mem.PROCESS_FACTOR * site.growth_per_step, mem.PROCESS_MIN_BYTES)
    assert site.process_outgrows and site.kept_graph
    report = cli("report", kept_graph_runs["history"])
    assert report.returncode == 0, report.stderr
    finding = next(line for line in report.stdout.splitlines() if "memory grows" in line)
    assert "the process grows" in finding and "likely a kept autograd graph" in finding
    assert "process resident memory (RSS)" in report.stdout


@kept_graph_test
def test_kept_tensor_without_its_graph_is_not_called_a_graph(kept_graph_runs, memory_runs):
    run = neuron_prof.load(kept_graph_runs["detached"])
    leaks = analyze(run).memory_leaks
    (site,) = leaks.itertuples()  # the same kept storage a step as the history run ...
    history = analyze(neuron_prof.load(kept_graph_runs["history"])).memory_leaks
    assert site.growth_per_step == history["growth_per_step"].iloc[0] and site.op == "aten::mse_loss"
    # ... but no graph: the process does not grow much faster than it (0.2-0.4 KiB a step against the
    # 16 KiB it would need: 40x; see KEPT_GRAPH_DEPTH)
    assert mem.process_growth(run.process_memory, run.steps).iloc[0]["judged"] >= mem.PROCESS_MIN_BOUNDARIES
    assert not site.process_outgrows and not site.kept_graph
    for run_dir in (kept_graph_runs["detached"], memory_runs("clean")):
        report = cli("report", run_dir).stdout
        assert "the process grows" not in report and "kept autograd graph" not in report


@kept_graph_test
def test_memory_page_shows_the_process_next_to_the_tensors(kept_graph_runs, monkeypatch):
    pytest.importorskip("streamlit")
    run = neuron_prof.load(kept_graph_runs["history"])
    at = viewer_page(monkeypatch, kept_graph_runs["history"], "memory", "Memory")
    (warning,) = [w.value for w in at.warning]
    assert warning.startswith("The process grows") and "likely a kept autograd graph" in warning
    metrics = {m.label: m.value for m in at.metric}
    growth = mem.process_growth(run.process_memory, run.steps).iloc[0]["growth_per_step"]
    assert metrics["process (RSS): growth per step"] == format_bytes(growth)
    assert metrics["tracked tensors: growth per step"] == format_bytes(analyze(run).memory_leaks["growth_per_step"].iloc[0])
    chart = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith("-mem_process_chart"))
    rss = chart["data"][0]["y"]
    rss = np.frombuffer(base64.b64decode(rss["bdata"]), dtype=np.dtype(rss["dtype"])) if isinstance(rss, dict) else rss
    np.testing.assert_array_equal(np.asarray(rss), run.process_memory["rss"].to_numpy())
