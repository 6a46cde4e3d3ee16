"""Workloads on the emulated `neuron` device for tests/test_kineto_device.py, each in a process of
its own (enabling the device renames PyTorch's PrivateUse1 backend for the whole process). Prints
one JSON object of facts last.

    python tests/kineto_device_script.py windows TRACE RUN      # torch.profiler, then neuron_prof
    python tests/kineto_device_script.py coexist RUN TRACE_DIR  # the job's own torch.profiler inside a capture
    python tests/kineto_device_script.py ddp TRACE_DIR          # one rank of DDP under torch.profiler
"""
from __future__ import annotations

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import neuron_prof
from neuron_prof.testing import neuron

STEPS = 4
DEVICE_ACTIVITY = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _model(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _step(model, opt, dev, g) -> float:
    x = torch.randn(16, 32, generator=g).to(dev)
    loss = torch.nn.functional.mse_loss(model(x), torch.zeros(16, 8, device=dev))
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cumsum(x, 1)  # an op the device leaves to the CPU: its copies to the host
    return loss.item()  # a sync point: the host waits, a copy to the host


def _truth(mod) -> dict:
    """The device's own count of what it ran while a trace recorded, per "device:stream"."""
    return {f"{d}:{s}": list(v) for (d, s), v in mod.traced_kernels(reset=True).items()}


def windows(trace: str, run: str) -> None:
    """The same training, first under plain torch.profiler (CPU and the device), then under
    neuron_prof: each window's trace against the device's own count of that window."""
    mod = neuron.enable(launch_us=100.0)
    dev = torch.device("neuron:0")
    model, opt = _model(dev)
    g = torch.Generator().manual_seed(1)
    _step(model, opt, dev, g)  # shapes cached, nothing in flight
    torch.neuron.synchronize()
    mod.traced_kernels(reset=True)
    with profile(activities=DEVICE_ACTIVITY) as p:
        for _ in range(STEPS):
            _step(model, opt, dev, g)
    p.export_chrome_trace(trace)
    profiled = _truth(mod)
    with neuron_prof.profile(run) as prof:
        for _ in range(STEPS):
            _step(model, opt, dev, g)
            prof.step()
        torch.neuron.synchronize()  # the last step's kernels ran before the capture ends
    print(json.dumps({"profiled": profiled, "captured": _truth(mod)}))


def coexist(run: str, traces: str) -> None:
    """A capture of every step, inside which the job runs its own torch.profiler (steps 2-3,
    scheduled: prepared in step 1, recording 2 and 3); and a capture started while the job's
    profiler runs. Losses with and without either."""
    neuron.enable(launch_us=20.0)
    dev = torch.device("neuron:0")

    def train(profiled: bool) -> list[float]:
        model, opt = _model(dev)
        g = torch.Generator().manual_seed(1)
        losses = []
        ready = (lambda p: p.export_chrome_trace(os.path.join(traces, "inside.json"))) if profiled else None
        with neuron_prof.profile(run) if profiled else _null() as prof, \
                profile(activities=DEVICE_ACTIVITY, schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                        on_trace_ready=ready) if profiled else _null() as user:
            for _ in range(6):
                losses.append(_step(model, opt, dev, g))
                if user is not None:
                    user.step()
                if prof is not None:
                    prof.step()
        return losses

    plain = train(False)
    both = train(True)
    # the job's profiler first, a capture started inside it
    model, opt = _model(dev)
    g = torch.Generator().manual_seed(1)
    with profile(activities=DEVICE_ACTIVITY) as user:
        with neuron_prof.profile(run + "-inside") as prof:
            for _ in range(2):
                _step(model, opt, dev, g)
                prof.step()
    user.export_chrome_trace(os.path.join(traces, "outside.json"))
    print(json.dumps({"plain": plain, "both": both}))


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def ddp(traces: str) -> None:
    """One rank of a data-parallel training on the device, the group made with no backend named
    (the accelerator's default), under plain torch.profiler; its trace in ``traces``."""
    import torch.distributed as dist

    neuron.enable(launch_us=100.0)
    dist.init_process_group()  # the device's backend: "neuron", as nccl is CUDA's
    rank = dist.get_rank()
    dev = torch.device("neuron:0")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(dev),
        bucket_cap_mb=0.05)  # a few buckets: all-reduces beside the backward's kernels
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    losses = []
    with profile(activities=DEVICE_ACTIVITY, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(traces, f"rank{rank}.json"))) as p:
        for _ in range(5):
            loss = model(torch.randn(8, 64, generator=g).to(dev)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            p.step()
    print(json.dumps({"rank": rank, "backend": dist.get_backend(), "losses": losses}))
    dist.destroy_process_group()


if __name__ == "__main__":
    {"windows": windows, "coexist": coexist, "ddp": ddp}[sys.argv[1]](*sys.argv[2:])
