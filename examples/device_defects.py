"""Training on an asynchronous device with its usual defects on marked lines, for neuron_prof's
device analyses, tests and docs. It runs on the emulated ``neuron`` device
(``neuron_prof.testing.neuron``), which it enables:

    python -m neuron_prof.examples.device_defects RUN [STEPS]
    neuron-prof record -o RUN -- python -m neuron_prof.examples.device_defects

Each step trains a small MLP with SGD, and:

- FALLBACK-LINE: ``torch.cumsum`` of the batch, an op the device lacks: it runs on the CPU
  (PyTorch's ``cpu_fallback`` runs ``cumsum.out``: the input and the output buffer are copied to
  the host, the result back);
- MATMUL-LINE queues four ``BIG`` x ``BIG`` matmuls, CAT-LINE a ``torch.cat`` (no epilogue joins
  it), and FUSED-LINE a chain of ``CHAIN`` pointwise ops that wait in the queue behind them and so
  fuse into one kernel, which MEAN-LINE reduces (a kernel of its own);
- even steps are then **host-bound**: HOST-LINE does ``HOST_WORK_MS`` of Python work before each
  of ``HOST_OPS`` tiny device ops, so the device waits for work;
- odd steps are **device-bound**: DEVICE-LINE queues ``BIG_MATMULS`` more matmuls, which the
  device runs long after the host has queued them;
- STALL-LINE reads a value with ``.item()``: the host waits for everything queued.
"""
from __future__ import annotations

import sys
import time

import torch

BATCH, IN, HIDDEN, OUT = 32, 64, 128, 8
BIG, BIG_MATMULS = 384, 48
HOST_OPS, HOST_WORK_MS = 16, 16.0
CHAIN = ("aten::mul", "aten::add", "aten::tanh", "aten::mul", "aten::sub", "aten::relu")
"""The ops FUSED-LINE queues, in order."""
LAUNCH_US = 20.0


def host_work(ms: float) -> float:
    """Pure Python work for ``ms`` (a data pipeline, logging, a tokenizer): no device op."""
    end, x = time.perf_counter() + ms / 1e3, 0.0
    while time.perf_counter() < end:
        x += 1.0
    return x


def device_bound(step: int) -> bool:
    return step % 2 == 1


def train(steps: int = 8, prof=None) -> list[float]:
    """``steps`` steps on ``neuron:0``; the metric read at STALL-LINE, per step."""
    from neuron_prof.testing import neuron
    neuron.enable(launch_us=LAUNCH_US)
    torch.manual_seed(0)
    dev = torch.device("neuron:0")
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a, b = torch.randn(BIG, BIG).to(dev) / BIG ** 0.5, torch.randn(BIG, BIG).to(dev) / BIG ** 0.5
    metrics = []
    for step in range(steps):
        x = torch.randn(BATCH, IN).to(dev)
        y = torch.randn(BATCH, OUT).to(dev)
        running = torch.cumsum(x, 1)  # FALLBACK-LINE
        loss = torch.nn.functional.mse_loss(model(x + running * 0), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            h = a @ b @ b @ b @ b  # MATMUL-LINE
            h = torch.cat([h, torch.zeros(1, BIG, device=dev)])  # CAT-LINE
            z = ((h * 0.5 + 1.0).tanh() * 2.0 - 1.0).relu()  # FUSED-LINE
            acc = z.mean()  # MEAN-LINE
            if device_bound(step):
                for _ in range(BIG_MATMULS):
                    h = h[:BIG] @ b  # DEVICE-LINE
                acc = acc + h.mean()
            else:
                for _ in range(HOST_OPS):
                    host_work(HOST_WORK_MS)
                    acc = acc + 1  # HOST-LINE
            metrics.append((loss.detach() + acc).item())  # STALL-LINE
        if prof is not None:
            prof.step()
    return metrics


def main(argv: list[str]) -> None:
    if not argv:  # under `neuron-prof record`, which captures and counts the steps itself
        train()
        return
    import neuron_prof
    from neuron_prof.testing import neuron
    # the device comes up before the capture starts: a device enabled inside a captured step is
    # seen from the next step boundary on (its backend's profiler was not there to start)
    neuron.enable(launch_us=LAUNCH_US)
    with neuron_prof.profile(argv[0]) as prof:
        train(int(argv[1]) if len(argv) > 1 else 8, prof)


if __name__ == "__main__":
    main(sys.argv[1:])
