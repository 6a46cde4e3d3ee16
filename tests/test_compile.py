"""Capture must never switch torch.compile off: frames are compiled, not skipped."""
from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.utils import counters

import neuron_prof


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_inductor_compiles_while_capturing(tmp_path):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="inductor")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    with neuron_prof.profile(tmp_path / "run") as prof:
        for _ in range(3):
            out = compiled(x)
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert counters["stats"]["unique_graphs"] >= 1
    assert dict(counters["graph_break"]) == {}
    assert counters["frames"]["ok"] >= 1
    torch.testing.assert_close(compiled(x), model(x))
    run = neuron_prof.load(tmp_path / "run")
    names = set(run.ops["name"].astype(str))
    assert any(n.startswith("Torch-Compiled Region") for n in names), sorted(names)[:30]
    assert len(run.steps[run.steps["complete"]]) == 3
