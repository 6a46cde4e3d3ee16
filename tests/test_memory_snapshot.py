"""``neuron-prof export RUN --format memory-snapshot``: PyTorch's memory snapshot pickle from real
captured runs of examples/memory_leak.py, checked against torch's own layout and viewer code."""
from __future__ import annotations

import base64
import json
import pickle
import pickletools
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch.cuda import _memory_viz

import neuron_prof
from conftest import cli, line_of, one_line_error
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import memory_leak as ml
from neuron_prof.export import memory_snapshot as ms

EXAMPLE = Path(ml.__file__).resolve()
SPIKE_BYTES = 4 * ml.SPIKE * ml.BATCH * ml.IN  # 2,097,152
TRACE_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"}
# the pickle opcodes MemoryViz.js (https://pytorch.org/memory_viz) decodes; anything else fails there
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
                  "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
                  "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE", "BININT",
                  "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE"}


def export(run_dir: Path, out: Path | None, *flags: str) -> dict:
    """Export through the CLI as a user would; returns the snapshot (our own pickle)."""
    res = cli("export", run_dir, "--format", "memory-snapshot", *(["-o", out] if out else []), *flags)
    assert res.returncode == 0, res.stderr
    path = Path(res.stdout.strip())
    assert path == (out or run_dir / "memory-snapshot.pickle") and "pytorch.org/memory_viz" in res.stderr
    data = path.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= VIEWER_OPCODES
    snap = pickle.loads(data)
    check_layout(snap)
    return snap


def check_layout(snap: dict) -> None:
    """Keys and types of torch.cuda.memory._snapshot()'s Snapshot / Segment / Block / TraceEntry."""
    assert set(snap) == {"segments", "device_traces"}

    def frames_ok(frames):
        return isinstance(frames, list) and all(
            set(f) == {"filename", "line", "name"} and isinstance(f["filename"], str) and isinstance(f["line"], int)
            and isinstance(f["name"], str) for f in frames)

    for trace in snap["device_traces"]:
        assert isinstance(trace, list) and trace[-1]["action"] == "snapshot"
        times = [e["time_us"] for e in trace]
        assert times == sorted(times) and all(type(t) is int for t in times)
        for e in trace:
            assert e["action"] in TRACE_ACTIONS and frames_ok(e["frames"]) and e["stream"] == 0
            assert type(e["size"]) is int and e["size"] >= 0
            assert type(e["device_free" if e["action"] == "oom" else "addr"]) is int
    for seg in snap["segments"]:
        assert {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "frames", "blocks"} <= set(seg)
        assert all(type(seg[k]) is int for k in ("device", "address", "total_size", "allocated_size", "active_size",
                                                   "requested_size", "stream"))
        assert seg["segment_type"] in ("small", "large") and seg["segment_pool_id"] == (0, 0)
        assert 0 <= seg["device"] < len(snap["device_traces"]) and frames_ok(seg["frames"])
        addr = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == {"address", "size", "requested_size", "state", "frames"} and frames_ok(b["frames"])
            assert b["address"] == addr and b["state"] in ("active_allocated", "active_pending_free", "inactive")
            addr += b["size"]
        assert addr - seg["address"] == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")


def active_bytes(snap: dict) -> int:
    return sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")


def replay(trace: list[dict]) -> tuple[int, int]:
    """Live and peak bytes from the trace, as the viewer's timeline pairs allocs with frees."""
    live, peak, blocks = 0, 0, {}
    for e in trace:
        if e["action"] == "alloc":
            assert e["addr"] not in blocks, "address allocated twice without a free"
            blocks[e["addr"]] = e["size"]
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            assert blocks.pop(e["addr"]) == e["size"], "free of a block that is not live"
            live -= e["size"]
    return live, peak


def user_frame(frames: list[dict]) -> dict:
    """The innermost Python frame (the op frames before it have no source file)."""
    return next((f for f in frames if f["filename"] != ms.NATIVE_FILE), {})


