"""``neuron-prof inspect TRACE``: is this Perfetto trace whole and sound, and what is in it?"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="check and summarise a Perfetto trace file",
                       description="Decode every packet of TRACE and check it strictly (framing, interning, "
                                   "tracks, timestamps, slice nesting, flows; a neuron_prof trace must end "
                                   "with its end-of-trace packet); report processes, tracks and counts. "
                                   "A damaged trace is one line naming the first problem, exit code 2.")
    p.add_argument("trace", type=Path, help="a .perfetto-trace file (gzip or not)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.export.inspect import summarize_trace
    s = summarize_trace(args.trace)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['path']}: {s['packets']} packets, {s['tracks']} tracks, {s['slices']} slices/instants, "
          f"{s['counters']} counter values, {s['flows']} flows ({s['flows_across_processes']} across processes); "
          + (f"written by {s['writer']}, whole" if s["writer"] else "not written by neuron_prof"))
    for name in s["processes"]:
        print(f"  process {name}")
    for name, n in s["top_names"]:
        print(f"  {n:>9}  {name}")
    for w in s["warnings"]:
        print(f"  warning: {w}")
    return 0
