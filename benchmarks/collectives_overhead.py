"""Per-collective capture overhead: 2 gloo ranks on 127.0.0.1, side by side in one run.

    .venv/bin/python benchmarks/collectives_overhead.py [--rounds 20] [--iters 60] [--steps 10] [--json PATH]

Two loops, in the same two processes: 1 MB all-reduces (262,144 float32; a step boundary every
20 of them, the issue's "20 collectives per step") and DDP training steps of a 4-layer 256-wide
MLP (~1 MB of gradients, two buckets). Each round runs every mode once, the order rotating per
round so the machine's noise hits all alike:

* ``none``: no capture;
* ``collectives``: ``neuron_prof.profile(collectors=["collectives"])``, the collectives collector alone;
* ``default``: ``neuron_prof.profile()`` (eager ops, compiler, memory, collectives);
* ``torch.profiler``: CPU activities with ``record_shapes=True, with_stack=True,
  profile_memory=True``, the detail neuron_prof records (benchmarks/overhead.py's setting).

Reported: rank 0's median and mean time per all-reduce / per DDP step over all rounds (step
boundaries included: neuron_prof commits each step to disk), and each mode's paired ratio to
``none`` (the median over rounds of the round's own ratio, with its range), which a shared
machine's drifting load disturbs least.
Each capture's start and end (neuron_prof's clock measurement, its final flush; torch.profiler's
trace processing) are outside the timed loops. Target (measured, not asserted):
collectives-only <= 1.05x per all-reduce.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import neuron_prof

MODES = ("none", "collectives", "default", "torch.profiler")
MB_FLOATS = (1 << 20) // 4
STEP_EVERY = 20


def capture(mode: str, run_dir: Path):
    if mode == "collectives":
        return neuron_prof.profile(run_dir, collectors=["collectives"])
    if mode == "default":
        return neuron_prof.profile(run_dir)
    if mode == "torch.profiler":
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                      with_stack=True, profile_memory=True)
    return contextlib.nullcontext()


def all_reduce_loop(mode: str, iters: int, run_dir: Path) -> list[float]:
    """Seconds per all-reduce (a step boundary after every STEP_EVERY-th)."""
    t = torch.ones(MB_FLOATS)
    times = []
    dist.barrier()
    with capture(mode, run_dir) as prof:
        dist.barrier()  # both ranks' captures are on before the first timed call
        for i in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if prof is not None and (i + 1) % STEP_EVERY == 0:
                prof.step()
            times.append(time.perf_counter() - t0)
    return times


def ddp_loop(mode: str, steps: int, run_dir: Path, rank: int) -> list[float]:
    """Seconds per DDP training step."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(4)]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):  # DDP's bucket rebuild and allocator warm-up, outside capture
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    times = []
    dist.barrier()
    with capture(mode, run_dir) as prof:
        dist.barrier()
        for _ in range(steps):
            t0 = time.perf_counter()
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if prof is not None:
                prof.step()
            times.append(time.perf_counter() - t0)
    return times


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    root = Path(tmp)
    all_reduce_loop("default", STEP_EVERY, root / "warm-up")  # build/load the engine outside the measurement
    loops = {"all_reduce": lambda m, d: all_reduce_loop(m, args.iters, d),
             "ddp_step": lambda m, d: ddp_loop(m, args.steps, d, rank)}
    times = {loop: {m: [] for m in MODES} for loop in loops}  # loop -> mode -> one list per round
    for r in range(args.rounds):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            for loop, fn in loops.items():
                times[loop][mode].append(fn(mode, root / f"{loop}-{mode.replace('.', '_')}-{r}"))
    captured = neuron_prof.load(root / "all_reduce-collectives-0").collectives
    mine = int(((captured["rank"] == rank) & (captured["bytes"] == MB_FLOATS * 4)).sum())
    dist.destroy_process_group()
    if rank == 0:
        (root / "results.json").write_text(json.dumps({"times": times, "captured_per_rank": mine}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(rounds: dict[str, list[list[float]]], unit: float) -> dict[str, dict[str, float]]:
    """Per mode: median and mean over every timed call (``unit`` per second), and the paired
    ratio to ``none``: the median over rounds of the round's median against ``none``'s median in
    the same round (the load of a shared machine drifts; a round's modes run seconds apart)."""
    out = {}
    for m, per_round in rounds.items():
        flat = [t for r in per_round for t in r]
        ratios = [statistics.median(r) / statistics.median(base) for r, base in zip(per_round, rounds["none"])]
        out[m] = {"median": statistics.median(flat) * unit, "mean": statistics.fmean(flat) * unit,
                  "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=60, help="all-reduces per mode and round")
    p.add_argument("--steps", type=int, default=10, help="DDP steps per mode and round")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, free_port(), args, tmp), nprocs=2)
        raw = json.loads((Path(tmp) / "results.json").read_text())
    if raw["captured_per_rank"] != args.iters:
        sys.exit(f"the collectives-only run holds {raw['captured_per_rank']} 1 MB all-reduces, not {args.iters}")
    results = {"config": {"ranks": 2, "backend": "gloo", "rounds": args.rounds, "iters": args.iters,
                          "steps": args.steps, "all_reduce_bytes": MB_FLOATS * 4, "step_every": STEP_EVERY,
                          "torch": torch.__version__},
               "all_reduce_us": summarize(raw["times"]["all_reduce"], 1e6),
               "ddp_step_ms": summarize(raw["times"]["ddp_step"], 1e3)}
    for key, title in (("all_reduce_us", f"1 MB all-reduce, µs ({args.rounds} rounds x {args.iters})"),
                       ("ddp_step_ms", f"DDP step, 4x256 MLP, ms ({args.rounds} rounds x {args.steps})")):
        print(f"{title}, rank 0 of 2 gloo ranks")
        print(f"  {'mode':<16}{'median':>10}{'mean':>10}{'paired ratio':>14}{'rounds':>16}")
        for m, r in results[key].items():
            print(f"  {m:<16}{r['median']:>10.1f}{r['mean']:>10.1f}{r['ratio']:>14.3f}"
                  f"{r['ratio_min']:>8.2f}-{r['ratio_max']:<7.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
