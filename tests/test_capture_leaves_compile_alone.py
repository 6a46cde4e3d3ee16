"""A captured run compiles what an uncaptured run compiles: same compile ids, frames, graphs and
cache hits (issue 9, defect 3), with ``torch.compile`` on a module, on the optimizer's step and on a
whole training step; and it trains alike: the same losses, bit for bit (issue 24). Real runs: each
script runs in a fresh process, plain and captured, with a private Inductor cache per script.

Captured in every mode (issue 24): detail, under ``neuron-prof record``; always-on with detail
sampled one step in 3, and always-on with two steps captured on demand (``capture_next``), both in
process with ``neuron_prof.profile``. The always-on modes attach and detach the op observer and
the collectors' hooks between steps: none of it may cost a recompile.

The uncaptured figures are torch's own (``torch._dynamo.utils.counters`` and its compilation
metrics, printed by the script); the captured ones are what the run recorded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import cli, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

# torch's own view of what it compiled, and the losses the script trained to (those it appends to
# LOSSES), printed by every script below at exit
COUNTERS = """
import atexit, json

LOSSES = []

def _print_counters():
    from torch._dynamo.utils import counters, get_compilation_metrics
    metrics = [m for m in get_compilation_metrics() if m.is_forward is not False]
    print("COUNTERS " + json.dumps({
        "compile_ids": [str(m.compile_id) for m in metrics],
        "frames": [m.co_name for m in metrics],
        "graph_ops": [m.graph_op_count for m in metrics],
        "frames_total": counters["frames"]["total"],
        "unique_graphs": counters["stats"]["unique_graphs"],
        "fx_graph": {r: counters["inductor"][f"fxgraph_cache_{r}"] for r in ("hit", "miss", "bypass")},
        "aot_autograd": {r: counters["aot_autograd"][f"autograd_cache_{r}"] for r in ("hit", "miss", "bypass")},
        "losses": LOSSES,
    }), flush=True)

atexit.register(_print_counters)
"""

# how every script below is captured in process: ``--capture MODE RUN_DIR`` at the end of its
# arguments; steps end at the optimizer's step, as under `record`
CAPTURE = """
import contextlib, sys

MODE = sys.argv[sys.argv.index("--capture") + 1] if "--capture" in sys.argv else None
ON_DEMAND_AFTER = 1  # capture_next(2) in this step: steps 3 and 4 in full detail


def capture():
    if MODE is None:  # plain, or under `neuron-prof record`
        return contextlib.nullcontext()
    import neuron_prof

    settings = {"sampled": {"detail_every": 3}, "on-demand": {}}[MODE]
    return neuron_prof.profile(sys.argv[-1], mode="always-on", auto_step=True, **settings)


def on_demand(prof, step):
    if MODE == "on-demand" and step == ON_DEMAND_AFTER:
        prof.capture_next(2)
"""
# ``--capture`` modes by the ids the tests show; "detail" is `record`'s default
CAPTURES = {"detail": "detail", "sampled": "always-on, detail 1 step in 3", "on-demand": "always-on, 2 steps on demand"}

MODULE_SCRIPT = COUNTERS + CAPTURE + """
import torch

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = self.a(x).relu()
        if h.sum() > 0:  # data-dependent branch: a graph break, two graphs
            h = h * 2
        return self.b(h)