def test_spike_exports_to_torch_layout_with_its_line_and_lifetime(memory_runs, tmp_path):
    run_dir = tmp_path / "spike"
    shutil.copytree(memory_runs("spike"), run_dir)
    snap = export(run_dir, None)  # default output: RUN/memory-snapshot.pickle
    run = neuron_prof.load(run_dir)
    allocs = analyze(run).memory_allocations
    trace = snap["device_traces"][0]
    assert len(snap["device_traces"]) == 1  # cpu -> device 0
    assert sum(e["action"] == "alloc" for e in trace) == (allocs["rank"] == 0).sum() > 0
    assert sum(e["action"] == "free_completed" for e in trace) == (allocs["free_ts"] != mem.NEVER).sum()

    spikes = [i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == SPIKE_BYTES]
    assert len(spikes) == 1
    spike = trace[spikes[0]]
    assert user_frame(spike["frames"]) == {"filename": str(EXAMPLE), "line": line_of(EXAMPLE, "# SPIKE-LINE"),
                                           "name": "train"}
    assert [f["name"] for f in spike["frames"] if f["filename"] == ms.NATIVE_FILE] == ["aten::empty",
                                                                                       "aten::contiguous"]
    assert spike["category"] == "temporary"
    later = [e for e in trace[spikes[0] + 1:] if e.get("addr") == spike["addr"]]
    assert [e["action"] for e in later[:3]] == ["free_requested", "free_completed", "segment_free"]
    assert all(e["size"] == SPIKE_BYTES and e["time_us"] >= spike["time_us"] for e in later[:3])
    start_us = run.meta["start_time_ns"] // 1000
    assert start_us <= spike["time_us"] <= later[0]["time_us"] < start_us + 600_000_000  # wall clock, us

    # the viewer's timeline reaches the run's own peak (step 4's spike), and ends where capture did
    live, peak = replay(trace)
    assert peak == run.memory_steps["peak"].max() >= SPIKE_BYTES
    assert live == active_bytes(snap) == allocs.loc[allocs["free_ts"] == mem.NEVER, "bytes"].sum()

    # torch's own viewer pages embed the snapshot as they are given it
    for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
        html = plot(snap)
        assert html.lstrip().startswith("<!DOCTYPE html>") and "MemoryViz.js" in html
        embedded = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))[0]["base64"]
        assert pickle.loads(base64.b64decode(embedded)) == snap


def test_leak_step_snapshots_hold_what_was_live_and_grow_by_the_leak(memory_runs, tmp_path):
    run_dir = memory_runs("leak")
    run = neuron_prof.load(run_dir)
    ends, allocs = run.steps.set_index("step"), analyze(run).memory_allocations
    snaps = {k: export(run_dir, tmp_path / f"step{k}.pickle", "--step", str(k)) for k in (2, 5)}
    leak_line = line_of(EXAMPLE, "# LEAK-LINE")
    for k, snap in snaps.items():
        end = int(ends.loc[k, "ts"] + ends.loc[k, "dur"])
        live = mem.live_at(allocs, end, rank=0)
        assert active_bytes(snap) == live["bytes"].sum() == run.memory_steps.set_index("step").loc[k, "live"]
        assert replay(snap["device_traces"][0])[0] == active_bytes(snap)
        assert sum(e["action"] == "alloc" for e in snap["device_traces"][0]) == (allocs["alloc_ts"] <= end).sum()
        # each step's kept validation graph: relu output, model output and the scalar, from the leak line
        kept = [seg for seg in snap["segments"] if user_frame(seg["frames"]).get("line") == leak_line]
        assert len(kept) == 3 * (k + 1)
        assert sum(seg["total_size"] for seg in kept) == (k + 1) * 4 * (ml.BATCH * ml.HIDDEN + ml.BATCH * ml.OUT + 1)
    growth = active_bytes(snaps[5]) - active_bytes(snaps[2])
    assert growth == 3 * ml.leaked_bytes_per_step()

    # the end of capture: train() returned inside it, so the leaked graphs were freed there too
    full = export(run_dir, tmp_path / "all.pickle")
    assert active_bytes(full) == allocs.loc[allocs["free_ts"] == mem.NEVER, "bytes"].sum()
    assert replay(full["device_traces"][0]) == (active_bytes(full), run.memory_steps["peak"].max())


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory) -> Path:
    """Three leaking steps, then an allocation larger than the address space: capture ends with
    the leaked graphs still live."""
    run_dir = tmp_path_factory.mktemp("oom") / "run"
    with pytest.raises(RuntimeError, match="allocate"):
        with neuron_prof.profile(run_dir, collectors=["eager", "memory"]) as prof:
            history = ml.train(3, "leak", prof)
            torch.empty(1 << 50, dtype=torch.uint8)  # 1 PiB
    assert len(history) == 3
    return run_dir


