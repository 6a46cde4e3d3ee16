"""A detail step's flush runs on the rank's writer thread, not at the training thread's step
boundary (issue 39), and the run holds what a flush at the boundary wrote: each step's rows once,
none of a warmup step, every allocation. (That a flush run late keeps the next step's rows back
for that step's own flush is what tests/test_disk_budget.py's cut checks: no op after the cut.)"""
from __future__ import annotations

import threading

import torch

import neuron_prof
from conftest import written_by_thread
from neuron_prof.store.run import Run

STEPS = 30


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(16, 32)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_detail_step_boundary_writes_nothing_and_each_step_keeps_its_own_rows(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    me = threading.get_native_id()
    with neuron_prof.profile(tmp_path / "run") as prof:  # every step in full detail
        for _ in range(5):
            _train_step(model, opt)
            prof.step()
        writer = next(t for t in threading.enumerate() if t.name == "neuron_prof writer")
        mine, its = written_by_thread(me), written_by_thread(writer.native_id)
        for _ in range(STEPS - 5):
            _train_step(model, opt)
            prof.step()
        assert written_by_thread(me) == mine  # 25 detail boundaries, not one byte written by this thread
        prof.step()  # the last step's flush is waited for by the next boundary, so step 29's rows are on disk
        assert written_by_thread(writer.native_id) > its
    run = Run(tmp_path / "run")
    assert list(run.steps.loc[run.steps["complete"], "step"]) == list(range(STEPS + 1))
    ops = run.ops
    per_step = ops[ops["name"].astype(str) == "aten::addmm"].groupby("step").size()
    # the same loop every step: 2 Linear layers, one addmm each, every step once (none lost, none twice)
    assert per_step.loc[1:STEPS - 1].tolist() == [2] * (STEPS - 1)
    grads = run.memory_events[(run.memory_events["kind"].astype(str) == "alloc") & run.memory_events["grad"]]
    assert set(range(1, STEPS)) <= set(grads["step"])  # every step's gradients were allocated and recorded


def test_a_warmup_step_after_a_window_keeps_none_of_its_rows(tmp_path):
    """Windows back to back (no wait step): a flush handed over inside a window must not take the
    warmup step that follows."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_prof.profile(tmp_path / "run", schedule=neuron_prof.schedule(wait=0, warmup=1, active=3,
                                                                             repeat=3)) as prof:
        for _ in range(14):
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run(tmp_path / "run")
    active = set(run.steps.loc[run.steps["active"], "step"])
    assert active == {1, 2, 3, 5, 6, 7, 9, 10, 11}
    assert set(run.ops["step"]) == active
