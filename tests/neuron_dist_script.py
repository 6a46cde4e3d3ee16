"""One rank of a distributed training job, on the emulated `neuron` device or on the CPU (the
reference): run by tests/test_neuron_distributed.py as WORLD processes with torchrun's environment
(``conftest.gloo_env``). Writes ``OUT/rank<R>.json``: the losses (bitwise comparable between the
device and the CPU) and how many collective kernels of each op the capture holds.

    python tests/neuron_dist_script.py KIND DEVICE OUT [RUN_DIR]

KIND: ``ddp-one`` (DDP, every gradient in one bucket, all-reduced after backward), ``ddp-many``
(DDP, one bucket per layer: all-reduces issued during backward), ``fsdp`` (FSDP2 ``fully_shard``
per layer), ``tp`` (a DTensor tensor-parallel MLP: column- then row-wise). DEVICE: ``neuron`` or
``cpu``. RUN_DIR: capture the run there (device runs). Environment ``SLOW_RANK=R``: rank R's device
pays ``SLOW_LAUNCH_US`` per kernel (a slower device: its kernels reach every collective last).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import neuron_prof

DIM, LAYERS, BATCH, STEPS = 192, 6, 256, 5
LAUNCH_US = 100.0
"""Long enough kernels that the backward's compute on the device is still running when the first
bucket's all-reduce is issued (the host queues a layer's backward in well under a kernel's time)."""
SLOW_LAUNCH_US = 4000.0
"""The slow rank's launch cost: its forward and backward's ~40 kernels take 160 ms more a step
than the other rank's (about 4 ms), so its device reaches each all-reduce that much later."""


def model() -> torch.nn.Sequential:
    """LAYERS linear layers with ReLUs: 6 * (192*192 + 192) float32 parameters, 0.89 MB, under
    DDP's 1 MB first bucket (so ``bucket_cap_mb=25`` makes one bucket)."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(DIM, DIM), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def wrap(kind: str, net: torch.nn.Module, device: str) -> torch.nn.Module:
    if kind == "ddp-one":
        return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=25)
    if kind == "ddp-many":
        # 0.15 MB: one layer's weight and bias (148 KB) per bucket
        return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.15)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(net, mesh=mesh)
    if kind == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {str(i): ColwiseParallel() if i % 4 == 0 else RowwiseParallel() for i in range(0, 2 * LAYERS, 2)}
        return parallelize_module(net, mesh, plan)
    raise SystemExit(f"unknown kind {kind}")


def main() -> None:
    kind, device, out = sys.argv[1], sys.argv[2], sys.argv[3]
    run_dir = sys.argv[4] if len(sys.argv) > 4 else None
    torch.set_num_threads(1)  # the device computes with one thread: the CPU reference too
    if device == "neuron":
        from neuron_prof.testing import neuron

        slow = os.environ.get("SLOW_RANK") == os.environ["RANK"]
        neuron.enable(launch_us=SLOW_LAUNCH_US if slow else LAUNCH_US)
        dist.init_process_group("neuron")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = wrap(kind, model().to(device), device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + (0 if kind == "tp" else rank))  # TP ranks share their input
    losses: list[float] = []
    if device == "neuron":
        # the set-up's collectives (DDP's and DTensor's broadcasts and scatters) are queued before the
        # capture: done before it starts, so that every collective kernel the run holds was issued in it
        torch.neuron.synchronize()
    prof = neuron_prof.profile(run_dir) if run_dir else None
    if prof is not None:
        prof.__enter__()
    for _ in range(STEPS):
        x = torch.randn(BATCH, DIM, generator=g).to(device)
        y = torch.randn(BATCH, DIM, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(net(x), y)  # FORWARD-LINE
        loss.backward()  # BACKWARD-LINE
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().full_tensor().item() if hasattr(loss, "full_tensor") else loss.item())
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.__exit__(None, None, None)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses}, f)
    dist.destroy_process_group()
    if device == "cpu":
        # The CPU reference leaves without interpreter teardown: gloo's threads of its FSDP2 job
        # sometimes abort the process in static destructors at exit ("terminate called without an
        # active exception"), after everything this script does is written.
        os._exit(0)


if __name__ == "__main__":
    main()
