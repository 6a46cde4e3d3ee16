"""Workloads on the emulated `neuron` device in the modes that behave like backends as they ship
(``neuron.enable``'s options), for tests/test_shipped_backend.py, each in a process of its own
(the modes are fixed per process). Prints one JSON object of facts last.

    python tests/shipped_backend_script.py fallbacks RUN  # kernels-only Kineto, a kernel per op, ops left to the CPU
    python tests/shipped_backend_script.py synchronous RUN  # kernels-only, every op waits for its kernel
"""
from __future__ import annotations

import json
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import neuron_prof
from neuron_prof.testing import neuron

STEPS = 4
LEFT_TO_CPU = ("aten::mse_loss",)
# PyTorch's own CPU kernel of mse_loss.out resizes its out= on the way (on the CPU too): not ours
warnings.filterwarnings("ignore", message="An output with one or more elements was resized")


class _DeviceOps(TorchDispatchMode):
    """The op names that ran with the device's tensors, as the dispatcher saw them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [a for a in (*args, *(kwargs or {}).values())
                for a in (a if isinstance(a, (list, tuple)) else [a])]
        if any(isinstance(a, torch.Tensor) and a.device.type == neuron.BACKEND for a in flat):
            self.names.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def _no_kernel(name: str) -> bool:
    """The dispatcher's word: some overload of ``name`` has neither a kernel for the device's key
    nor a composite one, so it reaches the device's boxed fallback."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys = ("PrivateUse1", "CompositeExplicitAutograd", "CompositeImplicitAutograd",
            "CompositeExplicitAutogradNonFunctional")
    overloads = [o for o in torch._C._dispatch_get_all_op_names() if o.partition(".")[0] == name]
    return any(not any(has(o, k) for k in keys) for o in overloads)


def _train(run: str | None) -> tuple[list[float], set[str]]:
    dev = torch.device("neuron:0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    watch = _DeviceOps()

    def step() -> float:
        x = torch.randn(16, 32, generator=g).to(dev)
        loss = torch.nn.functional.mse_loss(model(x), torch.zeros(16, 8, device=dev))  # left to the CPU by enable()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cumsum(x, 1)  # left to the CPU (neuron.UNIMPLEMENTED)
        return loss.item()  # the read of a device value

    with watch:
        losses = [step()]
    if run is None:
        return losses + [step() for _ in range(STEPS)], watch.names
    with neuron_prof.profile(run) as prof:
        for _ in range(STEPS):
            losses.append(step())
            prof.step()
        torch.neuron.synchronize()
    return losses, watch.names


def fallbacks(run: str) -> None:
    """Kernels only to Kineto, no report to neuron_prof's hook API, a kernel registered per op and
    ``LEFT_TO_CPU`` to the boxed CPU fallback: the losses with and without capture, and the ops
    that ran with the device's tensors that the dispatcher says have no kernel there."""
    neuron.enable(launch_us=100.0, report=False, kineto="kernels", registered_kernels=True, cpu_fallback=LEFT_TO_CPU)
    plain, seen = _train(None)
    captured, _ = _train(run)
    print(json.dumps({"plain": plain, "captured": captured,
                      "no_kernel": sorted(n for n in seen if _no_kernel(n)), "seen": sorted(seen)}))


def synchronous(run: str) -> None:
    """Kernels only, one op a kernel, and a queue of one: each op waits for its kernel, as on a
    synchronous backend (OpenReg's), so every value the host reads is ready."""
    neuron.enable(launch_us=20.0, report=False, kineto="kernels", max_queue=1, max_fused=1)
    losses, _ = _train(run)
    print(json.dumps({"captured": losses}))


if __name__ == "__main__":
    {"fallbacks": fallbacks, "synchronous": synchronous}[sys.argv[1]](*sys.argv[2:])
