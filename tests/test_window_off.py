"""Steps outside a detail window cost (almost) nothing (issue 24): what the collectors keep doing
there is only what step-level data needs, and what they record stays exactly as before."""
import random

import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module

import neuron_prof
from neuron_prof.collectors._engine import load_engine
from neuron_prof.collectors._memtrack import MemoryTracker


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))


def test_module_hooks_are_attached_only_while_a_window_needs_them(tmp_path):
    model, x = _mlp(), torch.randn(4, 8)
    attached = []
    with neuron_prof.profile(tmp_path / "run", collectors=["eager"],
                             schedule=neuron_prof.schedule(wait=2, warmup=0, active=2, repeat=2)) as prof:
        for _ in range(8):
            attached.append(len(nn_module._global_forward_pre_hooks))
            model(x).sum().backward()
            prof.step()
    assert len(nn_module._global_forward_pre_hooks) == 0
    # until the first module call has been seen (step 0), then in the windows only (steps 2-3, 6-7)
    assert attached == [1, 0, 1, 1, 0, 0, 1, 1]
    ops = neuron_prof.load(tmp_path / "run").ops
    assert sorted(set(ops.step)) == [2, 3, 6, 7]
    # every captured step names its modules as a capture with the hooks always on did
    for step in (2, 3, 6, 7):
        assert set(ops.module[ops.step == step]) == {"", "0", "1", "2"}


def test_losses_outside_windows_are_recorded_bit_for_bit(tmp_path):
    model, x = _mlp(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with neuron_prof.profile(tmp_path / "run", collectors=["loss"],
                             schedule=neuron_prof.schedule(wait=10**6, warmup=0, active=1)) as prof:
        for _ in range(5):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            prof.step()
    metrics = neuron_prof.load(tmp_path / "run").metrics
    assert list(metrics.value[metrics.name == "loss"]) == losses


def test_the_live_set_holds_every_block_through_growth_and_frees():
    """The memory tracker's table of live blocks (outside windows: what live bytes, late frees and
    an out-of-memory report need) through thousands of blocks and frees in any order."""
    tracker = MemoryTracker(load_engine().extension())
    tracker.start(10**6)
    try:
        rng = random.Random(1)
        held: list[torch.Tensor] = []
        for i in range(12000):
            if held and rng.random() < 0.4:
                held.pop(rng.randrange(len(held)))
            else:
                held.append(torch.empty(rng.randint(1, 300)))
        live, _ = tracker.snapshot()
        assert sorted(int(a) for a in live["addr"]) == sorted(t.untyped_storage().data_ptr() for t in held)
        assert len(held) > 2000  # the table grew past its first size more than once
        (cpu,) = [t for t in tracker.totals() if t[0] == 0]
        assert cpu[2] == sum(t.untyped_storage().nbytes() for t in held)
    finally:
        tracker.stop()
