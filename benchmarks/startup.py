"""What ``neuron-prof record`` adds to a Python process's start-up, side by side in one run.

    .venv/bin/python benchmarks/startup.py [--rounds 5] [--compile] [--other-checkout DIR]

Every measurement is a fresh process tree, run plain and as the command of ``neuron-prof record``
(default collectors), the modes interleaved with their order rotating per round. Each reports the
wall seconds of the whole command and the CPU seconds of its whole process tree
(``RUSAGE_CHILDREN``: steadier than wall time on a shared machine). Under ``record`` both include
the ``neuron-prof`` CLI process itself (``record -- true`` alone is that part). Workloads:

- ``python -c pass``: a process that never imports torch;
- ``python -c "import torch"``: a main process (capture starts when it imports torch);
- ``tiny training script``: a linear model, 5 Adam steps, no compile;
- ``helper``: a script without torch that runs ``python -c "import torch"`` as its helper, as
  Inductor runs its ISA checks and compile workers;
- ``cold torch.compile`` (``--compile``, slow): a two-layer model with a graph break, forward,
  backward and an optimizer step, Inductor with an empty ``TORCHINDUCTOR_CACHE_DIR`` every run
  (on CPU Inductor starts one helper process per candidate instruction set).

``--other-checkout DIR`` measures the ``record`` modes once more with neuron_prof imported from
DIR: the same figures before a change. DIR is a tree whose package folder holds its subpackages,
as an install has them (``git archive <commit> | tar -x -C DIR``, then ``ln -s ../collectors
DIR/neuron_prof/collectors``, the same for ``examples`` and ``viewer``): with the repository's
layout, ``neuron_prof.collectors`` would come from this checkout's editable install instead. The
native engine is built before the first round (a cold build is a one-time cost).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from time import perf_counter

TRAIN = """
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters())
for _ in range(5):
    model(torch.randn(32, 64)).square().sum().backward()
    opt.step()
    opt.zero_grad()
"""

HELPER = """
import subprocess, sys
subprocess.run([sys.executable, "-c", "import torch"], check=True)
"""

COMPILE = """
import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = self.a(x).relu()
        if h.sum() > 0:
            h = h * 2
        return self.b(h)


model = torch.compile(M())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

RECORD_ALONE = "record -- true"  # the neuron-prof CLI's own part of every record row
WORKLOADS = {  # name -> python arguments, or the text of a script
    "python -c pass": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
    "tiny training script": TRAIN,
    "helper (python -c 'import torch')": HELPER,
    "cold torch.compile": COMPILE,
}


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of the command's whole process tree. ``cwd``: not a checkout (``python
    -m`` would import neuron_prof from there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time a cold torch.compile (slow)")
    ap.add_argument("--other-checkout", type=Path, help="also measure record with neuron_prof from this folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="startup-"))
    py = sys.executable
    commands = {}
    for i, (name, what) in enumerate(WORKLOADS.items()):
        if name == "cold torch.compile" and not args.compile:
            continue
        if isinstance(what, str):
            (tmp / f"script{i}.py").write_text(textwrap.dedent(what))
            what = [str(tmp / f"script{i}.py")]
        commands[name] = [py, *what]
    base = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_PROF")}
    setups = {"plain": None, "record": base}
    if args.other_checkout:
        setups["record, other checkout"] = {**base, "PYTHONPATH": str(args.other_checkout.resolve())}
    runs = iter(range(1_000_000))

    def run(name: str, setup: str) -> tuple[float, float]:
        env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor{next(runs)}")}  # cold, every run
        cmd = ["true"] if name == RECORD_ALONE else commands[name]
        if setup != "plain":
            env.update(setups[setup])
            cmd = [py, "-m", "neuron_prof", "record", "-q", "-o", str(tmp / f"run{next(runs)}"), "--", *cmd]
        return measure(cmd, env, tmp)

    for setup in setups:  # builds each checkout's native engine
        if setup != "plain":
            run("tiny training script", setup)
    modes = [(name, setup) for name in commands for setup in setups]
    modes += [(RECORD_ALONE, s) for s in setups if s != "plain"]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            times[mode].append(run(*mode))
            print(f"round {r + 1} {mode[0]} / {mode[1]}: wall {times[mode][-1][0]:.2f} s, "
                  f"cpu {times[mode][-1][1]:.2f} s", file=sys.stderr, flush=True)
    med = {m: tuple(statistics.median(t[i] for t in ts) for i in (0, 1)) for m, ts in times.items()}
    print(f"median of {args.rounds} rounds: wall s / CPU s of the process tree; added = record - plain")
    print(f"  {'command':<36}" + "".join(f"{s:>26}" for s in setups) + f"{'added (wall / CPU)':>24}")
    for name in [*commands, RECORD_ALONE]:
        cells = [f"{med[(name, s)][0]:>12.2f} /{med[(name, s)][1]:>6.2f} s" if (name, s) in med else f"{'-':>26}"
                 for s in setups]
        added = (f"{med[(name, 'record')][0] - med[(name, 'plain')][0]:+9.2f} / "
                 f"{med[(name, 'record')][1] - med[(name, 'plain')][1]:+6.2f} s" if (name, "plain") in med else "")
        print(f"  {name:<36}" + "".join(f"{c:>26}" for c in cells) + f"{added:>24}")


if __name__ == "__main__":
    main()
