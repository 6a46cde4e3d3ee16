"""What a backend's report costs (the backend hook API, collectors/neuron_prof_backend.h).

From C: the engine's ``device_bench`` helper calls the API struct's ``op_enqueued`` and
``kernel_executed`` (4 enqueue ids) through its function pointers N times in a C++ loop, as a
backend does, with the capture flag on and off, and a backend's guarded call
(``if (*api->capturing) api->op_enqueued(...)``) with the flag off. From Python: the
``report_enqueue`` function, on and off. No op is open on the calling thread (the host-op lookup
is the one the memory tracker makes per allocation). Figures are medians of ROUNDS rounds; the
ratio puts each against one small eager op (``torch.add`` of two 16-element tensors, CPU).

    .venv/bin/python benchmarks/device_hooks.py [N]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from neuron_prof.collectors import device as dev

ROUNDS = 7


def eager_op_ns(n: int = 200_000) -> float:
    a, b = torch.ones(16), torch.ones(16)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        torch.add(a, b)
    return (time.perf_counter_ns() - t0) / n


def python_report_ns(n: int, on: bool) -> float:
    dev._set_capturing(on)
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            dev.report_enqueue(0, 0, "aten::add", 1)
        return (time.perf_counter_ns() - t0) / n
    finally:
        dev._set_capturing(False)
        dev._ext.device_drain()  # the rows it added


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    dev.backend_api()  # loads the engine
    ext = dev._ext
    ext.device_drain()
    rows: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for on in (True, False):
            r = ext.device_bench(n, on)
            tag = "on" if on else "off"
            rows.setdefault(f"C op_enqueued, capture {tag}", []).append(r["op_enqueued_ns"])
            rows.setdefault(f"C kernel_executed (4 ids), capture {tag}", []).append(r["kernel_executed_ns"])
            if not on:
                rows.setdefault("C guarded call, capture off", []).append(r["guarded_ns"])
            rows.setdefault(f"Python report_enqueue, capture {tag}", []).append(python_report_ns(n // 10, on))
        rows.setdefault("eager op torch.add(16)", []).append(eager_op_ns())
    op = statistics.median(rows["eager op torch.add(16)"])
    print(f"{'what':44s} {'ns/call':>10s} {'x eager op':>11s}   (median of {ROUNDS}, N={n:,})")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:44s} {med:10.1f} {med / op:11.3f}")


if __name__ == "__main__":
    main()
