"""``neuron-prof port-check RUN --target neuron [--json]``: what a run's code and ops need to move
to a target backend, registered in this process to be asked."""
from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from neuron_prof.errors import NeuronProfError
from neuron_prof.backends.targets import TARGETS, register_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("port-check", help="what a run's code and ops need to move to another device",
                       description="The porting inventory of RUN for a target backend: the CUDA-only call sites "
                                   "(.cuda(), torch.cuda.*, \"cuda\" devices, Triton, torch.utils.cpp_extension, "
                                   "flash-attn) in the source files the run executed, with whether each ran; "
                                   "the ops the run executed that the target leaves to the CPU, asked of its "
                                   "dispatcher in this process, with their share of op time and their lines; "
                                   "custom ops without a kernel for it; the host reads of tensor values (.item(), "
                                   "bool(), a copy to the host) that would wait on it, by line with their count "
                                   "per step; and a verdict.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--target", required=True, choices=sorted(TARGETS),
                   help="; ".join(f"{name}: {what}" for name, (_, what) in TARGETS.items()))
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): the module that registers the run's custom ops")
    p.add_argument("--json", action="store_true", help="print the inventory as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.reports.port import port_check, render_text, to_json
    from neuron_prof.store.run import load
    loaded = load(args.run)  # a bad run fails here, before the device is built
    target = register_target(args.target)
    for module in args.imports:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the user's module: whatever it raises, one line
            raise NeuronProfError(f"--import {module}: cannot import it ({type(exc).__name__}: {exc}); "
                                  "put its folder on PYTHONPATH") from None
    check = port_check(loaded, target)
    if args.json:
        print(json.dumps(to_json(check), indent=2))
    else:
        print(render_text(check, loaded.display_path), end="")
    return 0

