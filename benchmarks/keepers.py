"""What the keeper walk (collectors/_keepers.py) costs in a process of a million live Python objects.

    .venv/bin/python benchmarks/keepers.py [--objects 1000000] [--steps 30] [--rounds 5]

The walk runs at the end of capture and at an always-on dump, with a time budget of
``WALK_BUDGET_S`` (1 s). Its cost grows with the interpreter's objects (one pass to find the
tensors, one ``gc.get_referrers`` pass per level of holders), so it is timed in a process that
holds ``--objects`` objects the garbage collector tracks (small lists, dicts and instances: the
worst kind, each one visited by every pass), beside the classic leak: ``--steps`` validation losses
computed with grad enabled and kept in a global ``history`` list, their graphs holding the
activations. Printed: the objects the walk looked through, the storages it looked for and found a
keeper for, what it named, and the median and worst wall time of ``--rounds`` walks.
"""
from __future__ import annotations

import argparse
import gc
import statistics

import torch

from neuron_prof.collectors._keepers import WALK_BUDGET_S, walk


class Record:
    def __init__(self, i: int) -> None:
        self.i = i
        self.tags = [i]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    third = args.objects // 3
    ballast = ([[i] for i in range(third)] + [{"k": [i]} for i in range(third)]
               + [Record(i) for i in range(args.objects - 2 * third)])
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    global history
    history = []
    storages: dict[tuple[str, int], int] = {}
    for _ in range(args.steps):
        xv = torch.randn(64, 256)
        out = model(xv)
        history.append(torch.nn.functional.mse_loss(out, torch.zeros_like(out)))
        for t in (xv, out, history[-1]):  # what the memory collector looks for: the blocks made in the step
            storages[(str(t.device), t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
        del xv, out
    times, found = [], None
    for _ in range(args.rounds):
        found = walk(storages)
        times.append(found.dur_ns / 1e6)
    kept = {k.keeper + f" ({k.scope})" for k in found.kept}
    print(f"objects tracked by gc: {len(gc.get_objects()):,} (ballast {len(ballast):,})")
    print(f"walk looked through {found.objects:,} objects for {found.storages} storages, kept {len(found.kept)}: "
          f"{', '.join(sorted(kept))}; stopped: {found.stopped or 'no'}")
    print(f"walk time over {args.rounds} rounds: median {statistics.median(times):.0f} ms, worst "
          f"{max(times):.0f} ms (budget {WALK_BUDGET_S * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
