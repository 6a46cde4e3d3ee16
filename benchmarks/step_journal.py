"""What journaling every step row outside detail windows costs the step boundary (issue 41, case 6).

    .venv/bin/python benchmarks/step_journal.py [--rounds 9] [--steps 400] [--boundary-only]

Steps outside detail windows (a schedule's wait steps, always-on's unsampled steps) have their row
committed about once a second, and each one stored into the memory-mapped step ring as it ends
(neuron_prof.store.step_ring), so a kill -9 loses at most the step in flight. Printed:

* the median ``prof.step()`` of such steps (a 64-wide Linear, one intra-op thread), under
  ``schedule(wait=...)`` and under ``mode="always-on"``, modes interleaved over ``--rounds``; with
  ``--boundary-only`` nothing else, so the same figures can be taken from a checkout that predates
  the ring (``PYTHONPATH=OLD_CHECKOUT``) for the before/after;
* the ring's store itself (``StepRing.put``) beside the alternative it was chosen over, a
  ``write(2)`` of the same 32-byte row to an append-only file, median µs a call.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import neuron_prof
from overhead import interleaved_us

MODES = {"schedule, wait steps": {"schedule": neuron_prof.schedule(wait=1 << 30)},
         "always-on, unsampled steps": {"mode": "always-on", "detail_every": 1 << 30, "hang_timeout_s": None}}


def boundaries_us(kwargs: dict, steps: int, tmp: Path) -> list[float]:
    """``prof.step()`` of each step but the first (it makes the rank's folder), in µs."""
    model = torch.nn.Linear(64, 64)
    x = torch.randn(16, 64)
    out = []
    with neuron_prof.profile(tmp / f"run-{time.monotonic_ns()}", **kwargs) as prof:
        for _ in range(steps):
            model(x).sum().backward()
            t0 = time.perf_counter_ns()
            prof.step()
            out.append((time.perf_counter_ns() - t0) / 1e3)
    return out[1:]


def ring_against_write(rounds: int, tmp: Path) -> dict[str, float]:
    from neuron_prof.store.step_ring import StepRing
    ring = StepRing(tmp)
    fd = os.open(tmp / "steps.append", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    row = bytes(32)
    counter = iter(range(1 << 62))
    try:
        return interleaved_us({"StepRing.put": lambda: ring.put(next(counter), 1, 2, False, True),
                               "write(2) of the row": lambda: os.write(fd, row)}, rounds)
    finally:
        os.close(fd)
        ring.remove()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--boundary-only", action="store_true", help="the prof.step() figures only (any checkout)")
    args = p.parse_args()
    torch.set_num_threads(1)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    names = list(MODES)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        boundaries_us(MODES[names[0]], 3, tmp)  # imports and extensions outside the measurement
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name] += boundaries_us(MODES[name], args.steps, tmp)
        print(f"prof.step() between detail windows ({neuron_prof.__file__}), median of {args.rounds} x "
              f"{args.steps} steps:")
        for name, values in samples.items():
            print(f"  {name:<30}{statistics.median(values):>8.2f} us")
        if not args.boundary_only:
            print(f"the step row's store, median of {args.rounds} x 2000 calls:")
            for name, us in ring_against_write(args.rounds, tmp).items():
                print(f"  {name:<30}{us:>8.2f} us")


if __name__ == "__main__":
    main()
