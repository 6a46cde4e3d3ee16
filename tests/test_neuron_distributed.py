"""Distributed training on the emulated `neuron` device (issue 26): the process-group backend
``"neuron"`` (gloo moves the data, a collective is a kernel on the device's communication stream)
runs DDP, FSDP2 and a DTensor tensor-parallel MLP with losses bitwise equal to the same job on
the CPU with gloo; a captured run shows each collective as a device kernel, and whether the
device's other kernels hid it. Real ranks on 127.0.0.1 (``tests/neuron_dist_script.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import check_trace, free_port, gloo_env, line_of

from neuron_prof.analysis.device_collectives import is_collective_kernel
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.store.run import load

SCRIPT = Path(__file__).with_name("neuron_dist_script.py")
WORLD = 2
TIMEOUT_S = 240

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(2 * TIMEOUT_S)]


def launch(kind: str, device: str, out: Path, run_dir: Path | None = None, **env: str) -> list[list[float]]:
    """Runs WORLD ranks of the job (``env``: more environment); returns each rank's losses."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, str(SCRIPT), kind, device, str(out), *([str(run_dir)] if run_dir else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}  # one thread, as torchrun sets it (see ddp_straggler.py)
    procs = [subprocess.Popen(argv, env={**env, **gloo_env(r, WORLD, port)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    try:
        errs = [p.communicate(timeout=TIMEOUT_S)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, err in zip(procs, errs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text())["losses"] for r in range(WORLD)]


COLLECTIVES_OF = {"ddp-one": {"all_reduce", "broadcast"}, "fsdp": {"all_gather", "reduce_scatter"},
                  "tp": {"all_reduce"}}
"""The collectives each job's steps run: DDP's gradient all-reduce (and the broadcasts of its bucket
rebuild, in its second step), FSDP2's parameter all-gathers and gradient reduce-scatters, the
row-wise layers' all-reduces of tensor parallelism."""


@pytest.mark.parametrize("kind", ["ddp-one", "fsdp", "tp"])
def test_losses_on_the_device_are_bitwise_the_cpus(kind, tmp_path):
    """The device's ranks compute what the CPU's do, captured: every rank's every loss is the same
    float. Each collective of the steps ran as a device kernel traced to its issue, at the
    forward's or the backward's line."""
    cpu = launch(kind, "cpu", tmp_path / "cpu")
    device = launch(kind, "neuron", tmp_path / "neuron", tmp_path / "run")
    assert device == cpu
    assert len(cpu[0]) == 5 and len(set(cpu[0])) > 1  # five steps that trained (the loss moved)
    run = load(tmp_path / "run")
    found = analyze(run).device_collectives.kernels
    assert len(found) == int(is_collective_kernel(run.device_kernels).sum())
    in_steps = found[found["step"] >= 1]
    assert set(in_steps["op"].astype(str)) == COLLECTIVES_OF[kind]
    lines = {f"{SCRIPT.name}:{line_of(SCRIPT, marker)}" for marker in ("FORWARD-LINE", "BACKWARD-LINE")}
    assert {src.rsplit("/", 1)[-1] for src in in_steps["user_source"].astype(str)} <= lines


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory) -> dict[str, object]:
    """DDP captured on the device twice: every gradient in one bucket, and one bucket per two layers."""
    tmp = tmp_path_factory.mktemp("neuron_ddp")
    runs = {}
    for kind in ("ddp-one", "ddp-many"):
        losses = launch(kind, "neuron", tmp / kind, tmp / kind / "run")
        runs[kind] = (load(tmp / kind / "run"), losses, tmp / kind / "run")
    runs["cpu"] = launch("ddp-one", "cpu", tmp / "cpu")
    return runs


def test_a_captured_run_keeps_the_cpus_losses(ddp_runs):
    """Capture changes nothing the job computes: DDP's losses on the device, captured, are the CPU's
    (one bucket or many: the same sums)."""
    assert ddp_runs["ddp-one"][1] == ddp_runs["cpu"]
    assert ddp_runs["ddp-many"][1] == ddp_runs["cpu"]


def test_each_collective_is_a_kernel_on_the_communication_stream(ddp_runs):
    """Every all-reduce DDP issued ran as one device kernel named by its c10d op on a stream of its
    own, matched to its collective row (op, group, seq, bytes) and on both ranks."""
    run = ddp_runs["ddp-many"][0]
    kernels = run.device_kernels
    comm = kernels[is_collective_kernel(kernels)]
    assert set(comm["name"].astype(str)) >= {"c10d::allreduce_"}
    assert comm["stream"].nunique() == 1 and int(comm["stream"].iloc[0]) not in set(
        kernels.loc[~is_collective_kernel(kernels), "stream"])  # no compute kernel on it
    found = analyze(run).device_collectives.kernels
    assert len(found) == len(comm)  # every collective kernel traced to its issue
    coll = run.collectives
    assert len(found) == len(coll)  # and every collective issued ran as a kernel
    reduce = found[found["op"].astype(str) == "all_reduce"]
    param_bytes = 6 * (192 * 192 + 192) * 4
    for rank in range(WORLD):  # each step's all-reduces move every gradient once
        per_step = reduce[reduce["rank"] == rank].groupby("step")["bytes"].sum()
        assert (per_step == param_bytes).all(), per_step
    matched = analyze(run).device_collectives.matched
    assert (matched["ranks_seen"].str.len() == WORLD).all() and (matched["transfer_ns"] >= 0).all()


def _kernels_during(run, rank: int) -> list[int]:
    """Per all-reduce kernel of ``rank``: how many other kernels of its device ran at some point
    while it ran (from the recorded spans)."""
    k = run.device_kernels
    k = k[k["rank"] == rank]
    comm = is_collective_kernel(k)
    c, other = k[comm & (k["name"].astype(str) == "c10d::allreduce_")], k[~comm]
    s, e = other["ts"].to_numpy(), (other["ts"] + other["dur"]).to_numpy()
    return [int(((s < t + d) & (e > t)).sum()) for t, d in zip(c["ts"], c["dur"])]


def test_one_bucket_after_backward_is_exposed(ddp_runs):
    """One bucket, all-reduced once the backward's last gradient is ready: the device's
    communication stream starts it after every backward kernel (it waits for the event recorded
    then), and the optimizer's kernels wait for it (its Work's wait()): no other kernel of the
    device runs during any all-reduce, in any step, on any rank. Causal, not timed."""
    run = ddp_runs["ddp-one"][0]
    for rank in range(WORLD):
        assert _kernels_during(run, rank) and not any(_kernels_during(run, rank))
    overlap = analyze(run).device_collectives.overlap
    assert len(overlap) and (overlap["overlapped_ns"] == 0).all() and (overlap["exposed_ns"] == overlap["comm_ns"]).all()


@pytest.mark.timing
def test_many_buckets_overlap_the_backward(ddp_runs):
    """Buckets all-reduced while the backward still runs: their kernels run beside the backward's
    compute kernels. Scheduling decides how much; with a 100 us launch cost per kernel and three
    buckets per step over four steps on two ranks, at least one all-reduce of the 24 finds a
    compute kernel beside it (each layer's backward takes several kernels, ~1 ms, an all-reduce of
    296 KB over loopback about as long)."""
    run = ddp_runs["ddp-many"][0]
    assert sum(n > 0 for rank in range(WORLD) for n in _kernels_during(run, rank)) > 0
    overlap = analyze(run).device_collectives.overlap
    assert overlap["overlapped_ns"].sum() > 0


def test_the_report_names_collectives_and_the_streams_that_waited(ddp_runs):
    """The report's Device section: communication per step with its exposed part, streams that
    waited for all-reduces, named by the ``loss.backward()`` line (DDP issues them, and waits for
    them, on autograd's thread of the device, where Python has no frame: the line is the backward
    call's, as on the CPU), and the JSON's per-step rows."""
    from neuron_prof.reports.summary.build import summarize

    one = summarize(ddp_runs["ddp-one"][0]).device
    assert [c.rank for c in one.collectives] == list(range(WORLD))
    for c in one.collectives:
        assert c.overlapped_ms == 0 and c.exposed_ms == pytest.approx(c.comm_ms) and c.kernels_per_step >= 1
    waits = [w for w in one.collective_waits if w.op == "all_reduce"]
    backward = f"{SCRIPT.name}:{line_of(SCRIPT, 'BACKWARD-LINE')}"
    assert waits and all(w.user_source.endswith(backward) and w.waited_at.endswith(backward) for w in waits)
    assert {s.step for s in one.collective_steps} >= {1, 2, 3, 4}
    text = subprocess.run([sys.executable, "-m", "neuron_prof", "report", str(ddp_runs["ddp-one"][2])],
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "Collectives on the device" in text.stdout and "Streams waiting for a collective" in text.stdout
    report = json.loads(subprocess.run([sys.executable, "-m", "neuron_prof", "report", "--json",
                                        str(ddp_runs["ddp-many"][2])], capture_output=True, text=True,
                                       timeout=120).stdout)
    steps = report["device"]["collective_steps"]
    assert steps and all(s["kernels"] >= 1 and s["comm_ms"] >= s["overlapped_ms"] >= 0 for s in steps)
    assert np.isclose(sum(s["exposed_ms"] + s["overlapped_ms"] for s in steps), sum(s["comm_ms"] for s in steps))


def test_the_trace_joins_each_collectives_kernels_across_ranks(ddp_runs, tmp_path):
    """The merged trace: each collective's kernel slices on the two ranks' device tracks joined by a
    flow (from the rank whose kernel started last), every trace the strict reader accepts; the
    Chrome export's kernel slices name their collective (op, group, seq, bytes) as its row does."""
    from neuron_prof.export.run_export import export_run

    run, _, run_dir = ddp_runs["ddp-many"]
    out, counts = export_run(run_dir, tmp_path / "t.perfetto-trace")
    rep = check_trace(out)
    device_tracks = {u for u, t in rep.tracks.items() if t["name"].startswith("Device ")}
    flows = [f for f in rep.flows if f.src.track in device_tracks and f.dst.track in device_tracks
             and f.src.name.startswith("c10d::") and f.dst.name.startswith("c10d::")]
    found = analyze(run).device_collectives.kernels
    per_collective = found.groupby(["group", "seq"], observed=True)["rank"].nunique()
    assert (per_collective == WORLD).all()
    assert len(flows) == counts["device_collective_flows"] == len(per_collective)  # one per 2-rank collective
    assert all(rep.process_of(f.src.track) != rep.process_of(f.dst.track) for f in flows)

    chrome, _ = export_run(run_dir, tmp_path / "t.json", fmt="chrome")
    events = json.loads(chrome.read_text())["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X" and e["name"].startswith("c10d::") and "kernel_id" in e["args"]]
    got = sorted((e["args"]["group"], e["args"]["seq"], e["args"]["op"], e["args"]["bytes"], e["args"]["kernel_id"])
                 for e in kernels)
    want = sorted((str(g), int(s), str(o), int(b), int(i)) for g, s, o, b, i in
                  zip(found["group"], found["seq"], found["op"], found["bytes"], found["kernel"]))
    assert got == want


@pytest.mark.timing
def test_the_slow_device_is_the_straggler_on_device_time(tmp_path):
    """Rank 1's device pays 40x the launch cost (``SLOW_RANK``): its host still issues every
    all-reduce at once (the queue is asynchronous), but its device reaches each one last, about
    160 ms a step after rank 0's. Margin: the launch cost is a sleep, the same on a busy machine,
    and the scheduling jitter of a step there is ~10 ms, so the order holds by >10x. The
    device-time analysis names rank 1 in every steady step, each steady collective's last kernel
    is rank 1's, and rank 0's kernels wait for it. Step 0 is left out of the order: its one-time
    costs (first launches, the capture's start) are not bounded by the margin, and on a busy
    machine rank 0 once reached step 0's all-reduce 20 ms after rank 1."""
    from neuron_prof.reports.summary.build import summarize

    run_dir = tmp_path / "run"
    launch("ddp-one", "neuron", tmp_path / "out", run_dir, SLOW_RANK="1")
    run = load(run_dir)
    found = analyze(run).device_collectives
    reduce = found.matched[found.matched["op"] == "all_reduce"]
    steady_reduce = reduce[reduce["step"] > 0]
    assert len(steady_reduce) >= 4 and (steady_reduce["last_rank"] == 1).all(), \
        reduce[["step", "seq", "last_rank", "wait_ns"]]
    waits = found.waits
    assert (waits.loc[(waits["rank"] == 0) & (waits["op"].astype(str) == "all_reduce") & (waits["step"] > 0),
                      "wait_ns"] > 0).all()
    device = summarize(run).device
    named = [s for s in device.stragglers if s.steps]
    steady = set(run.steps.loc[run.steps["rank"] == 1, "step"]) - {0}
    assert [s.rank for s in named] == [1] and set(named[0].steps) == steady & set(reduce["step"]), named
