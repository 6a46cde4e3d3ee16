"""Device activity through PyTorch's profiler (issue 37): the emulated `neuron` device reports its
kernels, copies, waits and CPU fallbacks as a real backend does, to Kineto (a PrivateUse1 activity
profiler); plain ``torch.profiler`` sees them, ``neuron-prof import`` reads them back, a capture
reads them through the same path, and ``export --format kineto`` writes them so the same importer
reads the same run. The device's own count of what it ran (``traced_kernels``) is the truth each
view is held against. Workloads run in processes of their own (``tests/kineto_device_script.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import cli, free_port, gloo_env, script_facts

from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.store.run import load
from neuron_prof.reports.summary.build import summarize

SCRIPT = Path(__file__).with_name("kineto_device_script.py")
STEPS = 4  # the script's windows

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]


def trace_events(path: Path) -> list[dict]:
    return json.loads(path.read_text(), parse_float=Decimal)["traceEvents"]


def ns(us: Decimal) -> int:
    """A Kineto JSON time (µs, three decimals) in ns, exact."""
    return int(us * 1000)


def per_stream(kernels) -> dict[str, list[int]]:
    """A run's device kernels as the device counts them: per "device:stream", [kernels, ns]."""
    out: dict[str, list[int]] = {}
    for r in kernels.itertuples():
        got = out.setdefault(f"{int(r.device.split(':')[1])}:{r.stream}", [0, 0])
        got[0] += 1
        got[1] += int(r.dur)
    return out


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The same training under plain torch.profiler (its trace) and then captured (a run)."""
    d = tmp_path_factory.mktemp("kineto")
    facts = script_facts(SCRIPT, "windows", d / "trace.json", d / "run")
    return d / "trace.json", d / "run", facts


def test_plain_torch_profiler_sees_every_kernel_the_device_ran(windows):
    """The trace torch.profiler writes holds the device's kernels, as many and as long per stream
    as the device ran while it recorded; each kernel and copy is bound to the host call that
    launched it (an ac2g flow and a runtime event with its correlation id)."""
    trace, _, facts = windows
    events = trace_events(trace)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    got: dict[str, list[int]] = {}
    for k in kernels:
        n = got.setdefault(f"{k['args']['device']}:{k['args']['stream']}", [0, 0])
        n[0] += 1
        n[1] += ns(k["dur"])
    assert got == facts["profiled"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert len(copies) >= STEPS  # loss.item() in every step copies the loss to the host
    launched = {e["args"]["correlation"] for e in events if e.get("cat") == "privateuse1_runtime"}
    flows = {e["id"] for e in events if e.get("cat") == "ac2g" and e["ph"] == "f"}
    for e in kernels + copies:
        assert e["args"]["correlation"] in launched and e["args"]["correlation"] in flows, e


def test_an_imported_trace_and_a_capture_hold_what_the_device_ran(windows, tmp_path):
    """``neuron-prof import`` of that trace and the capture of the next steps each hold exactly
    the kernels the device ran in their window (count and device ns per stream), with the host
    line that queued them, and the copies to the host."""
    trace, run_dir, facts = windows
    res = cli("import", trace, "-o", tmp_path / "imported")
    assert res.returncode == 0, res.stderr
    kernels = sum(n for n, _ in facts["profiled"].values())
    assert f"rank 0: " in res.stdout and f"{kernels} device kernels" in res.stdout, res.stdout
    assert "neuron, world size 1" in res.stdout
    imported = load(tmp_path / "imported")
    assert per_stream(imported.device_kernels) == facts["profiled"]

    run = load(run_dir)
    assert per_stream(run.device_kernels) == facts["captured"]
    assert run.device_gaps.empty
    copies = run.device_copies
    assert (copies["kind"].astype(str) == "DtoH").sum() >= STEPS and (copies["bytes"] > 0).all()
    # the kernels' ops were queued by the script's lines (host context joined from the ops)
    lines = set(analyze(run).device_correlation["source"].astype(str))
    assert any(x.startswith("tests/kineto_device_script.py:") for x in lines), lines


def test_the_jobs_own_profiler_inside_a_capture_is_a_gap_not_an_idle_device(tmp_path):
    """The job runs its own torch.profiler (steps 1-3) inside a capture of every step: the losses
    are the same as without either; the job's trace holds the device's kernels of its steps; the
    capture says which steps it has no device trace for and why, gives them no verdict (an idle
    device there would be a false "host-bound"), and has the kernels of the steps around them.
    A capture started while the job's profiler runs says so too."""
    traces = tmp_path / "traces"
    traces.mkdir()
    facts = script_facts(SCRIPT, "coexist", tmp_path / "run", traces)
    assert facts["plain"] == facts["both"]

    inside = trace_events(traces / "inside.json")
    assert sum(e.get("cat") == "kernel" for e in inside) > 0
    assert {e["name"] for e in inside if str(e["name"]).startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                                          "ProfilerStep#3"}
    run = load(tmp_path / "run")
    # the job's profiler's step ranges are its bookkeeping, not the job's ops
    assert not run.ops["name"].astype(str).str.startswith("ProfilerStep#").any()
    (gap,) = run.device_gaps.itertuples()
    assert "the job's own torch.profiler was running" in gap.reason
    with_kernels = set(run.device_kernels["step"])
    assert with_kernels.isdisjoint({1, 2, 3}) and {0, 4, 5} <= with_kernels
    assert set(analyze(run).device_steps["step"]).isdisjoint({0, 1, 2, 3})
    rep = cli("report", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    assert "rank 0: no device trace in steps 0-3 (device figures leave them out): the job's own torch.profiler" \
        in rep.stdout.split("\nFindings\n", 1)[1].split("\n\n", 1)[0]

    later = load(tmp_path / "run-inside")
    (gap,) = later.device_gaps.itertuples()
    assert "the job's own torch.profiler was running" in gap.reason and later.device_kernels.empty
    assert sum(e.get("cat") == "kernel" for e in trace_events(traces / "outside.json")) > 0


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: tuple[int, int], spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(a[1], b) - max(a[0], s)) for s, b in spans)


