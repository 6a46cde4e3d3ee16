"""A captured run compiles what an uncaptured run compiles: same compile ids, frames, graphs and
cache hits (issue 9, defect 3), with ``torch.compile`` on a module, on the optimizer's step and on a
whole training step. Real runs: each script runs in a fresh process, plain and under
``neuron-prof record``, with a private Inductor cache per test.

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

# torch's own view of what it compiled, printed by every script below at exit
COUNTERS = """
import atexit, json

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
    }), flush=True)

atexit.register(_print_counters)
"""

MODULE_SCRIPT = COUNTERS + """
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
for _ in range(3):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

OPTIMIZER_SCRIPT = COUNTERS + """
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

for _ in range(3):
    train_step(torch.randn(4, 8))
"""


def run_script(script: Path, cache: Path, *args: str, record: Path | None = None) -> dict:
    """The script's printed counters; under ``neuron-prof record -o record`` if given."""
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


def test_captured_run_compiles_and_hits_the_cache_as_an_uncaptured_one(tmp_path):
    script = write_script(tmp_path / "train.py", MODULE_SCRIPT)
    cache = tmp_path / "inductor-cache"
    run_script(script, cache)  # warms the cache
    plain = run_script(script, cache)
    captured = run_script(script, cache, record=tmp_path / "run")
    assert plain["fx_graph"]["hit"] >= 4 and plain["fx_graph"]["miss"] == 0, plain  # forward + backward of 2
    assert plain["aot_autograd"]["hit"] >= 2 and len(plain["compile_ids"]) == 2, plain  # a break: two frames
    # torch's own counters in the captured process
    assert {k: captured[k] for k in SAME} == {k: plain[k] for k in SAME}
    # and what the run recorded: every compile, under torch's ids, and every cache lookup
    rec = recorded(tmp_path / "run")
    assert {k: rec[k] for k in rec} == {k: plain[k] for k in rec}


@pytest.mark.parametrize("compiled", ["optimizer", "training step"])
def test_compiled_optimizer_step_under_record_keeps_compiles_and_steps(tmp_path, compiled):
    """Under ``record`` the step clock and the memory collector hook the optimizer's step: the
    hooks must neither become frames nor break graphs, and steps must still end."""
    script = write_script(tmp_path / "train.py", OPTIMIZER_SCRIPT)
    arg = compiled.split()[0]
    plain = run_script(script, tmp_path / "cache", arg)
    captured = run_script(script, tmp_path / "cache", arg, record=tmp_path / "run")
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
