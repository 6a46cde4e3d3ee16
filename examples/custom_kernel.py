"""A custom kernel on the device, as a team moving to Trainium writes one with NKI: an RMSNorm
forward and its backward, each registered as a custom op that runs as one kernel of its own on
the emulated ``neuron`` device (``neuron_prof.testing.neuron.custom_kernel``), the backward wired
to the forward by hand (``register_autograd``), in a small model trained eagerly or under
``torch.compile(backend="neuron")``:

    python -m neuron_prof.examples.custom_kernel RUN [--compile] [STEPS]
    neuron-prof record -o RUN -- python -m neuron_prof.examples.custom_kernel

The same functions on the CPU are the reference the kernels must match (bitwise, here).
"""
from __future__ import annotations

import sys

import torch

from neuron_prof.testing import neuron

WIDTH, BATCH, EPS = 32, 16, 1e-6
FORWARD, BACKWARD = "neuron_prof_examples::rms_norm", "neuron_prof_examples::rms_norm_backward"


@neuron.custom_kernel(FORWARD)
def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


@neuron.custom_kernel(BACKWARD)
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``rms_norm`` with respect to ``x`` and ``weight``."""
    inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    normed = x * inv
    grad_weight = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
    g = grad * weight
    grad_x = inv * (g - normed * (g * normed).mean(-1, keepdim=True))
    return grad_x, grad_weight


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    return tuple(rms_norm_backward(grad, x, weight))


rms_norm.register_autograd(_backward, setup_context=_setup_context)


class Model(torch.nn.Module):
    """Linear, the custom RMSNorm, GELU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, WIDTH)
        self.norm_weight = torch.nn.Parameter(torch.ones(WIDTH))
        self.fc2 = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(rms_norm(self.fc1(x), self.norm_weight)))  # NORM-LINE


def train(device: str, steps: int = 4, compiled: bool = False, prof=None) -> list[float]:
    """Seeded model and batches, SGD; the losses, read after each step."""
    torch.manual_seed(0)
    model = Model().to(device)
    step_fn = torch.compile(model, backend="neuron", dynamic=False) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(BATCH, WIDTH, generator=g).to(device)
        y = torch.randn(BATCH, WIDTH, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(step_fn(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    return losses


def main(argv: list[str]) -> None:
    import neuron_prof

    neuron.enable()
    compiled = "--compile" in argv
    rest = [a for a in argv if a != "--compile"]
    with neuron_prof.profile(rest[0]) as prof:
        losses = train("neuron", int(rest[1]) if len(rest) > 1 else 4, compiled, prof)
    print("losses:", " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main(sys.argv[1:])
