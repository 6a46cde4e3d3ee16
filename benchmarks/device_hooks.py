"""What the backend hook API still costs (collectors/neuron_prof_backend.h, version 3: a queue's
live state only, for always-on dumps; kernels, copies and waits go to PyTorch's profiler).

From C: the engine's ``device_bench`` helper calls the API struct's ``op_enqueued`` and
``queue_flushed`` through its function pointers N times in a C++ loop, as a backend does, with
the capture flag on and off, and a backend's guarded call (``if (*api->capturing)
api->op_enqueued(...)``) with the flag off. From Python: ``report_enqueue``, on and off. Figures
are medians of ROUNDS rounds; the ratio puts each against one small eager op (``torch.add`` of two
16-element tensors, CPU).

Side by side, in the same process: the emulated ``neuron`` device's own cost per op
(``neuron_prof.testing.neuron``, ``launch_us=0``, no capture running): N_DEVICE ops ``y = x + x``
on a 16-element neuron tensor enqueued, then ``torch.neuron.synchronize()``, per op. Targets: the
capture-off cost at most 1% of a device op; capture on, at most 0.3 us a report.

    .venv/bin/python benchmarks/device_hooks.py [N] [N_DEVICE]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from neuron_prof.collectors import device as dev

ROUNDS = 7
N_DEVICE = 20_000


def eager_op_ns(n: int = 200_000) -> float:
    a, b = torch.ones(16), torch.ones(16)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        torch.add(a, b)
    return (time.perf_counter_ns() - t0) / n


def device_op_ns(n: int) -> float:
    """The emulated device's own cost per queued op, no capture running: enqueue ``n`` small
    pointwise ops, then wait for the device."""
    x = torch.ones(16, device="neuron")
    t0 = time.perf_counter_ns()
    for _ in range(n):
        y = x + x
    torch.neuron.synchronize()
    del y
    return (time.perf_counter_ns() - t0) / n


def python_report_ns(ext, n: int, on: bool) -> float:
    ext.device_set_live(on)
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            dev.report_enqueue(0, 1)
        return (time.perf_counter_ns() - t0) / n
    finally:
        ext.device_set_live(False)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    n_device = int(sys.argv[2]) if len(sys.argv) > 2 else N_DEVICE
    from neuron_prof.testing import neuron

    neuron.enable(devices=1, launch_us=0.0)  # connected to the hook API (nothing captures)
    device_op_ns(2_000)  # warm: the op's Meta-kernel shapes are cached after the first call
    dev.backend_api()  # loads the engine
    ext = dev._ext
    rows: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for on in (True, False):
            r = ext.device_bench(n, on)
            tag = "on" if on else "off"
            rows.setdefault(f"C op_enqueued, capture {tag}", []).append(r["op_enqueued_ns"])
            rows.setdefault(f"C queue_flushed, capture {tag}", []).append(r["queue_flushed_ns"])
            if not on:
                rows.setdefault("C guarded call, capture off", []).append(r["guarded_ns"])
            rows.setdefault(f"Python report_enqueue, capture {tag}", []).append(python_report_ns(ext, n // 10, on))
        rows.setdefault("eager op torch.add(16)", []).append(eager_op_ns())
        rows.setdefault("neuron device op x + x (16), no capture", []).append(device_op_ns(n_device))
    op = statistics.median(rows["eager op torch.add(16)"])
    print(f"{'what':44s} {'ns/call':>10s} {'x eager op':>11s}   (median of {ROUNDS}, N={n:,}, "
          f"device ops {n_device:,})")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:44s} {med:10.1f} {med / op:11.3f}")
    med = {name: statistics.median(values) for name, values in rows.items()}
    device_op = med["neuron device op x + x (16), no capture"]
    print(f"\nagainst one neuron device op ({device_op / 1000:.2f} us; target: capture off <= 1%):")
    for name in ("C guarded call, capture off", "C op_enqueued, capture off", "C queue_flushed, capture off"):
        print(f"  {name:42s} {100 * med[name] / device_op:8.3f} %")
    worst = max(med["C op_enqueued, capture on"], med["C queue_flushed, capture on"])
    print(f"capture on, per report from C (target <= 0.3 us): op_enqueued {med['C op_enqueued, capture on'] / 1000:.3f}"
          f" us, queue_flushed {med['C queue_flushed, capture on'] / 1000:.3f} us ({'met' if worst <= 300 else 'NOT met'})")


if __name__ == "__main__":
    main()
