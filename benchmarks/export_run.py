"""Export throughput on a real captured run: load + map + encode + write, end to end.

    .venv/bin/python benchmarks/export_run.py [--steps 2000]

Captures a launch-bound training loop (4-layer 64-wide MLP, Adam) for --steps steps, then times
``neuron-prof export`` (in-process, --repeat times) and reports slices per second.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

import neuron_prof
from neuron_prof.cli.export import export_run


def capture(run_dir: Path, steps: int) -> None:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    with neuron_prof.profile(run_dir) as prof:
        for _ in range(steps):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "run"
        capture(run_dir, args.steps)
        for fmt in ("perfetto", "chrome"):
            took = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out, counts = export_run(run_dir, fmt=fmt)
                took.append(time.perf_counter() - t0)
            slices = counts["op_slices"] + counts["mark_slices"] + counts["steps"]
            med, best = statistics.median(took), min(took)
            print(f"{fmt:<9} {slices:>9} slices: median {med:5.2f} s = {slices / med / 1e3:4.0f}k slices/s, "
                  f"best {slices / best / 1e3:4.0f}k/s ({out.stat().st_size / 1e6:.0f} MB; load + map + write)")


if __name__ == "__main__":
    main()
