"""Streams and events on the emulated `neuron` device, run in a process of its own by
tests/test_neuron_streams.py (enabling the device renames PyTorch's PrivateUse1 backend for the
whole process). Prints one JSON object of facts the tests check.

    python tests/neuron_streams_script.py RUN_DIR

RUN_DIR receives a neuron_prof capture of the stream scenarios (overlap, an ordering wait, host
syncs, timed events); the tests find their lines by the marker comments here.
"""
from __future__ import annotations

import copy
import json
import sys

import torch
import torch.nn.functional as F

import neuron_prof
from neuron_prof.testing import neuron

WIDTH, BATCH, STEPS = 32, 16, 4
LAUNCH_US = 20
LONG_LAUNCH_US = 2000  # the scenarios' kernels: 2 ms each on the device, a sleep (no host core needed)
LONG_KERNELS = 50      # a long stream: 100 ms of kernels, against the host's ~1-5 ms to queue them


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, WIDTH)
        self.fc2 = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)) for _ in range(STEPS)]


def step(model, opt, x, y) -> float:
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def train_cpu(model: MLP) -> list[float]:
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return [step(model, opt, x, y) for x, y in batches()]


def train_prefetched(model: MLP, mod) -> list[float]:
    """The same training on the device, each batch copied in on a side stream while the previous
    step computes (pinned memory, non_blocking), the default stream waiting for its event."""
    model = copy.deepcopy(model).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    side = mod.Stream()

    def prefetch(x, y):
        with mod.stream(side):
            ready = mod.Event()
            out = x.pin_memory().to("neuron", non_blocking=True), y.pin_memory().to("neuron", non_blocking=True)
            ready.record()
        return out, ready

    data = batches()
    losses = []
    upcoming = prefetch(*data[0])
    for i in range(STEPS):
        (x, y), ready = upcoming
        mod.current_stream().wait_event(ready)
        for t in (x, y):
            t.record_stream(mod.current_stream())
        if i + 1 < STEPS:
            upcoming = prefetch(*data[i + 1])
        losses.append(step(model, opt, x, y))
    return losses


def long_work(n: int = LONG_KERNELS) -> torch.Tensor:
    """n kernels on the current stream (matmuls do not fuse with each other)."""
    a = torch.eye(8, device="neuron")
    for _ in range(n):
        a = a @ a
    return a


def overlap(mod, side) -> None:
    """Two streams with work and no wait between them: their kernels run at the same time."""
    long_work()
    with mod.stream(side):
        long_work()
    mod.synchronize()


def ordered(mod, side) -> None:
    """The default stream waits for an event of the side stream's long work."""
    ev = mod.Event()
    with mod.stream(side):
        long_work()
        ev.record()
    mod.current_stream().wait_event(ev)  # WAIT-LINE
    long_work(5)
    mod.synchronize()


def host_syncs(mod, side) -> None:
    """The host waits for the side stream only while the default stream has long work queued first,
    then for one event of the side stream that has long work queued after it."""
    long_work()
    with mod.stream(side):
        long_work(1)
    side.synchronize()  # SIDE-SYNC-LINE
    ev = mod.Event()
    with mod.stream(side):
        long_work(1)
        ev.record()  # EVENT-RECORD-LINE
        long_work()
    ev.synchronize()  # EVENT-SYNC-LINE
    mod.synchronize()


def timed(mod) -> float:
    start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
    start.record()  # START-LINE
    long_work(5)
    end.record()  # END-LINE
    end.synchronize()
    return start.elapsed_time(end)


def freed_while_read(mod, side) -> bool:
    """A tensor the host drops right after queuing a side-stream kernel that reads it, while the
    default stream allocates and fills same-sized tensors: the kernel still reads the tensor's
    values (its closure holds the memory; freed memory reused would read 7s, or fault)."""
    n = 1 << 18  # 1 MiB of float32: a block of its own from the host allocator, reused or unmapped on free
    x = torch.arange(n, dtype=torch.float32).to("neuron")
    mod.synchronize()
    with mod.stream(side):
        long_work()
        read = x * 3
    del x
    filled = [torch.full((n,), 7.0, device="neuron") for _ in range(8)]
    side.synchronize()
    del filled
    return torch.equal(read.cpu(), torch.arange(n, dtype=torch.float32) * 3)


def pinned_read_in_place(mod) -> dict:
    """A non_blocking copy from pinned memory reads its source when the device runs it (no staging
    copy: a change made on the host meanwhile shows); from pageable memory the source is copied at
    the call. The copies wait behind 100 ms of queued work; the host changes the sources at once."""
    out = {}
    for kind in ("pinned", "pageable"):
        src = torch.zeros(4)
        if kind == "pinned":
            src = src.pin_memory()
        long_work()
        dst = src.to("neuron", non_blocking=True)
        src.fill_(5.0)
        out[kind] = dst.cpu().tolist()
    return out


def generic_paths(mod) -> dict:
    """torch.Stream, torch.Event and torch.accelerator on the device (PyTorch's generic classes)."""
    x = torch.arange(6.0)
    s = torch.Stream("neuron")
    e = torch.Event("neuron")
    before = torch.accelerator.current_stream()
    torch.accelerator.set_stream(s)
    current = torch.accelerator.current_stream()
    y = x.to("neuron") * 2
    e.record(s)
    torch.accelerator.set_stream(before)
    before.wait_event(e)
    z = y + 1
    with s:  # torch.Stream as a context manager
        in_context = torch.accelerator.current_stream()
    s.synchronize()
    return {"new_stream_id": s.stream_id, "default_id": before.stream_id, "set": current == s,
            "in_context": in_context == s, "after": torch.accelerator.current_stream() == before,
            "result": torch.equal(z.cpu(), x * 2 + 1), "queries": [s.query(), e.query()],
            "neuron_stream_is_torch_stream": isinstance(mod.Stream(), torch.Stream),
            "neuron_event_is_torch_event": isinstance(mod.Event(), torch.Event),
            "default_stream": mod.default_stream().stream_id, "pinned": x.pin_memory().is_pinned()}


def main() -> None:
    mod = neuron.enable(devices=1, launch_us=LAUNCH_US)
    torch.set_num_threads(neuron.DEVICE_THREADS)  # the device's thread count: bitwise the same reductions
    torch.manual_seed(0)
    model = MLP()
    facts: dict = {"cpu": train_cpu(model), "prefetched": train_prefetched(model, mod)}
    facts["generic"] = generic_paths(mod)
    side = mod.Stream()
    facts["side"] = side.stream_id
    mod.set_launch_us(LONG_LAUNCH_US)
    facts["freed_while_read"] = freed_while_read(mod, side)
    facts["pinned_read"] = pinned_read_in_place(mod)
    with neuron_prof.profile(sys.argv[1]) as prof:
        for scenario in (overlap, ordered, host_syncs):
            scenario(mod, side)
            prof.step()
        facts["elapsed_ms"] = timed(mod)
        prof.step()
        mod.set_launch_us(LAUNCH_US)
        facts["captured"] = train_prefetched(model, mod)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
