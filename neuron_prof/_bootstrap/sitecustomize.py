"""Started by ``neuron-prof record``: capture this Python process with no change to its code.

``record`` puts this folder first on PYTHONPATH and its settings in NEURON_PROF_RECORD. Every
Python process of the recorded command imports it at start-up; the torchrun launcher is skipped,
and helper processes (spawned workers) write nothing unless they complete a training step.
Whatever goes wrong here is reported on stderr once and never stops the user's program.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def _is_launcher(argv: list[str]) -> bool:
    if len(argv) > 2 and argv[1] == "-m" and argv[2] in _LAUNCHERS:
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) == "torchrun"


def _start() -> None:
    import json
    config = json.loads(os.environ["NEURON_PROF_RECORD"])
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if _is_launcher(argv):
        return
    import neuron_prof
    sched = config.get("schedule")
    prof = neuron_prof.profile(
        config["run_dir"], schedule=neuron_prof.schedule(**sched) if sched else None,
        collectors=config["collectors"], auto_step=True,
        max_events=config.get("max_events") or 50_000_000, command=config.get("command"),
        needs_step="--multiprocessing-fork" in argv, startup=True)
    prof.start()  # stopped by the session's atexit handler


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize that this one shadows, if the environment has one."""
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _HERE])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("NEURON_PROF_RECORD"):
    try:
        _start()
    except Exception as exc:  # noqa: BLE001 - the user's program must run regardless
        print(f"neuron_prof: capture not started ({type(exc).__name__}: {exc}); running without it",
              file=sys.stderr)
_chain_next_sitecustomize()
