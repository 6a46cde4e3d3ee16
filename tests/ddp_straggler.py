"""A real DDP job with a known straggler: ``world`` gloo ranks on 127.0.0.1 where one rank sleeps
before ``loss.backward()`` (so before its gradient all-reduce) in chosen steps. The front-end
tests assert that what they draw names that rank, those steps and about that much wait."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import free_port, gloo_env, write_script

SCRIPT = """
import sys
import time
import torch
import torch.distributed as dist
import neuron_prof

run_dir, steps, slow_rank, sleep_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
slow_steps = {int(s) for s in sys.argv[5].split(",")}
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with neuron_prof.profile(run_dir) as prof:
    for step in range(steps):
        loss = model(torch.randn(8, 32)).sum()
        if dist.get_rank() == slow_rank and step in slow_steps:
            time.sleep(sleep_s)
        loss.backward()  # BACKWARD
        opt.step()
        opt.zero_grad()
        prof.step()
dist.destroy_process_group()
"""

PARAM_BYTES = (32 * 64 + 64 + 64 * 8 + 8) * 4
"""The model's float32 parameter bytes: what DDP's gradient all-reduces move per rank per step."""
TIMEOUT_S = 240


def straggler_run(tmp: Path, *, steps: int, slow_rank: int, slow_steps: list[int], sleep_s: float,
                  world: int = 2) -> Path:
    """The captured run (``tmp/run``); every rank is killed if the job does not end in time."""
    script = write_script(tmp / "ddp_straggler.py", SCRIPT)
    run_dir = tmp / "run"
    port = free_port()
    argv = [sys.executable, str(script), str(run_dir), str(steps), str(slow_rank), str(sleep_s),
            ",".join(map(str, slow_steps))]
    # one intra-op thread per rank, as torchrun sets it: on a busy 2-core machine torch's default
    # (one OpenMP thread per core) spin-waits against the other ranks and stretches every step by
    # hundreds of ms, as long as the injected sleep
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(argv, cwd=tmp, env={**env, **gloo_env(r, world, port)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=TIMEOUT_S)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return run_dir
