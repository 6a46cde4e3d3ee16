"""torch.compile(backend="neuron") on the emulated device, run in a process of its own by
tests/test_neuron_compile.py. A two-layer model with a graph break, trained at two batch sizes
under capture (a recompile), a second copy of it compiled (the backend's cache hit), and a
function compiled with dynamic shapes (refused). Prints one JSON object of facts.

    python tests/neuron_compile_script.py RUN_DIR
"""
from __future__ import annotations

import copy
import json
import sys

import torch

import neuron_prof
from neuron_prof.testing import neuron

BATCHES = (8, 8, 12, 12)


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x))
        print("between the layers")  # BREAK-LINE
        # attention over h's 4 chunks of 8: the attention kernel is chosen while tracing, on fake tensors
        q = h.view(1, h.shape[0], 4, 8)
        h = h + torch.nn.functional.scaled_dot_product_attention(q, q, q).reshape(h.shape)
        return self.b(h * 2 + 1).relu()


def main() -> None:
    neuron.enable(launch_us=20)
    torch.manual_seed(0)
    eager = TwoLayer().to("neuron")
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    g = torch.Generator().manual_seed(2)
    facts: dict = {"equal": [], "close": []}
    with neuron_prof.profile(sys.argv[1]) as prof:
        for batch in BATCHES:
            x = torch.randn(batch, 16, generator=g).to("neuron")
            outs = []
            for m, opt in zip((compiled, eager), opts):
                out = m(x)
                out.square().mean().backward()
                opt.step()
                opt.zero_grad()
                outs.append(out.detach().cpu())
            a, b = outs
            facts["equal"].append(torch.equal(a, b))
            facts["close"].append(torch.allclose(a, b, rtol=1e-5, atol=1e-6))
            prof.step()
        # Dynamo's caches dropped and the model compiled again: the same graphs, found in the
        # backend's cache
        torch._dynamo.reset()
        compiled(torch.randn(8, 16, generator=g).to("neuron")).sum().backward()
    try:
        f = torch.compile(lambda t: (t * 2).sum(), backend="neuron", dynamic=True)
        f(torch.randn(5).to("neuron"))
        facts["dynamic_error"] = None
    except Exception as e:  # Dynamo wraps the backend's error
        facts["dynamic_error"] = str(e)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
