"""A small training job written for CUDA, for tests/test_port_check.py: captured once on the CPU
(its CUDA lines guarded, so they do not run there) and once on the emulated `neuron` device, so
that what ``neuron-prof port-check --target neuron`` predicts of the CPU run can be checked
against what the device did. Each line port-check must find carries a ``PORT-`` marker comment
(the tests find lines by marker, never by number); ``NOT-A-SITE`` lines must not be found.

    python tests/port_check_script.py RUN_DIR cpu|neuron

Prints one JSON object of facts last. Imported as a module (``--import port_check_script``), it
only registers its custom op ``porttest::scale``.
"""
from __future__ import annotations

import json
import sys

import torch

try:
    import triton  # PORT-TRITON
except ImportError:
    triton = None
try:
    from flash_attn import flash_attn_func  # PORT-FLASH
except ImportError:
    flash_attn_func = None

VOCAB, DIM, BATCH, SEQ, STEPS = 50, 16, 4, 8, 3


@torch.library.custom_op("porttest::scale", mutates_args=(), device_types="cpu")
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A kernel written for the CPU only (device_types="cpu"), as a CUDA-only custom op is."""
    return x * factor


@scale.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


if triton is not None:
    @triton.jit  # PORT-TRITON-JIT
    def add_kernel(x_ptr, y_ptr, n):
        pass


def build_extension():
    """Never called: a CUDA extension, which a port builds for the new device. A docstring that
    names torch.cuda.synchronize() or "cuda" is not a call site (NOT-A-SITE-DOCSTRING)."""
    from torch.utils.cpp_extension import load_inline  # PORT-CPPEXT-IMPORT
    return load_inline("ext", cpp_sources="", cuda_sources="")  # PORT-LOAD-INLINE


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.lin = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(x))  # OP-EMBEDDING


def train(device: str, prof) -> list[float]:
    """SGD on seeded random tokens; the ops the emulated device leaves to the CPU are on lines
    of their own: cumsum, topk, sort, clip_grad_norm_'s vector norms, the embedding's backward."""
    torch.manual_seed(0)
    model = Model().to(device)
    if torch.cuda.is_available(): model = model.cuda()  # PORT-CUDA
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device, non_blocking=device == "cuda")  # PORT-RAN
        h = model(x)
        c = torch.cumsum(h, 1)  # OP-CUMSUM
        top = torch.topk(c, 2, dim=-1).values  # OP-TOPK
        srt = torch.sort(h, dim=-1).values  # OP-SORT
        loss = top.square().mean() + srt.square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # OP-NORM
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            scale(h, 0.5).sum()  # OP-CUSTOM
        # moving this to .cuda() or torch.cuda.synchronize() here: a comment, not a call (NOT-A-SITE-COMMENT)
        if torch.cuda.is_available(): torch.cuda.synchronize()  # PORT-SYNC
        losses.append(loss.item())
        prof.step()
    return losses


def main() -> None:
    run_dir = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else ("cuda" if torch.cuda.is_available() else "cpu")  # PORT-DEVICE
    import neuron_prof
    if device == "neuron":
        from neuron_prof.testing import neuron
        neuron.enable()
        torch.set_num_threads(neuron.DEVICE_THREADS)
    else:
        torch.set_num_threads(1)
    with neuron_prof.profile(run_dir) as prof:
        losses = train(device, prof)
    print(json.dumps({"device": device, "losses": losses}))


if __name__ == "__main__":
    main()
