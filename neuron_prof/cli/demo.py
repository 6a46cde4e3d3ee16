"""``neuron-prof demo``: train a small transformer under capture (on the CPU, or ``--device neuron``
on the emulated neuron device; ``--ranks N``: data-parallel, one process per rank), report it,
export it, view it."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from neuron_prof.errors import NeuronProfError

DEMO_STEPS = 12
MAX_RANKS = 8


def _ranks(text: str) -> int:
    n = int(text) if text.isdigit() else 0
    if not 1 <= n <= MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of ranks from 1 to {MAX_RANKS}")
    return n


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="capture a small CPU training run, report it, export it, open the viewer",
                       description="Trains examples/train_transformer.py for a few steps under "
                                   "neuron_prof.profile (wait 2, warmup 1, active 5), then reports, exports "
                                   "a Perfetto trace and serves the browser viewer until Ctrl+C.")
    p.add_argument("-o", "--output", type=Path, default=Path("runs/demo"), help="run directory (default runs/demo)")
    p.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"training steps (default {DEMO_STEPS})")
    p.add_argument("--device", choices=("cpu", "neuron"), default="cpu",
                   help="train on the CPU (default) or on the emulated neuron device "
                        "(neuron_prof.testing.neuron; built on first use, about 40 s)")
    p.add_argument("--ranks", type=_ranks, default=1,
                   help="train data-parallel (DDP, examples/train_ddp.py) with this many ranks on 127.0.0.1, one "
                        "process each; on the neuron device its collectives run on the device (default 1)")
    p.add_argument("--no-view", action="store_true", help="don't start the browser viewer at the end")
    p.add_argument("--no-browser", action="store_true", help="start the viewer but don't open a browser")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.examples.train_transformer import train
    from neuron_prof.export.run_export import export_run
    from neuron_prof.capture.profile import profile
    from neuron_prof.store.run import load
    from neuron_prof.capture.schedule import schedule
    from neuron_prof.reports.summary.build import summarize
    from neuron_prof.reports.summary.text import render_text
    device = getattr(args, "device", "cpu")
    ranks = getattr(args, "ranks", 1)
    command = ["neuron-prof", "demo", "-o", str(args.output)]
    if ranks > 1:
        _train_ranks(args.output, args.steps, device, ranks)
    else:
        if device != "cpu":
            from neuron_prof.testing import neuron
            print("enabling the emulated neuron device ...", file=sys.stderr)
            neuron.enable()
            command += ["--device", device]
        where = "on CPU" if device == "cpu" else f"on the emulated {device} device"
        print(f"training a 2-layer transformer for {args.steps} steps {where} under capture ...", file=sys.stderr)
        with profile(args.output, schedule=schedule(wait=2, warmup=1, active=5), command=command) as prof:
            train(args.steps, prof, device=device)
    print(render_text(summarize(load(args.output))))
    trace, _ = export_run(args.output)
    print(f"run:   {args.output}\ntrace: {trace}  (open it in https://ui.perfetto.dev)")
    if args.no_view:
        return 0
    from neuron_prof.viewer.server import serve
    return serve(args.output, browser=not args.no_browser)


def _train_ranks(output: Path, steps: int, device: str, ranks: int) -> None:
    """``ranks`` processes of examples/train_ddp.py on 127.0.0.1 (torchrun's environment), each
    capturing its rank into ``output``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    where = "on CPU with gloo" if device == "cpu" else f"on the emulated {device} device"
    print(f"training a 2-layer transformer data-parallel over {ranks} ranks for {steps} steps {where} "
          "under capture ...", file=sys.stderr)
    argv = [sys.executable, "-m", "neuron_prof.examples.train_ddp", "--device", device, "--steps", str(steps),
            "--profile", str(output)]
    procs = [subprocess.Popen(argv, env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                         "RANK": str(r), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r),
                                         "OMP_NUM_THREADS": "1"}) for r in range(ranks)]
    failed = [(r, code) for r, code in enumerate(p.wait() for p in procs) if code]
    if failed:
        raise NeuronProfError(f"{output}: rank {failed[0][0]} of the demo's training exited with code "
                              f"{failed[0][1]} (its messages are above); run it again, or with --ranks 1")
