"""Data-parallel training of the demo transformer: one process per rank, launched by torchrun
(``torchrun --nproc-per-node 2 examples/train_ddp.py --device neuron --profile runs/ddp``) or by
``neuron-prof demo --ranks 2``. On the emulated neuron device (``--device neuron``) the process
group is ``"neuron"``: DDP's gradient all-reduces run as kernels on the device's communication
stream, beside the backward's compute; on the CPU it is gloo. Each rank trains on its own seeded
batches; the report's Device section shows how much of the communication the backward hid."""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from neuron_prof.examples.train_transformer import TinyTransformer

BUCKET_CAP_MB = 0.05
"""DDP's bucket size: small enough for several buckets in this small model, so that the first
all-reduces are issued while the backward of the earlier layers still runs."""


def train(steps: int, prof=None, device: str = "cpu", batch: int = 8, seq: int = 32, vocab: int = 256) -> list[float]:
    """``steps`` DDP steps of the seeded transformer on this rank's batches; ``prof.step()`` after each."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TinyTransformer(vocab=vocab).to(device),
                                                      bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(steps):
        data = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets as they are ready
        opt.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    return losses


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", choices=("cpu", "neuron"), default="cpu")
    p.add_argument("--profile", metavar="RUN", help="capture with neuron_prof.profile into RUN")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.device == "neuron":
        from neuron_prof.testing import neuron

        neuron.enable()
    dist.init_process_group("neuron" if args.device == "neuron" else "gloo")
    try:
        if args.profile:
            import neuron_prof

            with neuron_prof.profile(args.profile, schedule=neuron_prof.schedule(wait=2, warmup=1, active=5)) as prof:
                losses = train(args.steps, prof, args.device)
        else:
            losses = train(args.steps, device=args.device)
    finally:
        dist.destroy_process_group()
    print(f"rank {int(os.environ.get('RANK', 0))}: trained {args.steps} steps, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