PARAMS = 64 * 256 + 256 + 256 * 64 + 64  # the script's DDP model


def test_a_folder_of_ranks_traces_is_one_distributed_run(tmp_path):
    """Two DDP ranks on the device (the group made with no backend named: the device's own),
    each under plain torch.profiler: importing the folder of their traces gives one run of world
    size 2 whose per-rank kernels, all-reduce bytes, and collective time overlapped by compute
    are what the traces' own events say."""
    traces = tmp_path / "traces"
    traces.mkdir()
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "ddp", str(traces)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **gloo_env(r, 2, port)}) for r in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    facts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert {f["backend"] for f in facts} == {"cpu:gloo,neuron:neuron"}

    res = cli("import", traces, "-o", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "neuron, world size 2" in res.stdout
    run = load(tmp_path / "run")
    assert sorted(run.ranks) == [0, 1]
    found = analyze(run).device_collectives.overlap
    fusion = {f.rank: f for f in summarize(run).device.fusion}
    for rank in (0, 1):
        events = trace_events(traces / f"rank{rank}.json")
        kernels = [e for e in events if e.get("cat") == "kernel"]
        assert (run.device_kernels["rank"] == rank).sum() == len(kernels)
        # the all-reduces of each step carry every gradient once
        mine = run.collectives[run.collectives["rank"] == rank]
        assert (mine["op"].astype(str) == "all_reduce").all()
        assert mine.groupby("step")["bytes"].sum().tolist() == [4 * PARAMS] * 3
        # collective time in the steps, and how much of it other kernels hid, from the raw events
        steps = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in events
                 if str(e.get("name", "")).startswith("ProfilerStep#")]
        spans = [(ns(k["ts"]), ns(k["ts"]) + ns(k["dur"]), k["name"].startswith("c10d::")) for k in kernels]
        compute = _union([(a, b) for a, b, c in spans if not c])
        comm = [(a, b) for a, b, c in spans if c]
        comm_ns = sum(_overlap(c, steps) for c in comm)
        hidden = sum(_overlap(c, [(max(a, s), min(b, e)) for a, b in compute for s, e in steps if a < e and s < b])
                     for c in comm)
        got = found[found["rank"] == rank]
        assert int(got["comm_ns"].sum()) == comm_ns and comm_ns > 0
        assert int(got["overlapped_ns"].sum()) == hidden
        # fusion and the launch bound are over the compute kernels: the collectives are counted apart
        assert (fusion[rank].kernels, fusion[rank].collective_kernels) == (len(kernels) - len(comm), len(comm))


