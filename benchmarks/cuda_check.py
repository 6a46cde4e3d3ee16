"""The device path on a real CUDA GPU: a capture's device tables against torch.profiler's trace of
the same workload. The check to run when a GPU machine is at hand (our CI has none; the Kineto
path is tested there on the emulated device's activity profiler).

One process, one GPU; each workload runs its steps once under ``neuron_prof.profile`` and once
under ``torch.profiler`` (CPU + CUDA), after a warm-up, with the same seeds:

* eager: an MLP's forward, backward and AdamW step, its batch copied host-to-device on a side
  stream whose event the default stream waits for, and the loss read (``.item()``: a copy to the
  host and a host wait);
* compiled: the same model under ``torch.compile`` (Inductor's Triton kernels);
* nccl: a world-size-1 NCCL all-reduce of the gradients (``init_process_group("nccl")`` on
  127.0.0.1), so collective kernels run beside compute.

Per workload it prints, then checks: kernels (count) and busy ns per stream, neuron_prof's vs the
trace's (equal counts; busy within 2%: the two windows are different steps of the same work);
copies by direction (equal counts); the share of kernels whose launch has a host op and a source
line (at least 95%); the caching allocator's allocations on cuda:0 tracked; for nccl, NCCL
kernels found as collectives; no device gap. Exit 1 if a check fails.

    python benchmarks/cuda_check.py [--steps 5] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import neuron_prof
from neuron_prof.analysis.device_collectives import is_collective_kernel
from neuron_prof.analysis.run_analysis import analyze

DEV = torch.device("cuda:0")


def make(compiled: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(DEV)
    opt = torch.optim.AdamW(model.parameters())
    return (torch.compile(model) if compiled else model), opt


def step(model, opt, side: torch.cuda.Stream, allreduce: bool) -> None:
    host = torch.randn(256, 1024, pin_memory=True)
    with torch.cuda.stream(side):
        x = host.to(DEV, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    torch.cuda.current_stream().wait_event(ready)
    x.record_stream(torch.cuda.current_stream())
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    if allreduce:
        import torch.distributed as dist
        for p in model.parameters():
            dist.all_reduce(p.grad)
    opt.step()
    loss.item()


def trace_facts(path: Path) -> dict:
    events = json.loads(path.read_text(), parse_float=Decimal)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    per: dict[str, list[int]] = {}
    for k in kernels:
        n = per.setdefault(str(k["args"].get("stream")), [0, 0])
        n[0] += 1
        n[1] += int(k["dur"] * 1000)
    copies = Counter(str(e["name"]).split()[1] for e in events if e.get("cat") == "gpu_memcpy")
    return {"streams": per, "copies": dict(copies)}


def run_facts(run_dir: Path) -> dict:
    run = neuron_prof.load(run_dir)
    k = run.device_kernels
    per: dict[str, list[int]] = {}
    for r in k.itertuples():
        n = per.setdefault(str(r.stream), [0, 0])
        n[0] += 1
        n[1] += int(r.dur)
    corr = analyze(run).device_correlation
    named = corr[corr["kernel"] >= 0]
    attributed = float(((named["host_op"].astype(str) != "") & (named["source"].astype(str) != "")).mean()) \
        if len(named) else 0.0
    return {"streams": per, "copies": dict(Counter(run.device_copies["kind"].astype(str))),
            "attributed": attributed, "collective_kernels": int(is_collective_kernel(k).sum()) if len(k) else 0,
            "gaps": len(run.device_gaps),
            "cuda_memory_events": int((run.memory_events["device"].astype(str) == "cuda:0").sum())}


def check(name: str, mine: dict, theirs: dict, allreduce: bool) -> list[str]:
    bad = []
    for s, (n, busy) in theirs["streams"].items():
        got = mine["streams"].get(s, [0, 0])
        if got[0] != n:
            bad.append(f"{name}: stream {s}: {got[0]} kernels captured, {n} in torch.profiler's trace")
        if abs(got[1] - busy) > 0.02 * busy:
            bad.append(f"{name}: stream {s}: busy {got[1]} ns captured vs {busy} ns traced (over 2%)")
    if mine["copies"] != theirs["copies"]:
        bad.append(f"{name}: copies {mine['copies']} captured vs {theirs['copies']} traced")
    if mine["attributed"] < 0.95:
        bad.append(f"{name}: {100 * mine['attributed']:.1f}% of kernels' launches have a host op and line")
    if allreduce and not mine["collective_kernels"]:
        bad.append(f"{name}: no NCCL kernel counted as a collective")
    if not mine["cuda_memory_events"]:
        bad.append(f"{name}: no allocation of the caching allocator on cuda:0 tracked")
    if mine["gaps"]:
        bad.append(f"{name}: {mine['gaps']} device gaps in the capture")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="cuda_check-"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    import torch.distributed as dist
    dist.init_process_group("nccl", rank=0, world_size=1)
    side = torch.cuda.Stream()
    failures: list[str] = []
    report = {}
    for name, compiled, allreduce in (("eager", False, False), ("compiled", True, False), ("nccl", False, True)):
        model, opt = make(compiled)
        for _ in range(3):  # warm: compiled, cuBLAS and NCCL set up
            step(model, opt, side, allreduce)
        torch.cuda.synchronize()
        with neuron_prof.profile(out / f"{name}-run") as prof:
            for _ in range(args.steps):
                step(model, opt, side, allreduce)
                prof.step()
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(args.steps):
                step(model, opt, side, allreduce)
            torch.cuda.synchronize()
        p.export_chrome_trace(str(out / f"{name}-trace.json"))
        mine, theirs = run_facts(out / f"{name}-run"), trace_facts(out / f"{name}-trace.json")
        report[name] = {"captured": mine, "torch.profiler": theirs}
        failures += check(name, mine, theirs, allreduce)
    dist.destroy_process_group()
    print(json.dumps(report, indent=1))
    for f in failures:
        print("FAIL", f)
    print(f"{'all checks met' if not failures else f'{len(failures)} checks failed'}; runs and traces in {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
