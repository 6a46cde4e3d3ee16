"""A small real transformer language model trained on CPU: the demo and test workload.

Run it plain (``python examples/train_transformer.py --steps 5``), under capture with no code
change (``neuron-prof record -o runs/t -- python examples/train_transformer.py``), or with the
API (``--profile runs/t``), which is what ``neuron-prof demo`` does.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def train(steps: int, prof=None, batch: int = 8, seq: int = 32, vocab: int = 256, seed: int = 0,
          device: str = "cpu") -> list[float]:
    """Train for ``steps`` iterations; ``prof.step()`` after each when a profiler is given.
    ``device``: where the model and the batch live (``"neuron"`` once
    ``neuron_prof.testing.neuron.enable()`` ran); the same seeded model and data on any device."""
    torch.manual_seed(seed)
    model = TinyTransformer(vocab=vocab)
    data = torch.randint(0, vocab, (batch, seq + 1))
    if device != "cpu":
        model, data = model.to(device), data.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a sync point on an asynchronous device
        if prof is not None:
            prof.step()
    return losses


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", metavar="RUN", help="capture with neuron_prof.profile into RUN")
    p.add_argument("--exit-code", type=int, default=0, help="exit with this code (tests use it)")
    args = p.parse_args(argv)
    if args.profile:
        import neuron_prof
        with neuron_prof.profile(args.profile, schedule=neuron_prof.schedule(wait=1, warmup=1, active=3)) as prof:
            losses = train(args.steps, prof)
    else:
        losses = train(args.steps)
    print(f"trained {args.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    raise SystemExit(args.exit_code)


if __name__ == "__main__":
    main()
