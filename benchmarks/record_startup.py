"""What `neuron-prof record` adds to a process's start-up and to a first torch.compile.

    .venv/bin/python benchmarks/record_startup.py [--rounds 3] [--other-checkout DIR]

Every measurement is a fresh process tree, the modes interleaved and their order rotating per
round. Each reports wall seconds and the CPU seconds of the whole tree (``RUSAGE_CHILDREN``,
steadier than wall time on a shared machine):

- ``import``: ``python -c "import torch"`` alone, and as the recorded command (a main process:
  capture starts when torch is imported); ``record -- true`` is record's own start and wrap-up;
- ``helper``: a script (no torch of its own) that runs ``python -c "import torch"`` as a helper,
  as Inductor runs its checks and compile workers; ``inner_s`` is the helper's run as its parent
  timed it;
- ``compile``: a first ``torch.compile`` (a small MLP, forward + backward + optimizer step,
  Inductor, a cold ``TORCHINDUCTOR_CACHE_DIR`` each time; Inductor starts its ISA check and compile
  workers as helpers); ``inner_s`` is the time from the first compiled call to the end of the step.

``--other-checkout DIR`` adds the record modes once more with neuron_prof imported from DIR (e.g.
``git archive <commit> | tar -x -C DIR``): the same figures before a change.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PARENT = """
import subprocess, sys, time
t0 = time.perf_counter()
subprocess.run([sys.executable, "-c", "import torch"], check=True)
print("ELAPSED", time.perf_counter() - t0)
"""

COMPILE = """
import time
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = torch.compile(lambda x: model(x).square().mean())
x = torch.randn(32, 64)
t0 = time.perf_counter()
step(x).backward()
opt.step()
print("ELAPSED", time.perf_counter() - t0)
"""


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Wall and CPU seconds of the command's process tree; ``inner_s`` if its script printed one.
    ``cwd``: not a checkout (``python -m`` would import neuron_prof from there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}
    for line in out.splitlines():
        if line.startswith("ELAPSED"):
            m["inner_s"] = float(line.split()[1])
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--other-checkout", type=Path, help="also measure record with neuron_prof from this folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="record_startup-"))
    (tmp / "parent.py").write_text(textwrap.dedent(PARENT))
    (tmp / "compile.py").write_text(textwrap.dedent(COMPILE))
    py = sys.executable
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_PROF")}
    checkouts = {"": base_env}
    if args.other_checkout:
        checkouts[" (other checkout)"] = {**base_env, "PYTHONPATH": str(args.other_checkout.resolve())}
    runs = iter(range(1_000_000))

    def record(*cmd: str) -> list[str]:
        return [py, "-m", "neuron_prof", "record", "-q", "-o", str(tmp / f"run{next(runs)}"), "--", *cmd]

    def cold(env: dict[str, str]) -> dict[str, str]:
        return {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=tmp, prefix="inductor-")}

    import_torch = [py, "-c", "import torch"]
    helper = [py, str(tmp / "parent.py")]
    compile_ = [py, str(tmp / "compile.py")]
    modes = {
        "import: alone": lambda: measure(import_torch, base_env, tmp),
        "helper: alone": lambda: measure(helper, base_env, tmp),
        "compile: alone": lambda: measure(compile_, cold(base_env), tmp),
    }
    for suffix, env in checkouts.items():
        modes[f"record -- true{suffix}"] = lambda env=env: measure(record("true"), env, tmp)
        modes[f"import: record{suffix}"] = lambda env=env: measure(record(*import_torch), env, tmp)
        modes[f"helper: record{suffix}"] = lambda env=env: measure(record(*helper), env, tmp)
        modes[f"compile: record{suffix}"] = lambda env=env: measure(record(*compile_), cold(env), tmp)

    names = list(modes)
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            results[name].append(modes[name]())
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[name][-1].items()),
                  file=sys.stderr, flush=True)
    print(json.dumps({n: {k: round(statistics.median(m[k] for m in ms), 2) for k in ms[0]}
                      for n, ms in results.items()}, indent=2))


if __name__ == "__main__":
    main()
