"""``neuron-prof demo``: train a small transformer on CPU under capture, report it, export it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEMO_STEPS = 12


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="capture a small CPU training run, print its report and trace path",
                       description="Trains examples/train_transformer.py for a few steps under "
                                   "neuron_prof.profile (wait 2, warmup 1, active 5), then reports and exports.")
    p.add_argument("-o", "--output", type=Path, default=Path("runs/demo"), help="run directory (default runs/demo)")
    p.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"training steps (default {DEMO_STEPS})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import neuron_prof
    from neuron_prof.cli.export import export_run
    from neuron_prof.examples.train_transformer import train
    from neuron_prof.report import render_text, summarize
    print(f"training a 2-layer transformer for {args.steps} steps on CPU under capture ...", file=sys.stderr)
    with neuron_prof.profile(args.output, schedule=neuron_prof.schedule(wait=2, warmup=1, active=5),
                             command=["neuron-prof", "demo", "-o", str(args.output)]) as prof:
        train(args.steps, prof)
    print(render_text(summarize(neuron_prof.load(args.output))))
    trace, _ = export_run(args.output)
    print(f"run:   {args.output}\ntrace: {trace}  (open it in https://ui.perfetto.dev)")
    return 0
