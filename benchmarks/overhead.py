"""Step-time overhead: nothing vs neuron_prof vs torch.profiler, side by side in one run.

    .venv/bin/python benchmarks/overhead.py [--rounds 5] [--steps 30]

Two MLPs: 512 wide (compute-bound) and 64 wide (launch-bound: per-op cost dominates). Modes run
interleaved (round-robin, the order rotating per round) so machine noise hits all alike; we
report the median step time and the ratio to the uncaptured run. neuron_prof runs twice: op
capture (collectors eager + compiler) and op capture plus memory tracking (+ memory), so the
memory collector's own cost is the ratio of the two. torch.profiler is configured at the detail neuron_prof records:
record_shapes=True, with_stack=True, profile_memory=True. "end-to-end" adds each tool's
teardown (torch.profiler's trace processing, neuron_prof's final flush) per step.
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

MODES = ("none", "neuron_prof ops", "neuron_prof ops+memory", "torch.profiler")
COLLECTORS = {"neuron_prof ops": ["eager", "compiler"], "neuron_prof ops+memory": ["eager", "compiler", "memory"]}


def make_model(width: int, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def capture(mode: str, tmp: Path):
    if mode in COLLECTORS:
        return neuron_prof.profile(tmp / f"run-{time.monotonic_ns()}", collectors=COLLECTORS[mode])
    if mode == "torch.profiler":
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                      with_stack=True, profile_memory=True)
    return contextlib.nullcontext()


def run_once(mode: str, width: int, steps: int, tmp: Path) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = make_model(width)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, width), torch.randn(64, width)
    for _ in range(3):  # allocator and kernel warm-up, outside capture
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    times = []
    t_start = time.perf_counter()
    with capture(mode, tmp) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if mode in COLLECTORS:
                prof.step()
            times.append(time.perf_counter() - t0)
    if mode == "torch.profiler":
        prof.key_averages()  # what a user does next; makes the trace processing part of end-to-end
    return times, (time.perf_counter() - t_start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--widths", default="512,64")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run_once("neuron_prof ops+memory", 64, 2, tmp)  # build/load the extension outside the measurement
        for width in map(int, args.widths.split(",")):
            steps: dict[str, list[float]] = {m: [] for m in MODES}
            e2e: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.rounds):
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    t, e = run_once(mode, width, args.steps, tmp)
                    steps[mode] += t
                    e2e[mode].append(e)
            med = {m: statistics.median(v) * 1e3 for m, v in steps.items()}
            med_e2e = {m: statistics.median(v) * 1e3 for m, v in e2e.items()}
            results[f"mlp{width}"] = {"step_ms": med, "end_to_end_ms_per_step": med_e2e}
            print(f"MLP {width}-wide (4 layers, batch 64, Adam, 1 thread), median of {args.rounds}x{args.steps} steps")
            print(f"  {'mode':<24}{'step ms':>9}{'ratio':>8}{'e2e ms/step':>13}{'ratio':>8}")
            for m in MODES:
                print(f"  {m:<24}{med[m]:>9.3f}{med[m] / med['none']:>8.2f}{med_e2e[m]:>13.3f}"
                      f"{med_e2e[m] / med_e2e['none']:>8.2f}")
            mem = med["neuron_prof ops+memory"] / med["neuron_prof ops"]
            print(f"  memory tracking on top of op capture: {mem:.3f}x per step")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
