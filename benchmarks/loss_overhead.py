"""What recording each step's loss costs: the same loop with and without the ``loss`` collector,
side by side in one run (rounds interleaved), in step time and in ``prof.step()``'s own time.

    .venv/bin/python benchmarks/loss_overhead.py [--rounds 7] [--steps 300] [--width 64]

A one-layer regression (one ``backward()`` per step, one intra-op thread); op capture is off in
both modes so that the loss's own cost is not lost in op capture's.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import neuron_prof

MODES = {"without loss": [], "with loss": ["loss"]}


def run_once(collectors: list[str], width: int, steps: int, run_dir: str) -> tuple[float, float]:
    """Median step time and median prof.step() time (us) of one captured loop."""
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, width)
    step_us, boundary_us = [], []
    with neuron_prof.profile(run_dir, collectors=collectors) as prof:
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter_ns()
            prof.step()
            t2 = time.perf_counter_ns()
            step_us.append((t2 - t0) / 1e3)
            boundary_us.append((t2 - t1) / 1e3)
    skip = steps // 10  # warm-up
    return statistics.median(step_us[skip:]), statistics.median(boundary_us[skip:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                got[mode].append(run_once(MODES[mode], args.width, args.steps, f"{d}/{mode}-{r}"))
    base = statistics.median(s for s, _ in got["without loss"])
    print(f"{args.width}-wide Linear, {args.rounds} rounds x {args.steps} steps (median per round, median of rounds)")
    for mode, rows in got.items():
        step = statistics.median(s for s, _ in rows)
        boundary = statistics.median(b for _, b in rows)
        print(f"  {mode:<14} step {step:8.1f} us ({step / base:.3f}x)   prof.step() {boundary:6.1f} us")


if __name__ == "__main__":
    main()
