"""``neuron-prof export RUN [-o PATH] [--format perfetto|chrome]``: one trace for all ranks."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from neuron_prof.errors import NeuronProfError

SUFFIX = {"perfetto": ".perfetto-trace", "chrome": ".json"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a Perfetto (or Chrome JSON) trace of a run",
                       description="Write one trace for every rank of RUN. Open Perfetto traces in "
                                   "ui.perfetto.dev; Chrome JSON also opens in chrome://tracing.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--output", type=Path, help="trace file (default: RUN/trace.perfetto-trace)")
    p.add_argument("--format", choices=sorted(SUFFIX), default="perfetto", help="default: perfetto")
    p.set_defaults(func=run)


def export_run(run_dir: Path, output: Path | None = None, fmt: str = "perfetto") -> tuple[Path, dict]:
    """Export a run; returns the trace path and what was written (used by the CLI and the demo)."""
    from neuron_prof.export.trace import write_run
    from neuron_prof.export.tracewriter import open_writer
    from neuron_prof.run import load
    run = load(run_dir)
    out = output or run_dir / f"trace{SUFFIX[fmt]}"
    if out.is_dir():
        raise NeuronProfError(f"{out}: is a directory; pass a file name to -o, e.g. {out / ('trace' + SUFFIX[fmt])}")
    if not out.parent.exists():
        raise NeuronProfError(f"{out.parent}: no such directory for the trace; create it or choose another -o")
    return out, write_run(run, open_writer(out, fmt))


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out, counts = export_run(args.run, args.output, args.format)
    took = time.perf_counter() - t0
    print(f"{out}  ({counts['ranks']} ranks, {counts['op_slices']} op slices, {counts['steps']} steps, "
          f"{counts['sync_points']} sync points; {took:.2f}s)", file=sys.stderr)
    print(out)
    return 0
