"""``neuron-prof export RUN [-o PATH] [--format perfetto|chrome|memory-snapshot]``: one trace for
all ranks, or one rank's memory as a PyTorch memory snapshot."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from neuron_prof.errors import NeuronProfError

DEFAULT_NAME = {"perfetto": "trace.perfetto-trace", "chrome": "trace.json",
                "memory-snapshot": "memory-snapshot.pickle"}
MEMORY_VIZ = "https://pytorch.org/memory_viz"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a Perfetto (or Chrome JSON) trace, or a memory snapshot, of a run",
                       description="Write one trace for every rank of RUN. Open Perfetto traces in "
                                   "ui.perfetto.dev; Chrome JSON also opens in chrome://tracing. "
                                   "--format memory-snapshot writes one rank's memory (captured with the "
                                   f"memory collector) as PyTorch's memory snapshot pickle: open it in {MEMORY_VIZ}.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--output", type=Path,
                   help="output file (default: RUN/trace.perfetto-trace, RUN/trace.json or RUN/memory-snapshot.pickle)")
    p.add_argument("--format", choices=sorted(DEFAULT_NAME), default="perfetto", help="default: perfetto")
    p.add_argument("--rank", type=int, help="memory-snapshot: the rank (a snapshot is per process; "
                                            "default: the first with memory data)")
    p.add_argument("--step", type=int, help="memory-snapshot: as of the end of this step "
                                            "(default: the end of capture)")
    p.add_argument("--force", action="store_true",
                   help="replace the output even if it is a link, a special file or a file export did not write "
                        "(a link is replaced, its target never written)")
    p.set_defaults(func=run)


def export_run(run_dir: Path, output: Path | None = None, fmt: str = "perfetto", rank: int | None = None,
               step: int | None = None, force: bool = False,
               progress: Callable[[str], None] = lambda phase: None) -> tuple[Path, dict]:
    """Export a run; returns the output path and what was written (used by the CLI and the demo).
    An existing output is replaced only if export wrote it, or with ``force``
    (``neuron_prof.export.output``); a link there is never written through. ``progress``: told
    each phase of a trace's writing as it begins."""
    from neuron_prof.export.output import check_destination
    from neuron_prof.run import load
    if fmt != "memory-snapshot" and (rank is not None or step is not None):
        raise NeuronProfError(f"--rank and --step apply to --format memory-snapshot; a {fmt} trace has every "
                              "rank and step")
    run = load(run_dir)
    out = output or run_dir / DEFAULT_NAME[fmt]
    if out.is_dir():
        raise NeuronProfError(f"{out}: is a directory; pass a file name to -o, e.g. {out / DEFAULT_NAME[fmt]}")
    if not out.parent.exists():
        what = "memory snapshot" if fmt == "memory-snapshot" else "trace"
        raise NeuronProfError(f"{out.parent}: no such directory for the {what}; create it or choose another -o")
    check_destination(out, fmt, force)
    try:
        if fmt == "memory-snapshot":
            from neuron_prof.export import memory_snapshot
            return out, memory_snapshot.write(run, out, rank, step)
        from neuron_prof.export.trace import write_run
        from neuron_prof.export.tracewriter import open_writer
        return out, write_run(run, open_writer(out, fmt), progress)
    except OSError as exc:  # the run is read by now: this is the output's folder (no permission, disk full)
        raise NeuronProfError(f"{out}: cannot write it ({exc.strerror or exc}); choose another -o, in a folder "
                              "this user may write to") from None


def run(args: argparse.Namespace) -> int:
    from neuron_prof.progress import Phases
    t0 = time.perf_counter()
    with Phases("export") as progress:
        out, counts = export_run(args.run, args.output, args.format, args.rank, args.step, args.force, progress)
    took = time.perf_counter() - t0
    if args.format == "memory-snapshot":
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
