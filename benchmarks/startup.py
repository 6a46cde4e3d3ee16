"""What ``neuron-prof record`` adds to the start of a Python process, side by side in one run.

    .venv/bin/python benchmarks/startup.py [--rounds 7] [--compile]

Commands, each run plain and under ``neuron-prof record`` (default collectors), interleaved with
the order rotating from round to round: ``python -c pass`` (a helper process that never imports
torch, like the dlopen probes Inductor starts for every compile on CPU), ``python -c "import
torch"``, a tiny training script (a linear model, 5 Adam steps, no compile) and, with
``--compile``, a cold ``torch.compile`` (a two-layer model with one graph break, Inductor, an
empty Inductor cache for every run). Wall time of the whole command, start to exit: under
``record`` that includes the ``neuron-prof`` CLI process itself. Medians, ratios and the seconds
``record`` adds. The native engine is built before the first round (a cold build is a one-time
cost: see the README).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = """
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters())
for _ in range(5):
    model(torch.randn(32, 64)).square().sum().backward()
    opt.step()
    opt.zero_grad()
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

WORKLOADS = {  # name -> python arguments, or the script's text
    "python -c pass": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
    "tiny training script": TRAIN,
    "cold torch.compile": COMPILE,
}


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--compile", action="store_true", help="also time a cold torch.compile (slow)")
    args = p.parse_args()
    workloads = {k: v for k, v in WORKLOADS.items() if args.compile or k != "cold torch.compile"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        commands = {}
        for i, (name, what) in enumerate(workloads.items()):
            if isinstance(what, str):
                (tmp / f"script{i}.py").write_text(what)
                what = [str(tmp / f"script{i}.py")]
            commands[name] = [sys.executable, *what]
        record = [sys.executable, "-m", "neuron_prof", "record", "-q", "-o"]
        env = dict(os.environ)
        timed(record + [str(tmp / "warm"), "--", *commands["tiny training script"]], env)  # builds the engine
        modes = [(name, rec) for name in commands for rec in (False, True)]
        times: dict[tuple[str, bool], list[float]] = {m: [] for m in modes}
        n = 0
        for r in range(args.rounds):
            for name, rec in modes[r % len(modes):] + modes[:r % len(modes)]:
                n += 1
                cmd = record + [str(tmp / f"run{n}"), "--", *commands[name]] if rec else commands[name]
                env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor{n}")  # a cold cache every run
                times[(name, rec)].append(timed(cmd, env))
    print(f"start-up, wall seconds from start to exit, median of {args.rounds} rounds:")
    print(f"  {'command':<26} {'plain':>7} {'record':>7} {'ratio':>6} {'added':>7}")
    for name in commands:
        plain, rec = statistics.median(times[(name, False)]), statistics.median(times[(name, True)])
        print(f"  {name:<26} {plain:7.2f} {rec:7.2f} {rec / plain:6.2f} {rec - plain:+7.2f}")


if __name__ == "__main__":
    main()
