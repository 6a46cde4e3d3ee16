"""Step-time overhead: nothing vs torch.profiler vs neuron_prof's modes, side by side in one run.

    .venv/bin/python benchmarks/overhead.py [--rounds 7] [--steps 30] [--widths 512,64] [--json F]

Two 4-layer MLPs (Linear + GELU, batch 64, AdamW, one intra-op thread): 512 wide (compute-bound)
and 64 wide (launch-bound: per-op cost dominates). Modes run interleaved (round-robin, the order
rotating per round) so machine noise hits all alike; each reports the median step time, its
ratio to the uncaptured loop, and the median time spent in the step-boundary call itself
(``prof.step()``: work on the training thread between two steps).

* torch.profiler: ``record_shapes=True, with_stack=True, profile_memory=True`` (the detail
  neuron_prof records); "end to end" adds its trace processing (``key_averages()``) per step;
* neuron_prof eager: op capture only (collectors eager + compiler);
* neuron_prof default: ``neuron_prof.profile``'s defaults (ops, compiler, memory, collectives,
  device), every step committed to disk;
* neuron_prof always-on: ``mode="always-on"``, the detail of the last 20 steps in memory.

Per op: (eager - none - eager's prof.step()) / ops per step, ops counted in a captured step;
memory tracking on top: default / eager.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

import neuron_prof

MODES = ("none", "torch.profiler", "neuron_prof eager", "neuron_prof default", "neuron_prof always-on")
NEURON_PROF = {"neuron_prof eager": {"collectors": ["eager", "compiler"]}, "neuron_prof default": {},
               "neuron_prof always-on": {"mode": "always-on"}}


def make_model(width: int, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def capture(mode: str, tmp: Path):
    if mode in NEURON_PROF:
        return neuron_prof.profile(tmp / f"run-{time.monotonic_ns()}", **NEURON_PROF[mode])
    if mode == "torch.profiler":
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                      with_stack=True, profile_memory=True)
    return contextlib.nullcontext()


def run_once(mode: str, width: int, steps: int, tmp: Path) -> tuple[list[float], list[float], float]:
    """Step times, step-boundary times (s) and end-to-end seconds per step of one captured loop."""
    torch.manual_seed(0)
    model = make_model(width)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(64, width), torch.randn(64, width)
    for _ in range(3):  # allocator and kernel warm-up, outside capture
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    times, boundary = [], []
    t_start = time.perf_counter()
    with capture(mode, tmp) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter()
            if mode != "none":
                prof.step()  # torch.profiler's too: its ProfilerStep ranges
            t2 = time.perf_counter()
            times.append(t2 - t0)
            boundary.append(t2 - t1)
    if mode == "torch.profiler":
        prof.key_averages()  # what a user does next; makes the trace processing part of end-to-end
    return times, boundary, (time.perf_counter() - t_start) / steps


def ops_per_step(width: int, tmp: Path) -> float:
    run_dir = tmp / f"count-{width}"
    torch.manual_seed(0)
    model = make_model(width)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(64, width), torch.randn(64, width)
    with neuron_prof.profile(run_dir, collectors=["eager"]) as prof:
        for _ in range(4):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    ops = neuron_prof.load(run_dir).ops
    return float((ops["step"] == 2).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--widths", default="512,64")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run_once("neuron_prof default", 64, 2, tmp)  # build/load the extension outside the measurement
        for width in map(int, args.widths.split(",")):
            steps: dict[str, list[float]] = {m: [] for m in MODES}
            bounds: dict[str, list[float]] = {m: [] for m in MODES}
            e2e: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.rounds):
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    t, b, e = run_once(mode, width, args.steps, tmp)
                    steps[mode] += t
                    bounds[mode] += b
                    e2e[mode].append(e)
            n_ops = ops_per_step(width, tmp)
            med = {m: statistics.median(v) * 1e3 for m, v in steps.items()}
            med_b = {m: statistics.median(v) * 1e6 for m, v in bounds.items()}
            med_e2e = {m: statistics.median(v) * 1e3 for m, v in e2e.items()}
            # per op: what op capture adds outside the step boundary's own work
            per_op = (med["neuron_prof eager"] - med["none"] - med_b["neuron_prof eager"] / 1e3) / n_ops * 1e3
            results[f"mlp{width}"] = {"step_ms": med, "step_boundary_us": med_b, "end_to_end_ms_per_step": med_e2e,
                                      "ops_per_step": n_ops, "eager_us_per_op": per_op}
            print(f"MLP {width}-wide (4 x Linear+GELU, batch 64, AdamW, 1 thread), median of {args.rounds}x{args.steps} "
                  f"steps, {n_ops:.0f} ops per step")
            print(f"  {'mode':<24}{'step ms':>9}{'ratio':>8}{'prof.step() us':>16}{'e2e ms/step':>13}{'ratio':>8}")
            for m in MODES:
                print(f"  {m:<24}{med[m]:>9.3f}{med[m] / med['none']:>8.3f}{med_b[m]:>16.1f}{med_e2e[m]:>13.3f}"
                      f"{med_e2e[m] / med_e2e['none']:>8.2f}")
            tp, npd = med["torch.profiler"] - med["none"], med["neuron_prof default"] - med["none"]
            print(f"  eager op capture: {per_op:.2f} us per op; memory tracking on top: "
                  f"{med['neuron_prof default'] / med['neuron_prof eager']:.3f}x; default's overhead / "
                  f"torch.profiler's: {npd / tp:.2f}" if tp > 0 else "")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
