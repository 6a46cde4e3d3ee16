"""``neuron-prof report RUN [--json]``: the 10-second terminal summary of a run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="summarise a run in the terminal",
                       description="Steps, top ops by self time, sync points and capture health.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--json", action="store_true", help="print the same summary as JSON (for CI gates)")
    p.add_argument("--top", type=int, default=10, help="how many ops to list (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.report import render_text, summarize
    from neuron_prof.run import load
    summary = summarize(load(args.run), top=args.top)
    print(json.dumps(summary, indent=2) if args.json else render_text(summary), end="\n" if args.json else "")
    return 0
