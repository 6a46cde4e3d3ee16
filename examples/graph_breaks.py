"""A small function with six distinct ``torch.compile`` graph breaks, and two recompiles.

The graph-break investigation demo and the compiler collector's test workload. Each break sits on
its own line, tagged with a ``# BREAK:<cause>`` marker comment (tests find lines by marker):

- ``print(...)``                              builtin dynamo cannot trace
- ``.item()`` feeding a Python ``if``         data-dependent branch (capture_scalar_outputs=False)
- ``os.getpid()``                             a C function dynamo skips
- ``next(generator)``                         a generator created outside the compiled region
- ``np.array2string(t.numpy())``              a numpy function torch._numpy does not implement
- ``torch._dynamo.graph_break()``             the explicit one

``run()`` calls the compiled function with a (8, 4) float32 tensor, then (16, 4) (size mismatch:
every frame recompiles), then (16, 4) float64 (dtype mismatch: every frame recompiles again).

    python examples/graph_breaks.py [--backend inductor|aot_eager|eager]
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch


def _ticks():
    """A generator made outside the compiled function: dynamo graph-breaks on ``next()`` of it."""
    while True:
        yield 0


_TICKS = _ticks()


def step(x: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x) * 2 + 1
    print("graph_breaks: step")  # BREAK:print
    if y.sum().item() > 0:  # BREAK:item
        y = y * 3
    y = y + os.getpid() % 2  # BREAK:skipped
    y = y - next(_TICKS)  # BREAK:generator
    text = np.array2string(y.numpy())  # BREAK:numpy
    y = y + len(text) * 0
    torch._dynamo.graph_break()  # BREAK:graph_break
    return torch.sigmoid(y) * y + y.cos()


def no_breaks(x: torch.Tensor) -> torch.Tensor:
    """The same kind of math with nothing dynamo has to break on: one graph."""
    y = torch.relu(x) * 2 + 1
    return torch.sigmoid(y) * y + y.cos()


SHAPES = ((8, 4, torch.float32), (16, 4, torch.float32), (16, 4, torch.float64))


def run(backend="inductor", fn=step) -> list[torch.Tensor]:
    """Compile ``fn`` with ``backend`` and call it at (8,4) f32, (16,4) f32, (16,4) f64."""
    compiled = torch.compile(fn, backend=backend)
    outs = []
    for rows, cols, dtype in SHAPES:
        outs.append(compiled(torch.randn(rows, cols, dtype=dtype)))
    return outs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="inductor")
    args = ap.parse_args(argv)
    run(args.backend)


if __name__ == "__main__":
    main()
