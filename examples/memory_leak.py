"""Memory bugs on marked lines, for neuron_prof's memory tests and docs.

    neuron-prof record -o runs/leak -- python -m neuron_prof.examples.memory_leak leak

``leak``: each step also evaluates the model on a validation batch *with* autograd on and keeps
the result for logging; every kept result holds its graph, and the graph holds its saved
tensors: the validation input, the hidden activation and the output. ``clean`` keeps
``.item()`` instead. ``spike``: one step makes a huge temporary (an ``expand(...).contiguous()``).

``history``: the classic ``history.append(loss)`` after ``loss.backward()``, on a deep, narrow
MLP (``DEPTH`` layers: about a hundred autograd nodes a step, like a real model's graph).
Backward freed the graph's saved tensors, so the tensors kept grow by 4 bytes a step (the loss),
but each kept loss keeps its whole graph of nodes: the process grows far faster. ``detached``
keeps ``loss.detach()``: the same 4 bytes a step, no graph. A third argument, ``seconds``, trains
for at least that long, then for that long again *and* the given steps (the process's growth is
judged over time, after the captured steps; see ``analysis.memory``).
All sizes follow from the constants below (float32: 4 bytes per element).
"""
from __future__ import annotations

import sys
import time

import torch

BATCH, IN, HIDDEN, OUT = 32, 64, 128, 1
SPIKE = 256  # copies of the batch in the spike's temporary
DEPTH, WIDTH = 32, 16  # the history modes' model
HISTORY_MODES = ("history", "detached")


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def leaked_bytes_per_step() -> int:
    """What one leaked validation result keeps alive: x_val, relu output, model output, scalar."""
    return 4 * (BATCH * IN + BATCH * HIDDEN + BATCH * OUT + 1)


def train(steps: int, mode: str = "leak", prof=None) -> list:
    if mode in HISTORY_MODES:
        return train_history(steps, mode, prof)
    model, opt = model_and_optimizer()
    history = []
    for step in range(steps):
        x = torch.randn(BATCH, IN)
        y = torch.randn(BATCH, OUT)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mode == "spike" and step == steps // 2:
            loss = loss + x.unsqueeze(0).expand(SPIKE, BATCH, IN).contiguous().mean() * 0  # SPIKE-LINE
        opt.step()
        x_val = torch.randn(BATCH, IN)  # VAL-INPUT-LINE
        if mode == "leak":
            history.append(model(x_val).pow(2).mean())  # LEAK-LINE
        else:
            with torch.no_grad():
                history.append(model(x_val).pow(2).mean().item())
        if prof is not None:
            prof.step()
    return history


def train_history(steps: int, mode: str = "history", prof=None, seconds: float = 0.0) -> list:
    """``history`` / ``detached`` (see the module docstring): ``steps`` steps; with ``seconds``,
    a first phase of at least that long, then a second of at least that long and ``steps`` steps.
    The process's growth is judged seconds after the captured steps: however long the machine
    stalls in the first phase (a loaded CI machine: one such run made 7 steps in its first 10 s), the second leaves seconds and steps enough to judge."""
    torch.manual_seed(0)
    layers = [m for _ in range(DEPTH) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = []
    first_ends = time.monotonic() + seconds
    second: tuple[int, float] | None = None  # (steps done, time) when the second phase began
    while True:
        loss = torch.nn.functional.mse_loss(model(torch.randn(BATCH, WIDTH)), torch.randn(BATCH, 1))  # LOSS-LINE
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss if mode == "history" else loss.detach())  # HISTORY-LINE
        if prof is not None:
            prof.step()
        if not seconds:
            if len(history) >= steps:
                return history
            continue
        now = time.monotonic()
        if second is None:
            second = (len(history), now) if now >= first_ends else None
        elif len(history) - second[0] >= steps and now - second[1] >= seconds:
            return history


if __name__ == "__main__":
    mode, steps = sys.argv[1] if len(sys.argv) > 1 else "leak", int(sys.argv[2]) if len(sys.argv) > 2 else 8
    if mode in HISTORY_MODES:
        train_history(steps, mode, seconds=float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    else:
        train(steps, mode)
