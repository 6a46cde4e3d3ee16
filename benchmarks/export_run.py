"""Export throughput on a real captured run: load + map + encode + write, end to end.

    .venv/bin/python benchmarks/export_run.py [--steps 2000] [--repeat 3] [--only perfetto|chrome] [--run DIR]

Captures a launch-bound training loop (4-layer 64-wide MLP, Adam; default collectors) for --steps
steps (with --run DIR: into DIR if it holds no run yet, else that run is reused, so repeated
measurements capture once), then times ``neuron-prof export`` (``export_run``, in-process,
--repeat times per format) and reports slices per second (op, mark and step slices over the
whole export's seconds). Each run is split in two: the writer's ``close()`` (nest repair,
encoding, writing the file) and the rest (loading the run, the analyses the trace shows: sync
points, memory allocations, timeline and peaks, ...; mapping them onto tracks); and the CPU
seconds of the median run (every thread: a steadier figure than wall time on a shared machine).
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

import neuron_prof
from neuron_prof.export.buffered_writer import BufferedTraceWriter
from neuron_prof.export.run_export import export_run
from neuron_prof.store.reader import rank_dirs


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


@contextlib.contextmanager
def writer_seconds() -> Iterator[list[float]]:
    """Seconds each trace writer spends in ``close()`` while the block runs, appended to the list."""
    spent: list[float] = []
    close = BufferedTraceWriter.close

    def timed(self: BufferedTraceWriter) -> None:
        t0 = time.perf_counter()
        close(self)
        spent.append(time.perf_counter() - t0)
    BufferedTraceWriter.close = timed
    try:
        yield spent
    finally:
        BufferedTraceWriter.close = close


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", choices=["perfetto", "chrome"])
    p.add_argument("--run", type=Path, help="the run to export: captured there first if it holds none")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run_dir = args.run or Path(d) / "run"
        if not (run_dir.is_dir() and rank_dirs(run_dir)):
            capture(run_dir, args.steps)
        for fmt in ("perfetto", "chrome"):
            if args.only and args.only != fmt:
                continue
            took, cpu = [], []
            with writer_seconds() as writing:
                for _ in range(args.repeat):
                    t0, c0 = time.perf_counter(), time.process_time()
                    out, counts = export_run(run_dir, fmt=fmt)
                    took.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
            slices = counts["op_slices"] + counts["mark_slices"] + counts["steps"]
            mid = sorted(range(len(took)), key=took.__getitem__)[len(took) // 2]   # the median run
            med = took[mid]
            print(f"{fmt:<9} {slices:>9} slices: median {med:5.2f} s = {slices / med / 1e3:5.0f}k slices/s end to end, "
                  f"best {slices / min(took) / 1e3:5.0f}k/s ({out.stat().st_size / 1e6:.0f} MB); median run: writer "
                  f"{writing[mid]:.2f} s (nest + encode + write), load + analyses + mapping "
                  f"{took[mid] - writing[mid]:.2f} s; CPU {cpu[mid]:.2f} s (all threads)")


if __name__ == "__main__":
    main()
