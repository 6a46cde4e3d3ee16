"""``neuron-prof import TRACE -o RUN``: a torch.profiler trace (neuron_prof.importers.kineto) or a
TORCH_TRACE folder of compile logs (neuron_prof.importers.torch_trace) as a run."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn a torch.profiler trace (or one per rank) or a TORCH_TRACE folder into "
                                      "a run",
                       description="Read a torch.profiler trace (Kineto's Chrome JSON from export_chrome_trace, "
                                   "gzip too: ops with shapes, stacks and module paths, ProfilerStep ranges as "
                                   "steps, memory events, the device's kernels, copies, runtime calls and stream "
                                   "waits, the ranks and process groups of distributedInfo, the collectives), a "
                                   "folder of such traces, one per rank of a distributed job, as one run, or a "
                                   "TORCH_TRACE folder (the compile logs tlparse reads: compiles, graph breaks, "
                                   "recompiles) into a new run. Every reader opens it; `neuron-prof compare` "
                                   "compares it with a neuron_prof run of the same job.")
    p.add_argument("trace", type=Path, help="trace.json, trace.json.gz, a folder of them (one per rank), or a "
                                            "TORCH_TRACE folder")
    p.add_argument("-o", "--output", type=Path, required=True, help="the new run directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.importers.torch_trace import LOG_GLOB, import_torch_trace
    if args.trace.is_dir() and any(args.trace.glob(LOG_GLOB)):
        written = import_torch_trace(args.trace, args.output)
        for rank, counts in written.items():
            print(f"{args.output}: rank {rank}: " + ", ".join(f"{n} {t.replace('_', ' ')}" for t, n in counts.items())
                  + f" from {args.trace}")
        return 0
    from neuron_prof.importers.kineto import PHASES, import_trace
    from neuron_prof.progress import Phases
    with Phases("import", PHASES) as progress:
        done = import_trace(args.trace, args.output, progress)
    for r in done.ranks:
        device = (f", {r.device_kernels:,} device kernels, {r.device_copies:,} copies"
                  if r.device_kernels or r.device_copies else "")
        comms = f", {r.collectives:,} collectives" if r.collectives else ""
        print(f"{done.run_dir}: rank {r.rank}: {r.ops:,} ops, {r.steps} steps, {r.memory_events:,} memory events"
              f"{device}{comms} from {r.source}")
    print(f"{done.run_dir}: {done.device}, world size {done.world_size}")
    for what, n in sorted(done.left_out.items(), key=lambda x: -x[1]):
        print(f"left out: {n:,} {what}")
    return 0