def test_export_kineto_is_read_back_as_the_same_run(device_run, tmp_path):
    """``export --format kineto`` writes a torch.profiler-shaped trace per rank; importing it
    gives the captured run's kernels, copies, waits, fallbacks and ops again, to the ns."""
    res = cli("export", device_run, "--format", "kineto", "-o", tmp_path / "traces")
    assert res.returncode == 0, res.stderr
    (trace,) = sorted((tmp_path / "traces").iterdir())
    assert trace.name == "rank-00000.json"
    assert cli("import", tmp_path / "traces", "-o", tmp_path / "back").returncode == 0
    a, b = load(device_run), load(tmp_path / "back")

    def rows(df, cols):
        return sorted(map(tuple, df[cols].astype(str).to_numpy().tolist()))

    assert len(a.device_kernels) > 0
    assert rows(a.device_kernels, ["ts", "dur", "name", "stream", "n_ops"]) == \
        rows(b.device_kernels, ["ts", "dur", "name", "stream", "n_ops"])
    assert rows(a.device_copies, ["ts", "dur", "kind", "bytes"]) == rows(b.device_copies, ["ts", "dur", "kind", "bytes"])
    assert rows(a.queue_flushes, ["ts", "dur", "reason"]) == rows(b.queue_flushes, ["ts", "dur", "reason"])
    assert rows(a.fallbacks, ["ts", "dur", "op", "bytes_to_host"]) == rows(b.fallbacks, ["ts", "dur", "op",
                                                                                      "bytes_to_host"])
    assert Counter(a.ops["name"].astype(str)) == Counter(b.ops["name"].astype(str))


def test_a_trace_with_what_the_importer_does_not_read_says_what_it_left_out(windows, tmp_path):
    """A trace with an activity kind neuron_prof does not know and a kernel without a time is
    imported (exit 0) with the rest, and the import names what it left out and how many."""
    trace, _, facts = windows
    doc = json.loads(trace.read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    del kernels[0]["ts"]
    doc["traceEvents"] += [{"ph": "X", "cat": "gpu_hw_counter", "name": "sm_active", "pid": 0, "tid": 0,
                            "ts": kernels[1]["ts"], "dur": 1.0}] * 3
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(doc))
    res = cli("import", odd, "-o", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "left out: 3 gpu_hw_counter events (an activity kind neuron_prof does not read)" in res.stdout
    assert "left out: 1 kernel events without a name, a numeric pid and tid, or a time" in res.stdout
    assert len(load(tmp_path / "run").device_kernels) == sum(n for n, _ in facts["profiled"].values()) - 1


def test_host_calls_named_by_kinetos_thread_ids_get_their_os_threads(windows, tmp_path):
    """A Kineto session with no CPU activity (a capture's) names CUDA's runtime calls by
    ``libkineto::threadId()``, pthread_self's low 32 bits, not the OS tid the ops carry. The op
    observer knows that id of every thread it saw, and the device tables take the OS tid back,
    so each launch still joins the host op that made it."""
    import ctypes
    import threading

    import torch

    import neuron_prof
    from neuron_prof.collectors import device as dev
    from neuron_prof.backends.device_activity import device_tables

    with neuron_prof.profile(tmp_path / "run", collectors=["eager"]) as prof:
        torch.ones(4).add(1)  # an op: the observer meets this thread
        prof.step()
    kineto_id = ctypes.c_int32(threading.get_ident() & 0xFFFFFFFF).value
    assert dev._kineto_threads()[kineto_id] == threading.get_native_id()

    trace, _, _ = windows
    events = trace_events(trace)
    launches = [e for e in events if e.get("cat") == "privateuse1_runtime"]
    os_tid = launches[0]["tid"]
    fake = -123456789  # a pthread id's low 32 bits, as CUPTI would write it
    for e in launches:
        if e["tid"] == os_tid:
            e["tid"] = fake
    named = device_tables(events, label=lambda i: f"neuron:{i}").enqueues
    mapped = device_tables(events, label=lambda i: f"neuron:{i}", threads={fake: os_tid}).enqueues
    assert (named["tid"] == fake).sum() > 0 and (mapped["tid"] == fake).sum() == 0
    assert (mapped["tid"] == os_tid).sum() == (named["tid"] == fake).sum() + (named["tid"] == os_tid).sum()
