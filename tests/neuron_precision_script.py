"""Mixed precision and activation checkpointing on the emulated `neuron` device, run in a process
of its own by tests/test_neuron_precision.py (enabling the device renames PyTorch's PrivateUse1
backend for the whole process). Prints one JSON object of facts the tests check.

    python tests/neuron_precision_script.py RUN_DIR GPT2_RUN_DIR

RUN_DIR receives a neuron_prof capture of the autocast training on the device, GPT2_RUN_DIR one of
a tiny Hugging Face GPT-2 trained there under autocast bf16 with gradient checkpointing.
"""
from __future__ import annotations

import copy
import json
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import neuron_prof
from neuron_prof.testing import neuron

WIDTH, BATCH, STEPS = 32, 16, 4


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


class MLP(torch.nn.Module):
    """Linear + GELU blocks and an MSE loss: ops that PyTorch's CPU autocast and its generic lists
    (CUDA's, which the device registers) treat alike (linear in bf16, GELU on what it is given,
    the loss in fp32), so the device's results can be bitwise the CPU's. ``ckpt``: each block
    checkpointed (None: not; True/False: ``use_reentrant``)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.ckpt: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.ckpt is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.ckpt)  # CKPT-LINE
        return x


def train(model: MLP, device: str, autocast: bool, ckpt: bool | None = None, prof=None) -> tuple[list[float], list[str]]:
    """Losses (as floats, exactly) and the dtype of the model's output, per step."""
    model = copy.deepcopy(model).to(device)
    model.ckpt = ckpt
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    g = torch.Generator().manual_seed(1)
    losses, dtypes = [], []
    for _ in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=g).to(device).requires_grad_(ckpt is True)
        y = torch.randn(BATCH, WIDTH, generator=g).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
            loss = F.mse_loss(out, y)  # LOSS-LINE
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        dtypes.append(str(out.dtype))
        if prof is not None:
            prof.step()
    return losses, dtypes


def generic_lists() -> dict[str, str]:
    """Output dtypes under autocast on the device for ops the CPU's own lists treat otherwise:
    the device follows the generic lists (fp32 for layer norm, softmax, exp), as CUDA does."""
    x = torch.randn(4, WIDTH).to("neuron")
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, torch.randn(WIDTH, WIDTH).to("neuron"))
        return {"linear": str(h.dtype), "layer_norm": str(F.layer_norm(h, (WIDTH,)).dtype),
                "softmax": str(torch.softmax(h, -1).dtype), "exp": str(torch.exp(h).dtype)}


def gpt2(checkpointing: bool, prof=None) -> list[float]:
    """A tiny GPT-2 (Transformers, from a config; no dropout) trained on the device under autocast
    bf16, with the model's own gradient checkpointing or without: losses, exactly."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(0, 64, (4, 16), generator=g).to("neuron")
        with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss  # GPT2-LOSS-LINE
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    return losses


def main() -> None:
    neuron.enable()
    torch.manual_seed(0)
    model = MLP()
    facts: dict = {"amp_supported": [str(d) for d in torch.get_device_module("neuron").get_amp_supported_dtype()]}
    facts["cpu_autocast"] = train(model, "cpu", autocast=True)
    facts["neuron_autocast"] = train(model, "neuron", autocast=True)
    facts["neuron_fp32"] = train(model, "neuron", autocast=False)
    facts["cpu_fp32"] = train(model, "cpu", autocast=False)
    facts["neuron_checkpoint"] = train(model, "neuron", autocast=True, ckpt=False)
    facts["neuron_checkpoint_reentrant"] = train(model, "neuron", autocast=True, ckpt=True)
    facts["cpu_checkpoint_reentrant"] = train(model, "cpu", autocast=True, ckpt=True)
    facts["generic_lists"] = generic_lists()
    with neuron_prof.profile(sys.argv[1]) as prof:
        facts["captured"] = train(model, "neuron", autocast=True, ckpt=False, prof=prof)
    facts["gpt2"] = gpt2(checkpointing=False)
    facts["gpt2_checkpointing"] = gpt2(checkpointing=True)
    with neuron_prof.profile(sys.argv[2]) as prof:
        facts["gpt2_captured"] = gpt2(checkpointing=True, prof=prof)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
