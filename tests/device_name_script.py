"""A small training job on the emulated `neuron` device in its kernels-only mode (its Kineto
plugin reports kernels and nothing else, as many real backends ship), for
tests/test_device_name.py: traced by plain torch.profiler with CPU activity and memory only (no
device session: only the allocations' device type says where they were), then with CPU and
PrivateUse1 activity, each to a JSON file, then captured by neuron_prof. In a process of its own:
the device's modes are fixed by the first ``enable()`` of a process. Prints one JSON object of
facts last.

    python tests/device_name_script.py TRACE CPU_TRACE RUN
"""
from __future__ import annotations

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import neuron_prof
from neuron_prof.testing import neuron

STEPS = 3


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, dev: torch.device, g: torch.Generator) -> float:
    x = torch.randn(16, 32, generator=g).to(dev)
    loss = torch.nn.functional.mse_loss(model(x), torch.zeros(16, 8, device=dev))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def main(trace: str, cpu_trace: str, run: str) -> None:
    neuron.enable(kineto="kernels")
    dev = torch.device("neuron:0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    # first: once a device session ran, Kineto labels the device's track in every later trace
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        _step(model, opt, dev, g)
    p.export_chrome_trace(cpu_trace)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
        p.add_metadata("torch_version", torch.__version__)  # torch.profiler writes no version of its own
        for _ in range(STEPS):
            _step(model, opt, dev, g)
    p.export_chrome_trace(trace)
    with neuron_prof.profile(run) as prof:
        for _ in range(STEPS):
            _step(model, opt, dev, g)
            prof.step()
        torch.neuron.synchronize()
    print(json.dumps({"backend": torch._C._get_privateuse1_backend_name(), "torch": torch.__version__}))


if __name__ == "__main__":
    main(*sys.argv[1:])
