"""What capturing a training on a device costs, now that the device side comes through PyTorch's
profiler (Kineto): the emulated ``neuron`` device (its Kineto plugin reports kernels, copies,
waits), side by side in one run, modes interleaved (the order rotating per round):

* none: the training alone;
* torch.profiler: ``activities=[CPU, PrivateUse1]`` (ops and the device's activity), its trace
  written with ``export_chrome_trace`` at the end (end to end only);
* neuron_prof full: ``neuron_prof.profile``'s defaults (ops, compiler, memory, collectives,
  device, losses), every step committed to disk;
* neuron_prof device only: ``collectors=["device"]``: the Kineto session and its drains alone;
* neuron_prof always-on: ``mode="always-on"`` (detail one step in 100: the device's trace is
  read in sampled steps only).

Per mode: the median step (the loop's time / steps, median over rounds), its ratio to none, and
the end-to-end time per step (start, stop and writing included). Then the kernels each capture
holds against what the device ran while it recorded (``torch.neuron.traced_kernels``): a capture
that lost kernels would look cheap. Run with neuron_prof of an earlier commit (the backend hook
API's device path), the same script gives that path's figures. The model: a 4-layer MLP (Linear + GELU, 256 wide, batch 64,
AdamW) on the device, the loss read every step (a sync point), each kernel costing LAUNCH_US on
the device.

    .venv/bin/python benchmarks/device_overhead.py [--rounds 7] [--steps 40] [--launch-us 20]

``--split`` times the device collector's parts on one session of ``--steps`` steps instead (median
of ``--rounds``): Kineto's stop and save, the trace's parse (``json`` with exact decimals as
before, orjson as now) and the collector's read (``DeviceCollector._tables``) with its device tables.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import neuron_prof
from neuron_prof.testing import neuron

MODES = ("none", "torch.profiler", "neuron_prof full", "neuron_prof device only", "neuron_prof always-on")
NEURON_PROF = {"neuron_prof full": {}, "neuron_prof device only": {"collectors": ["device"]},
               "neuron_prof always-on": {"mode": "always-on"}}


def model_and_data(dev: torch.device):
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.GELU()]
    model = nn.Sequential(*layers).to(dev)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(64, 256).to(dev)


def train(model, opt, x, steps: int, prof=None) -> float:
    """``steps`` steps; the loop's wall time in ns per step (what the job sees)."""
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if prof is not None:
            prof.step()
    return (time.perf_counter_ns() - t0) / steps


def _traced(reset: bool) -> int:
    """Kernels the device ran while a trace recorded (-1: an emulator from before its Kineto
    profiler, run for the hook API's figures)."""
    traced = getattr(torch.neuron, "traced_kernels", None)
    return sum(n for n, _ in traced(reset).values()) if traced is not None else -1


def run_once(mode: str, steps: int, tmp: Path, parts) -> tuple[float, float, int, int]:
    """(step ns, end-to-end ns per step, kernels the capture holds (-1: not read), kernels the
    device ran while it recorded)."""
    torch.neuron.synchronize()
    _traced(True)
    t0 = time.perf_counter_ns()
    held = -1
    if mode == "none":
        step = train(*parts, steps)
    elif mode == "torch.profiler":
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
            step = train(*parts, steps)
            torch.neuron.synchronize()
        p.export_chrome_trace(str(tmp / f"trace-{time.monotonic_ns()}.json"))
    else:
        run_dir = tmp / f"run-{time.monotonic_ns()}"
        with neuron_prof.profile(run_dir, **NEURON_PROF[mode]) as prof:
            step = train(*parts, steps, prof)
            torch.neuron.synchronize()
        if mode != "neuron_prof always-on":
            held = len(neuron_prof.load(run_dir).device_kernels)
    end_to_end = (time.perf_counter_ns() - t0) / steps
    return step, end_to_end, held, _traced(True)


def reading_split(steps: int, rounds: int, parts) -> None:
    """Median seconds of each part of reading one ``steps``-step device session: Kineto's stop and
    save, the old parse (``json`` with exact decimals) for comparison, and the device collector's
    own read (``DeviceCollector._tables``: orjson, then the device tables, garbage collection
    paused), split into its parse (``read_kineto_json``, timed alone) and the rest."""
    import torch._C._autograd as autograd

    from neuron_prof.backends.device_activity import gc_paused, read_kineto_json
    from neuron_prof.collectors import device

    thread, kind = device._ProfilerThread(), device.device_activity_type()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        for _ in range(rounds):
            device._Kineto(thread, *kind)
            train(*parts, steps)
            torch.neuron.synchronize()
            t0 = time.perf_counter()
            result = thread.call(autograd._disable_profiler)
            t1 = time.perf_counter()
            result.save(path)
            t2 = time.perf_counter()
            data = Path(path).read_bytes()
            with gc_paused():
                t3 = time.perf_counter()
                json.loads(data, parse_float=Decimal)
                t4 = time.perf_counter()
                doc = read_kineto_json(data)
                t5 = time.perf_counter()
            tables = device.DeviceCollector()._tables(data, device._backend_name(), {})
            t6 = time.perf_counter()
            for part, secs in (("Kineto stop", t1 - t0), ("Kineto save", t2 - t1), ("json parse (Decimal)", t4 - t3),
                               ("orjson parse", t5 - t4), ("device tables", (t6 - t5) - (t5 - t4)),
                               ("collector's read", t6 - t5)):
                times.setdefault(part, []).append(secs)
    print(f"{steps} steps: {len(doc['traceEvents'])} events, {len(data) / 1e6:.1f} MB of JSON, "
          f"{len(tables)} device rows (medians of {rounds}; device tables: the collector's read less the parse)")
    for part, secs in times.items():
        print(f"{part:22s} {statistics.median(secs):7.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--launch-us", type=float, default=20.0)
    ap.add_argument("--split", action="store_true", help="time the reading's parts instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    neuron.enable(launch_us=args.launch_us)
    parts = model_and_data(torch.device("neuron:0"))
    train(*parts, 5)  # shapes cached
    if args.split:
        reading_split(args.steps, args.rounds, parts)
        return
    steps: dict[str, list[float]] = {m: [] for m in MODES}
    ends: dict[str, list[float]] = {m: [] for m in MODES}
    counts: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                step, end, held, truth = run_once(mode, args.steps, Path(tmp), parts)
                steps[mode].append(step)
                ends[mode].append(end)
                if held >= 0:
                    counts[mode] = (held, truth)
    base = statistics.median(steps["none"])
    print(f"emulated neuron device, launch {args.launch_us:g} us, {args.steps} steps x {args.rounds} rounds "
          f"(medians)")
    print(f"{'mode':26s} {'step ms':>8s} {'x none':>7s} {'end to end ms/step':>19s}")
    for mode in MODES:
        s = statistics.median(steps[mode])
        print(f"{mode:26s} {s / 1e6:8.3f} {s / base:7.3f} {statistics.median(ends[mode]) / 1e6:19.3f}")
    for mode, (held, truth) in counts.items():
        print(f"{mode}: {held} kernels held of {truth} the device ran while it recorded (last round)")
    tp, full = statistics.median(steps["torch.profiler"]) - base, statistics.median(steps["neuron_prof full"]) - base
    print(f"neuron_prof full's overhead / torch.profiler's: {full / tp:.2f}" if tp > 0 else
          "torch.profiler's overhead is within the noise")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
