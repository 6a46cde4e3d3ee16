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
    from neuron_prof.run import load
    from neuron_prof.summary.text import render_text
    from neuron_prof.summary_store import run_summary
    summary = run_summary(load(args.run), top=args.top)  # the run's stored summary when it is fresh
    print(json.dumps(summary.to_json(), indent=2) if args.json else render_text(summary), end="\n" if args.json else "")
    return 0
