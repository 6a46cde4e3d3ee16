"""Started by ``neuron-prof record``: capture this Python process with no change to its code.

``record`` puts this folder first on PYTHONPATH and its settings in NEURON_PROF_RECORD. Every
Python process of the recorded command imports it at start-up, so it must cost next to nothing:
here only the standard library is imported, and nothing of neuron_prof or torch.

Which processes capture, and from when (docs/capture.md, "Capture with no code change"):

- a launcher (torchrun, ``python -m torch.distributed.run|launch``, ``accelerate launch``)
  captures nothing;
- a *main* process — one whose nearest Python ancestor in the command that imported torch
  before starting it is ``record`` or a launcher (the command itself, each rank a launcher
  starts; a shell script or a Python wrapper without torch in between does not count) — starts
  capture when it imports torch, with the interpreter's start as the capture's origin, and ends
  steps at its optimizer's steps;
- a process that a trainer starts with a rank of its own in its environment (``RANK`` or
  ``LOCAL_RANK``, not 0, unlike its parent's: the ranks that Lightning's DDP launcher starts)
  is a main as well;
- any other Python process (a helper that the training script or a library starts: Inductor's
  checks and compile workers, a data-loading process) only registers an optimizer step pre-hook
  when it imports torch, and starts capture at its first optimizer step. A helper that never
  steps leaves nothing; one that steps and wants a rank another process owns writes nothing
  there and leaves a conflict note (neuron_prof/store/writer.py).

Each process tells its children what they are through NEURON_PROF_PARENT, which they inherit.
Whatever goes wrong here is reported on stderr once and never stops the user's program.
"""
from __future__ import annotations

import time

_ORIGIN_NS = time.monotonic_ns()  # first thing: the capture's origin in main processes

import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
RECORD_ENV = "NEURON_PROF_RECORD"  # record's options, as neuron_prof.capture.options.CaptureOptions writes them
PARENT_ENV = "NEURON_PROF_PARENT"  # "launcher": children are mains; "trainer": children are helpers
PARENT_RANK_ENV = "NEURON_PROF_PARENT_RANK"  # the trainer parent's rank, from its environment
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                     "accelerate.commands.accelerate_cli")
_LAUNCHER_SCRIPTS = {"torchrun": None, "accelerate": "launch"}  # console script -> its launching subcommand


def _is_launcher(argv: list[str]) -> bool:
    if len(argv) > 2 and argv[1] == "-m":
        return argv[2] in _LAUNCHER_MODULES
    if len(argv) < 2:
        return False
    name = os.path.basename(argv[1])
    if name not in _LAUNCHER_SCRIPTS:
        return False
    sub = _LAUNCHER_SCRIPTS[name]
    return sub is None or sub in argv[2:3]


def _rank_of_env() -> str:
    return os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or ""


def _warn(what: str, exc: BaseException) -> None:
    print(f"neuron_prof: {what} ({type(exc).__name__}: {exc}); running without capture", file=sys.stderr)


def _post_import_hooks():
    """``neuron_prof.recording.imports`` loaded by its path: importing it by name would import the
    ``neuron_prof`` package (numpy and all) in every Python process of the command. Registered
    under its own name, so the collectors' hooks later share its registry."""
    name = "neuron_prof.recording.imports"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, os.pardir, os.pardir, "recording", "imports.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _start_main_or_helper(config: str, helper: bool) -> None:
    """A main captures from the interpreter's start; one that completes no step (a launcher-like
    parent) writes nothing if the ranks it started wrote the run. A helper captures from its first
    step and reports a rank another process owns. ``config``: record's options
    (``neuron_prof.capture.options.CaptureOptions.to_json``)."""
    try:
        import neuron_prof
        from neuron_prof.capture.options import CaptureOptions
        options = CaptureOptions.from_json(config, auto_step=True, origin_ns=None if helper else _ORIGIN_NS,
                                           yield_if_stepless=not helper)
        neuron_prof.profile(**options.keywords()).start()  # stopped by the session's atexit handler
    except Exception as exc:  # noqa: BLE001 - the user's program must run regardless
        _warn("capture not started", exc)


def _start_at_first_step(config: str) -> None:
    """A helper: nothing until its first optimizer step, then capture from that step's start.

    A global optimizer step *pre*-hook starts it: the capture's own step clock (a post-hook, a
    separate list) then ends step 0 when that same step returns, so the rank is claimed at once.
    The hook stays registered (removing a hook from inside torch's loop over them is an error)
    and costs one call per step after that.
    """
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    first = [True]

    def at_step(optimizer, args, kwargs) -> None:
        if first:
            first.clear()
            _start_main_or_helper(config, helper=True)

    register_optimizer_step_pre_hook(at_step)


def _start() -> None:
    config = os.environ[RECORD_ENV]
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if _is_launcher(argv):
        os.environ[PARENT_ENV] = "launcher"
        return
    parent = os.environ.get(PARENT_ENV)
    rank = _rank_of_env()
    main = parent == "launcher" or (parent == "trainer" and rank not in ("", "0")
                                    and rank != os.environ.get(PARENT_RANK_ENV))
    pid = os.getpid()

    def on_torch() -> None:
        # from its import of torch on, a process's Python children are its helpers; until then
        # (a wrapper without torch: poetry run, a launcher of the user's own) they are mains too
        os.environ[PARENT_ENV] = "trainer"
        os.environ[PARENT_RANK_ENV] = rank
        try:
            if main and os.getpid() == pid:  # a child forked before torch was imported is a helper
                _start_main_or_helper(config, helper=False)
            else:
                _start_at_first_step(config)
        except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
            _warn("capture not started", exc)

    # at once if torch is imported already (a .pth file of the environment, say)
    _post_import_hooks().when_imported("torch", lambda torch: on_torch())


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize that this one shadows, if the environment has one."""
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _HERE])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get(RECORD_ENV):
    try:
        _start()
    except Exception as exc:  # noqa: BLE001 - the user's program must run regardless
        _warn("capture not started", exc)
_chain_next_sitecustomize()