torch.manual_seed(0)
model = torch.compile(M())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with capture() as prof:
    for step in range(6):  # sampled: steps 1 and 4; on demand: step 1 (the default's sample), 3 and 4
        loss = model(torch.randn(8, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        LOSSES.append(loss.item())
        on_demand(prof, step)
"""

OPTIMIZER_SCRIPT = COUNTERS + CAPTURE + """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
if sys.argv[1] == "optimizer":  # the PyTorch recipe "compiling the optimizer"
    compiled_step = torch.compile(opt.step, backend="eager")

    def train_step(x):
        model(x).sum().backward()
        compiled_step()
        opt.zero_grad()
else:  # the whole training step, optimizer included
    @torch.compile(backend="eager")
    def train_step(x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

with capture():
    for _ in range(3):
        train_step(torch.randn(4, 8))
"""


def run_script(script: Path, cache: Path, *args: str, record: Path | None = None) -> dict:
    """The script's printed counters (and losses); under ``neuron-prof record -o record`` if given."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    if record is None:
        res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900,
                             env={**os.environ, **env}, cwd=script.parent)
    else:
        res = cli("record", "-q", "-o", record, "--", sys.executable, script, *args, env=env, cwd=script.parent,
                  timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("COUNTERS ")]
    assert len(lines) == 1, res.stdout
    return json.loads(lines[0].split(" ", 1)[1])


def run_captured(script: Path, cache: Path, *args: str, capture: str, run_dir: Path) -> dict:
    """The script's counters, captured into ``run_dir`` in mode ``capture`` (a key of CAPTURES)."""
    if capture == "detail":
        return run_script(script, cache, *args, record=run_dir)
    return run_script(script, cache, *args, "--capture", capture, str(run_dir))


def recorded(run_dir: Path) -> dict:
    """What the captured run says torch compiled, in the shape of the counters."""
    run = neuron_prof.load(run_dir)
    comp = run.compiles.sort_values("ts")
    cache = run.compile_cache
    counts = {c: {r: int(((cache.cache == c) & (cache.result == r)).sum()) for r in ("hit", "miss", "bypass")}
              for c in ("fx_graph", "aot_autograd")}
    return {"compile_ids": comp.compile_id.astype(str).tolist(), "frames": comp.func.astype(str).tolist(),
            "graph_ops": comp.graph_ops.tolist(), **counts}


SAME = ("compile_ids", "frames", "graph_ops", "frames_total", "unique_graphs", "fx_graph", "aot_autograd")


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """``plain_runs(name, body, *args, warm=...)``: the script ``body``, its private Inductor cache
    (warmed by a first run if ``warm``) and its uncaptured counters, made once per module: every
    capture mode compares with one plain run."""
    made: dict[tuple[str, ...], tuple[Path, Path, dict]] = {}

    def get(name: str, body: str, *args: str, warm: bool = False) -> tuple[Path, Path, dict]:
        if (name, *args) not in made:
            folder = tmp_path_factory.mktemp(name)
            script = write_script(folder / "train.py", body)
            cache = folder / "inductor-cache"
            if warm:
                run_script(script, cache, *args)
            made[(name, *args)] = script, cache, run_script(script, cache, *args)
        return made[(name, *args)]

    return get


@pytest.mark.parametrize("capture", list(CAPTURES), ids=list(CAPTURES.values()))
def test_captured_run_compiles_and_hits_the_cache_as_an_uncaptured_one(tmp_path, plain_runs, capture):
    script, cache, plain = plain_runs("module", MODULE_SCRIPT, warm=True)
    captured = run_captured(script, cache, capture=capture, run_dir=tmp_path / "run")
    assert plain["fx_graph"]["hit"] >= 4 and plain["fx_graph"]["miss"] == 0, plain  # forward + backward of 2
    assert plain["aot_autograd"]["hit"] >= 2 and len(plain["compile_ids"]) == 2, plain  # a break: two frames
    # torch's own counters in the captured process
    assert {k: captured[k] for k in SAME} == {k: plain[k] for k in SAME}
    # the same training, bit for bit (JSON floats round-trip exactly)
    assert len(plain["losses"]) == 6 and captured["losses"] == plain["losses"]
    # and what the run recorded: every compile, under torch's ids, and every cache lookup
    rec = recorded(tmp_path / "run")
    assert {k: rec[k] for k in rec} == {k: plain[k] for k in rec}
    if capture != "detail":  # the mode did what it says: op detail on disk only for the steps asked for
        assert sorted(set(neuron_prof.load(tmp_path / "run").ops.step)) == ([3, 4] if capture == "on-demand" else [])


@pytest.mark.parametrize(("compiled", "capture"), [("optimizer", "detail"), ("training step", "detail"),
                                                   ("training step", "sampled")],
                         ids=["optimizer", "training step", f"training step, {CAPTURES['sampled']}"])
def test_compiled_optimizer_step_under_capture_keeps_compiles_and_steps(tmp_path, plain_runs, compiled, capture):
    """Under capture (``record``'s, or always-on's) the step clock and the memory collector hook the
    optimizer's step: the hooks must neither become frames nor break graphs, and steps must still
    end; in always-on mode the hooks come and go with the sampled steps, and no more compiles."""
    arg = compiled.split()[0]
    script, cache, plain = plain_runs("optimizer", OPTIMIZER_SCRIPT, arg)
    captured = run_captured(script, cache, arg, capture=capture, run_dir=tmp_path / "run")
    assert {k: captured[k] for k in SAME} == {k: plain[k] for k in SAME}
    rec = recorded(tmp_path / "run")
    assert rec["compile_ids"] == plain["compile_ids"] and rec["frames"] == plain["frames"]
    steps = neuron_prof.load(tmp_path / "run").steps
    assert int(steps.complete.sum()) == 3  # the compiled optimizer step still ends each step


def test_stop_puts_dynamo_and_the_hooks_back(tmp_path):
    """In process, with Dynamo loaded: while capturing, neuron_prof's callbacks are in Dynamo's
    ignore list and the module hooks watch for compiles; after stop nothing of it is left."""
    import torch
    import torch._dynamo
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

    def state():
        return (set(torch._dynamo.config.ignore_logging_functions), list(sys.meta_path),
                dict(vars(torch._dynamo.callback_handler)), len(nn_module._global_forward_pre_hooks),
                len(nn_module._global_forward_hooks), len(optimizer._global_optimizer_post_hooks))

    torch._dynamo.reset()
    before = state()
    prof = neuron_prof.profile(tmp_path / "run", auto_step=True).start()
    during = state()
    assert len(during[0]) == len(before[0]) + 4  # module pre/post hooks, step clock, memory's note
    assert "run_start_callbacks" in during[2] and during[3] == before[3] + 1
    prof.stop()
    assert state() == before
