"""A training on the emulated `neuron` device that leaks device memory, captured by neuron_prof, for
tests/test_device_memory_counters.py. The device's modes are fixed by the first enable() in a
process, so each mode runs in a process of its own. Prints one JSON object of facts last.

    python tests/device_memory_counters_script.py counters RUN  # the allocator reports nothing to the profiler
    python tests/device_memory_counters_script.py events RUN    # the allocator reports every allocation (default)
    python tests/device_memory_counters_script.py loss-item-events RUN    # keeps only loss.item(), every collector
    python tests/device_memory_counters_script.py loss-item-counters RUN  # the same, the allocator reporting nothing
    python tests/device_memory_counters_script.py loss-kept-events RUN    # keeps each step's loss in a list
"""
from __future__ import annotations

import json
import sys

import torch

import neuron_prof
from neuron_prof.testing import neuron

STEPS = 8
KEPT_PER_STEP = 2
KEPT_ELEMENTS = 4096  # float32: 16,384 bytes a block
WIDE = 1024  # the loss modes' hidden width
# every default collector but "loss": it holds each step's loss on the device until it reads a batch
# of them (4 B a step of neuron_prof's own, which would add to the leak the test measures)
COLLECTORS = ("eager", "compiler", "memory", "collectives", "device")


def train(run: str, allocator_reports: bool) -> dict:
    """STEPS captured steps of a small model on neuron:0; each keeps KEPT_PER_STEP device blocks in a
    list across steps (the leak). The device's own counters are read just before each step
    boundary: nothing allocates between that read and the capture's."""
    mod = neuron.enable(allocator_reports=allocator_reports)
    dev = torch.device("neuron:0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    kept: list[torch.Tensor] = []
    allocated, peak = [], []
    with neuron_prof.profile(run, collectors=COLLECTORS) as prof:
        for _ in range(STEPS):
            x = torch.randn(16, 32, generator=g).to(dev)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            for _ in range(KEPT_PER_STEP):
                kept.append(torch.empty(KEPT_ELEMENTS, device=dev))  # LEAK-LINE
            loss.item()
            del x, loss
            allocated.append(mod.memory_allocated(0))
            peak.append(mod.max_memory_allocated(0))
            prof.step()
    return {"leak_bytes_per_step": KEPT_PER_STEP * KEPT_ELEMENTS * 4, "blocks_per_step": KEPT_PER_STEP,
            "allocated": allocated, "peak": peak}


def train_loss(run: str, allocator_reports: bool, keep: bool) -> dict:
    """STEPS captured steps with every default collector, the loss collector included (it holds
    each step's loss on the device until it reads a batch of them): the loop keeps each step's
    loss itself (``keep``: the classic leak, 4 bytes a step on the device) or only its value."""
    mod = neuron.enable(allocator_reports=allocator_reports)
    dev = torch.device("neuron:0")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    # wide enough that its peak (parameters, gradients: ~8 MiB) dwarfs one loss a step
    model = torch.nn.Sequential(torch.nn.Linear(32, WIDE), torch.nn.ReLU(), torch.nn.Linear(WIDE, WIDE),
                                torch.nn.ReLU(), torch.nn.Linear(WIDE, 8)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    history: list = []
    allocated = []
    with neuron_prof.profile(run) as prof:
        for _ in range(STEPS):
            x = torch.randn(16, 32, generator=g).to(dev)
            loss = model(x).square().mean()  # LOSS-LINE
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item()  # the loop's sync: the device runs its queue
            history.append(loss if keep else value)
            del x, loss
            allocated.append(mod.memory_allocated(0))
            prof.step()
    return {"loss_bytes": 4, "allocated": allocated}


if __name__ == "__main__":
    mode, run_dir = sys.argv[1], sys.argv[2]
    if mode.startswith("loss-"):
        _, what, reports = mode.split("-")
        print(json.dumps(train_loss(run_dir, allocator_reports=reports == "events", keep=what == "kept")))
    else:
        print(json.dumps(train(run_dir, allocator_reports={"counters": False, "events": True}[mode])))
