"""The training's scalars with no code change: each step's loss (the scalar backward() ran on),
tokens and samples per step, and neuron_prof.log; read at step boundaries, never as an op or a
sync point of the user's."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import neuron_prof
from conftest import cli, write_script
from neuron_prof.analysis.metrics import per_step, series
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.sync import sync_points
from neuron_prof.errors import NeuronProfError


def _train(prof, steps: int, micro: int = 1, read_loss: bool = True, log: bool = False) -> list[list[float]]:
    """A small regression loop; each step's micro-batch losses as the loop itself reads them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(steps):
        losses = []
        for _ in range(micro):
            x, y = torch.randn(8, 16), torch.randn(8, 1)
            loss = torch.nn.functional.mse_loss(model(x), y) / micro
            loss.backward()
            if read_loss:
                losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        if log:
            neuron_prof.log("lr", 0.05 / (step + 1))
            neuron_prof.log("grad_scale", torch.tensor(2.0 ** step))
        out.append(losses)
        if prof is not None:
            prof.step(tokens=100 + step) if log else prof.step()
    return out


def test_each_steps_loss_is_the_loss_backward_ran_on_summed_over_micro_batches(tmp_path):
    with neuron_prof.profile(tmp_path / "run") as prof:
        losses = _train(prof, 5, micro=3)
    p = per_step(neuron_prof.load(tmp_path / "run").metrics)
    loss = p[p["name"] == "loss"].set_index("step")
    assert loss.index.tolist() == list(range(5))
    assert (loss["values"] == 3).all()  # one value per backward()
    # float32 losses, exactly: each micro-batch's loss / 3, summed: the step's mean loss, as
    # Trainer/Lightning report it
    assert loss["value"].tolist() == pytest.approx([float(np.sum(np.float64(x))) for x in losses], rel=1e-12)
    assert torch.autograd.backward.__module__ == "torch.autograd", "capture left its wrapper installed"


def test_reading_the_loss_adds_no_op_and_no_sync_point(tmp_path):
    for name, collectors in (("with", ("eager", "loss")), ("without", ("eager",))):
        with neuron_prof.profile(tmp_path / name, collectors=collectors) as prof:
            _train(prof, 4, read_loss=False)
    with_loss, without = neuron_prof.load(tmp_path / "with"), neuron_prof.load(tmp_path / "without")
    assert len(series(with_loss.metrics, "loss")) == 4 and without.metrics.empty
    names = {r: sorted(x.ops["name"].astype(str)) for r, x in (("with", with_loss), ("without", without))}
    assert names["with"] == names["without"]
    assert not {"aten::item", "aten::_local_scalar_dense"} & set(names["with"])
    assert sync_points(with_loss.ops, analyze(with_loss).op_parent).empty


def test_log_tokens_and_samples_per_step(tmp_path):
    with neuron_prof.profile(tmp_path / "run", samples_per_step=8) as prof:
        _train(prof, 4, log=True)
    m = neuron_prof.load(tmp_path / "run").metrics
    assert series(m, "tokens").tolist() == [100, 101, 102, 103]  # prof.step(tokens=...)
    assert series(m, "samples").tolist() == [8] * 4  # samples_per_step
    assert series(m, "lr").tolist() == pytest.approx([0.05 / (s + 1) for s in range(4)])
    assert series(m, "grad_scale").tolist() == [1.0, 2.0, 4.0, 8.0]  # a tensor, read at the boundary


def test_log_outside_capture_does_nothing_and_bad_values_are_one_line_errors(tmp_path):
    neuron_prof.log("loss", 1.0)  # no capture: nothing, no error
    with neuron_prof.profile(tmp_path / "run"):
        for name, value, says in (("x", torch.ones(3), "3 elements"), ("x", "fast", "str is not a number"),
                                  ("", 1.0, "non-empty string")):
            with pytest.raises(NeuronProfError, match=says):
                neuron_prof.log(name, value)


def test_always_on_records_every_steps_loss(tmp_path):
    with neuron_prof.profile(tmp_path / "run", mode="always-on", hang_timeout_s=None) as prof:
        losses = _train(prof, 6)
    run = neuron_prof.load(tmp_path / "run")
    assert run.ops.empty  # no dump: no detail
    assert series(run.metrics, "loss").tolist() == pytest.approx([x[0] for x in losses], rel=1e-12)


def test_record_finds_the_loss_and_takes_tokens_per_step(tmp_path):
    script = write_script(tmp_path / "train.py", """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            print(repr(loss.item()))
    """)
    done = cli("record", "-q", "-o", tmp_path / "run", "--tokens-per-step", "256", "--", sys.executable, script)
    assert done.returncode == 0, done.stderr
    printed = [float(x) for x in done.stdout.split()]
    m = neuron_prof.load(tmp_path / "run").metrics
    assert series(m, "loss").tolist() == pytest.approx(printed, rel=1e-12)
    assert series(m, "tokens").tolist() == [256.0] * 5
    bad = cli("record", "-o", tmp_path / "bad", "--tokens-per-step", "many", "--", sys.executable, script)
    assert bad.returncode == 2 and "invalid count 'many'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_loss_on_an_asynchronous_device_is_read_a_step_later_with_no_wait_of_ours(tmp_path):
    # the emulated device (a process of its own: enabling it renames PrivateUse1); nothing in the
    # loop reads a value, so the only waits for the device are the capture's own, if any
    script = write_script(tmp_path / "train.py", """
        import sys, torch, neuron_prof
        from neuron_prof.testing import neuron
        neuron.enable(launch_us=2000)  # slow kernels: the host runs steps ahead of the device
        torch.manual_seed(0)
        dev = torch.device("neuron:0")
        model = torch.nn.Linear(16, 1).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        kept = []
        with neuron_prof.profile(sys.argv[1]) as prof:
            for _ in range(6):
                loss = model(torch.randn(8, 16).to(dev)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                kept.append(loss.detach())
                prof.step()
        print(" ".join(repr(x.item()) for x in kept))
    """)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = neuron_prof.load(tmp_path / "run")
    assert series(run.metrics, "loss").tolist() == pytest.approx([float(x) for x in done.stdout.split()], rel=1e-12)
    # the loop reads no value, so the device's queue is never waited for: reading each step's
    # loss at its boundary would wait there at every step (the host runs steps ahead)
    assert run.queue_flushes.empty, run.queue_flushes[["step", "dur", "reason"]]
