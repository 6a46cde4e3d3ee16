"""Compile-time and steady-state cost of the compiler collector, side by side in one run.

    .venv/bin/python benchmarks/compile_overhead.py [--rounds 9]

Compiles examples/graph_breaks.py (six graph breaks, two recompiles: 21 frame compiles with
Inductor) from scratch each round — dynamo reset, Inductor's FX graph cache off — with no capture,
with only a ``logging.NullHandler`` on torch's structured trace log (what torch itself spends
building structured records once anyone listens), under ``neuron_prof.profile(collectors=
["compiler"])`` and under ``neuron_prof.profile()`` (the default collectors: eager ops, compiler,
memory; every op the compile itself runs is recorded), interleaved; then runs a compiled
break-free function 2,000 times with and without the compiler collector installed. The order of
the modes rotates from round to round: on a busy machine the first compile of a round runs
measurably slower.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._inductor.config
from torch._logging._internal import trace_log

import neuron_prof
from neuron_prof.examples import graph_breaks


MODES = ("none", "null handler", "compiler collector", "default collectors")


def compile_once(mode: str, tmp: Path) -> float:
    torch._dynamo.reset()
    handler = logging.NullHandler()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the example prints at one of its breaks
        if mode in ("compiler collector", "default collectors"):
            kwargs = {"collectors": ["compiler"]} if mode == "compiler collector" else {}
            with neuron_prof.profile(tmp / f"c{time.monotonic_ns()}", **kwargs):
                graph_breaks.run("inductor")
        elif mode == "null handler":
            trace_log.addHandler(handler)
            try:
                graph_breaks.run("inductor")
            finally:
                trace_log.removeHandler(handler)
        else:
            graph_breaks.run("inductor")
    return time.perf_counter() - t0


def steady(capture: bool, tmp: Path, calls: int = 2000) -> float:
    torch._dynamo.reset()
    fn = torch.compile(graph_breaks.no_breaks)
    x = torch.randn(8, 4)
    fn(x)  # compile outside the timing
    prof = neuron_prof.profile(tmp / f"s{time.monotonic_ns()}", collectors=["compiler"]) if capture else None
    if prof:
        prof.start()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    took = (time.perf_counter() - t0) / calls
    if prof:
        prof.stop()
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    torch._inductor.config.fx_graph_cache = False
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        compile_once("default collectors", tmp)  # warm imports, codegen toolchain, the collectors
        comp: dict[str, list[float]] = {m: [] for m in MODES}
        run = {False: [], True: []}
        for r in range(args.rounds):
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:  # no mode always goes first
                comp[mode].append(compile_once(mode, tmp))
            for capture in (False, True):
                run[capture].append(steady(capture, tmp))
    base = statistics.median(comp["none"])
    print(f"compile of examples/graph_breaks.py, median of {args.rounds}:")
    for mode in MODES:
        med = statistics.median(comp[mode])
        paired = sorted(t / b for t, b in zip(comp[mode], comp["none"]))  # same round, same machine state
        print(f"  {mode:<20} {med:6.2f} s  ratio {med / base:.3f}  "
              f"(per round: median {statistics.median(paired):.3f}, {paired[0]:.3f}-{paired[-1]:.3f})")
    r0, r1 = statistics.median(run[False]) * 1e6, statistics.median(run[True]) * 1e6
    print(f"steady state, compiled call: none {r0:.1f} us, compiler collector {r1:.1f} us, ratio {r1 / r0:.3f}")


if __name__ == "__main__":
    main()
