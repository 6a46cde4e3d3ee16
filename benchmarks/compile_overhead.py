"""Compile-time and steady-state cost of the compiler collector, side by side in one run.

    .venv/bin/python benchmarks/compile_overhead.py [--rounds 5]

Compiles examples/graph_breaks.py (six graph breaks, two recompiles: 21 frame compiles with
Inductor) from scratch each round — dynamo reset, Inductor's FX graph cache off — once with no
capture and once under ``neuron_prof.profile(collectors=["compiler"])``, interleaved; then runs a
compiled break-free function 2,000 times with and without the collector installed.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._inductor.config

import neuron_prof
from neuron_prof.examples import graph_breaks


def compile_once(capture: bool, tmp: Path) -> float:
    torch._dynamo.reset()
    t0 = time.perf_counter()
    if capture:
        with neuron_prof.profile(tmp / f"c{time.monotonic_ns()}", collectors=["compiler"]):
            graph_breaks.run("inductor")
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
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch._inductor.config.fx_graph_cache = False
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        compile_once(True, tmp)  # warm imports, codegen toolchain and the collector itself
        comp = {False: [], True: []}
        run = {False: [], True: []}
        for _ in range(args.rounds):
            for capture in (False, True):
                comp[capture].append(compile_once(capture, tmp))
                run[capture].append(steady(capture, tmp))
    c0, c1 = statistics.median(comp[False]), statistics.median(comp[True])
    r0, r1 = statistics.median(run[False]) * 1e6, statistics.median(run[True]) * 1e6
    print(f"compile of examples/graph_breaks.py (median of {args.rounds}): none {c0:.2f} s, "
          f"compiler collector {c1:.2f} s, ratio {c1 / c0:.3f}")
    print(f"steady state, compiled call: none {r0:.1f} us, compiler collector {r1:.1f} us, ratio {r1 / r0:.3f}")


if __name__ == "__main__":
    main()
