"""``neuron-prof demo``: train a small transformer under capture (on the CPU, or ``--device neuron``
on the emulated neuron device), report it, export it, view it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEMO_STEPS = 12


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
    p.add_argument("--no-view", action="store_true", help="don't start the browser viewer at the end")
    p.add_argument("--no-browser", action="store_true", help="start the viewer but don't open a browser")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.examples.train_transformer import train
    from neuron_prof.export.run_export import export_run
    from neuron_prof.profile import profile
    from neuron_prof.run import load
    from neuron_prof.schedule import schedule
    from neuron_prof.summary.build import summarize
    from neuron_prof.summary.text import render_text
    device = getattr(args, "device", "cpu")
    command = ["neuron-prof", "demo", "-o", str(args.output)]
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
    from neuron_prof.viewer_server import serve
    return serve(args.output, browser=not args.no_browser)
