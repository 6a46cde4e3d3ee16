"""``neuron-prof export RUN [-o PATH] [--format perfetto|chrome|memory-snapshot]``: one trace for
all ranks, or one rank's memory as a PyTorch memory snapshot."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from neuron_prof.export.run_export import DEFAULT_NAME, export_run

MEMORY_VIZ = "https://pytorch.org/memory_viz"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a Perfetto (or Chrome JSON) trace, or a memory snapshot, of a run",
                       description="Write one trace for every rank of RUN. Open Perfetto traces in "
                                   "ui.perfetto.dev; Chrome JSON (the same tracks) also opens in chrome://tracing. "
                                   "--format kineto writes the traces torch.profiler writes, one per rank in a "
                                   "folder, for Kineto's readers (Holistic Trace Analysis, TensorBoard's profiler "
                                   "plugin) and `neuron-prof import`. "
                                   "--format memory-snapshot writes one rank's memory (captured with the "
                                   f"memory collector) as PyTorch's memory snapshot pickle: open it in {MEMORY_VIZ}.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--output", type=Path,
                   help="output file (default: RUN/trace.perfetto-trace, RUN/trace.json or "
                        "RUN/memory-snapshot.pickle), or folder (kineto; default: RUN/kineto-trace)")
    p.add_argument("--format", choices=sorted(DEFAULT_NAME), default="perfetto", help="default: perfetto")
    p.add_argument("--rank", type=int, help="memory-snapshot: the rank (a snapshot is per process; "
                                            "default: the first with memory data)")
    p.add_argument("--step", type=int, help="memory-snapshot: as of the end of this step "
                                            "(default: the end of capture)")
    p.add_argument("--force", action="store_true",
                   help="replace the output even if it is a link, a special file or a file export did not write "
                        "(a link is replaced, its target never written)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.progress import Phases
    t0 = time.perf_counter()
    with Phases("export") as progress:
        out, counts = export_run(args.run, args.output, args.format, args.rank, args.step, args.force, progress)
    took = time.perf_counter() - t0
    if args.format == "kineto":
        print(f"{out}  ({counts['ranks']} ranks, one torch.profiler trace each: {counts['events']} events; "
              f"{took:.2f}s; Holistic Trace Analysis, TensorBoard and neuron-prof import read them)", file=sys.stderr)
    elif args.format == "memory-snapshot":
        devices = ", ".join(f"{i}={name}" for i, name in counts["devices"].items())
        print(f"{out}  (rank {counts['rank']}, devices {devices}; {counts['allocations']} allocations, "
              f"{counts['frees']} frees, {counts['ooms']} OOMs; {counts['live_blocks']} blocks, "
              f"{counts['live_bytes']} bytes live at the snapshot; {took:.2f}s; open it in {MEMORY_VIZ})",
              file=sys.stderr)
    else:
        coll = f"{counts['collectives']} collectives, {counts['collective_flows']} cross-rank flows, " \
            if counts["collectives"] else ""
        device = f"{counts['device_kernels']} device kernels with {counts['device_flows']} flows from host ops, " \
            f"{counts['queue_flushes']} host waits, {counts['fallbacks']} CPU fallbacks, " if counts["device_kernels"] else ""
        print(f"{out}  ({counts['ranks']} ranks, {counts['op_slices']} op slices, {counts['steps']} steps, "
              f"{coll}{device}{counts['sync_points']} sync points; {took:.2f}s)", file=sys.stderr)
    print(out)
    return 0
