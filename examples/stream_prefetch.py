"""Batches prefetched on a side stream, as a GPU job does with CUDA streams, on the emulated
``neuron`` device: each batch is copied in (pinned memory, ``non_blocking``) and preprocessed on a
side stream while the compute stream trains on the previous one, and the compute stream waits for
the batch's event before it uses it.

The defect (``early=True``): the compute stream waits for the *next* batch's event as soon as its
prefetch is queued, before it trains on the current batch: it stands idle on the device for the
whole prefetch instead of hiding it under the step's compute. The fix waits where the batch is
first used. ``neuron-prof report RUN`` names the wait's line under Device, Stream waits, with the
idle time it costs each step; the Perfetto trace draws the wait on the compute stream's track
with an arrow from the event that released it.

    python -m neuron_prof.examples.stream_prefetch RUN [--early] [STEPS]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from neuron_prof.testing import neuron

WIDTH, BATCH = 32, 16
PREP_KERNELS = 10
"""Preprocessing on the side stream: matmuls by a fixed matrix (kernels that do not fuse)."""
LAUNCH_US = 2000
"""Each kernel costs 2 ms of launch on the device: the prefetch takes ~22 ms, a step's compute
more, so a prefetch hidden under compute and one waited for differ by ~20 ms a step."""


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)) for _ in range(steps)]


def prepare(x: torch.Tensor) -> torch.Tensor:
    """The preprocessing: whitening by a fixed (identity) matrix, ``PREP_KERNELS`` times."""
    whiten = torch.eye(WIDTH, device=x.device)
    for _ in range(PREP_KERNELS):
        x = x @ whiten
    return x


def train(device: str, steps: int = 6, early: bool = False, prof=None) -> list[float]:
    """Seeded MLP, SGD; batches prefetched on a side stream on the device (on the CPU: prepared
    in line, the reference). The losses, read after each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(steps)
    on_device = device != "cpu"
    mod = torch.get_device_module(device) if on_device else None
    side = mod.Stream() if on_device else None

    def prefetch(i: int):
        x, y = data[i]
        if not on_device:
            return prepare(x), y, None
        with mod.stream(side):
            x = prepare(x.pin_memory().to(device, non_blocking=True))
            y = y.pin_memory().to(device, non_blocking=True)
            ready = mod.Event()
            ready.record()
        return x, y, ready

    def use(batch) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _ = batch
        if on_device:  # made on the side stream, used on the compute stream
            x.record_stream(mod.current_stream())
            y.record_stream(mod.current_stream())
        return x, y

    losses = []
    batch = prefetch(0)
    if on_device:
        mod.current_stream().wait_event(batch[2])
    for i in range(steps):
        upcoming = prefetch(i + 1) if i + 1 < steps else None
        if on_device and early and upcoming is not None:
            mod.current_stream().wait_event(upcoming[2])  # WAIT-TOO-EARLY: the next batch, before this step
        x, y = use(batch)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
        if upcoming is not None:
            batch = upcoming
            if on_device and not early:
                mod.current_stream().wait_event(batch[2])  # WAIT-WHERE-USED: before the step that uses it
    return losses


def main(argv: list[str]) -> None:
    import neuron_prof

    neuron.enable(launch_us=LAUNCH_US)
    early = "--early" in argv
    rest = [a for a in argv if a != "--early"]
    with neuron_prof.profile(rest[0]) as prof:
        losses = train("neuron", int(rest[1]) if len(rest) > 1 else 6, early, prof)
    print("losses:", " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main(sys.argv[1:])