def test_oom_and_the_live_set_at_the_end_of_capture(oom_run, tmp_path):
    snap = export(oom_run, tmp_path / "oom.pickle", "--rank", "0")
    run = neuron_prof.load(oom_run)
    trace = snap["device_traces"][0]
    ooms = [e for e in trace if e["action"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["size"] == 1 << 50 and ooms[0]["device_free"] == 0  # CPU says nothing
    assert trace.index(ooms[0]) > max(i for i, e in enumerate(trace) if e["action"] == "alloc")

    allocs = analyze(run).memory_allocations
    never = allocs[allocs["free_ts"] == mem.NEVER]
    at_oom = mem.live_at(allocs, int(run.memory_ooms["ts"].iloc[0]))
    assert active_bytes(snap) == never["bytes"].sum() == at_oom["bytes"].sum() > 3 * ml.leaked_bytes_per_step()
    assert sorted(seg["address"] for seg in snap["segments"]) == sorted(never["addr"])
    assert replay(trace)[0] == active_bytes(snap)

    # torch's pure-Python tools read it: the allocator summary, the trace listing, the flame graph input
    summary = _memory_viz.segsum(snap)  # asserts its own accounting of every segment
    assert f"segments: {len(never)}" in summary
    assert "raise OutOfMemoryError # 1.0PiB requested" in _memory_viz.trace(snap)
    stacks = _memory_viz.memory(snap, format_flamegraph=lambda lines: lines)  # root first, as flamegraph.pl reads
    assert f"memory_leak.py:{line_of(EXAMPLE, '# LEAK-LINE')}:train;??:0:aten::mean" in stacks


def test_device_indices_and_free_bytes_of_an_oom_message():
    assert ms.device_indices(["cpu"]) == {"cpu": 0}
    assert ms.device_indices(["privateuseone:0", "cpu"]) == {"privateuseone:0": 0, "cpu": 1}
    assert ms.device_indices(["cuda:1", "cpu", "cuda:0"]) == {"cuda:0": 0, "cuda:1": 1, "cpu": 2}
    cuda = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
            "1.50 GiB is free. Including non-PyTorch memory, this process has 77.6 GiB memory in use.")
    assert ms.device_free(cuda) == 3 << 29
    assert ms.device_free("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.") == 0


def test_run_without_memory_data(tmp_path):
    run_dir = tmp_path / "eager-only"
    with neuron_prof.profile(run_dir, collectors=["eager"]) as prof:
        ml.train(2, "clean", prof)
    one_line_error(cli("export", run_dir, "--format", "memory-snapshot"), str(run_dir), "no memory data",
                    "--collectors eager,compiler,memory")
    assert not (run_dir / "memory-snapshot.pickle").exists()


def test_wrong_rank_or_step(memory_runs, tmp_path):
    run_dir = memory_runs("spike")
    out = tmp_path / "s.pickle"
    one_line_error(cli("export", run_dir, "--format", "memory-snapshot", "--rank", "7", "-o", out),
                    str(run_dir), "no rank 7", "ranks: 0", "--rank")
    one_line_error(cli("export", run_dir, "--format", "memory-snapshot", "--step", "99", "-o", out),
                    str(run_dir), "no step 99", "--step")
    one_line_error(cli("export", run_dir, "--rank", "0", "-o", tmp_path / "t.perfetto-trace"),
                    "--format memory-snapshot")
    assert not out.exists()
