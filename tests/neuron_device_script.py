"""Workloads on the emulated `neuron` device, run in a process of their own by
tests/test_neuron_device.py (enabling the device renames PyTorch's PrivateUse1 backend for the
whole process). Prints one JSON object of facts the tests check.

    python tests/neuron_device_script.py RUN_DIR OOM_RUN_DIR

RUN_DIR receives a neuron_prof capture of the same training on the device; OOM_RUN_DIR a short
capture that ends with a device out-of-memory (an allocation past the device's capacity).
"""
from __future__ import annotations

import copy
import json
import sys
import time

import torch

import neuron_prof
from neuron_prof.testing import neuron

VOCAB, DIM, HEADS, FF, BATCH, SEQ = 50, 32, 4, 64, 4, 8
LAUNCH_US = 200.0  # long kernels, so the host's run-ahead shows on a loaded machine


class TinyLM(torch.nn.Module):
    """Embedding, one transformer encoder layer (attention, layer norms, GELU-free MLP), and a
    head whose weight is the embedding's (tied, as GPT-2's: moved to the device, it must stay one
    parameter, with the gradients of both uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.block = torch.nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(x)))


def train(model: torch.nn.Module, device: str, steps: int = 3, prof=None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """AdamW (foreach, as PyTorch picks it for a PrivateUse1 device) on seeded random tokens; the
    loss read with .item() each step (a sync point), and a running sum of the logits' argmax
    positions by cumsum (an op the device leaves to the CPU)."""
    model = copy.deepcopy(model).to(device)
    assert model.head.weight is model.emb.weight, "the tied weight came apart"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        y = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x.to(device)).reshape(-1, VOCAB), y.to(device).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())  # ITEM-LINE
        torch.cumsum(x.to(device), 1)  # CUMSUM-LINE
        if prof is not None:
            prof.step()
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}  # STATE-LINE


def bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


RUN_AHEAD_LAUNCH_US = 2000.0
"""The launch cost while run_ahead() measures: 50 kernels need at least 100 ms of device time,
against about 2 ms of host time to queue their 100 ops (4-5 ms with both cores busy), so the
host returns first with a margin of 20x or more."""


def run_ahead(mod) -> dict:
    """Host time to enqueue N small ops against the time the device needs for them (each its own
    kernel: a matmul does not fuse with a matmul), and the wait of the .item() that needs them."""
    n = 50
    x = torch.randn(16, 16, device="neuron")
    for _ in range(n):  # the first calls pay for shape functions, later ones find them cached
        x = x @ x.T / 16
    torch.neuron.synchronize()
    mod.set_launch_us(RUN_AHEAD_LAUNCH_US)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = x @ x.T / 16
    enqueued = time.perf_counter_ns() - t0
    t1 = time.perf_counter_ns()
    x.sum().item()
    waited = time.perf_counter_ns() - t1
    mod.set_launch_us(LAUNCH_US)
    return {"ops": n, "enqueue_ns": enqueued, "item_wait_ns": waited,
            "device_floor_ns": int(n * RUN_AHEAD_LAUNCH_US * 1000)}


def main() -> None:
    mod = neuron.enable(devices=2, launch_us=LAUNCH_US, capacity_bytes=64 << 20)
    facts: dict = {"device_count": mod.device_count(), "backend": torch._C._get_privateuse1_backend_name()}
    t = torch.arange(6.0).reshape(2, 3)
    on = t.to("neuron:1")
    facts["device_strings"] = [str(on.device), str(t.neuron().device), str(torch.device("neuron:0"))]
    facts["is_neuron"] = [on.is_neuron, t.is_neuron]
    facts["round_trip"] = torch.equal(on.cpu(), t)
    # a tensor made on neuron:1 leaves the current device as it was; torch.accelerator knows the device
    facts["current_device"] = mod.current_device()
    facts["accelerator"] = [str(torch.accelerator.current_accelerator()), torch.accelerator.device_count()]
    facts["allocated_on_1"] = mod.memory_allocated("neuron:1")

    torch.manual_seed(0)
    model = TinyLM()
    # the device computes with DEVICE_THREADS, its CPU fallbacks with the host's threads: the
    # same everywhere, so that a parallel reduction's order is the same on both
    torch.set_num_threads(neuron.DEVICE_THREADS)
    cpu_losses, cpu_state = train(model, "cpu")
    dev_losses, dev_state = train(model, "neuron")
    facts["losses"] = {"cpu": cpu_losses, "neuron": dev_losses}
    facts["parameters_bitwise"] = bitwise(cpu_state, dev_state)
    with neuron_prof.profile(sys.argv[1]) as prof:
        captured_losses, captured_state = train(model, "neuron", prof=prof)
    facts["captured_losses"] = captured_losses
    facts["captured_parameters_bitwise"] = bitwise(cpu_state, captured_state)
    facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())

    x = torch.randn(5, 7)
    facts["fallback_results_equal"] = {
        "cumsum": torch.equal(torch.cumsum(x.to("neuron"), 1).cpu(), torch.cumsum(x, 1)),
        "sort": torch.equal(torch.sort(x.to("neuron"), 1).values.cpu(), torch.sort(x, 1).values),
        "nonzero": torch.equal(torch.nonzero(x.to("neuron") > 0).cpu(), torch.nonzero(x > 0)),
    }
    torch.manual_seed(3)
    a = torch.randn(4, 4, device="neuron")
    torch.manual_seed(3)
    b = torch.randn(4, 4)
    facts["random_as_cpu"] = torch.equal(a.cpu(), b)

    facts["run_ahead"] = run_ahead(mod)

    before = mod.memory_allocated()
    block = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    facts["allocated_grows_by"] = mod.memory_allocated() - before
    del block
    try:
        torch.empty(128 << 20, dtype=torch.uint8, device="neuron")
        facts["oom"] = None
    except torch.OutOfMemoryError as e:
        facts["oom"] = str(e).splitlines()[0]
    # an OOM inside a capture: the capture ends with it (the error leaves the with block)
    try:
        with neuron_prof.profile(sys.argv[2]):
            torch.empty(128 << 20, dtype=torch.uint8, device="neuron")  # OOM-LINE
            facts["captured_oom"] = None
    except torch.OutOfMemoryError as e:
        facts["captured_oom"] = str(e).splitlines()[0]
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
