"""``neuron-prof import TRACE -o RUN``: a torch.profiler trace (neuron_prof.kineto) or a
TORCH_TRACE folder of compile logs (neuron_prof.torch_trace) as a run."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn a torch.profiler trace or a TORCH_TRACE folder into a run",
                       description="Read a torch.profiler trace (Kineto's Chrome JSON from export_chrome_trace, "
                                   "gzip too: ops with shapes, stacks and module paths, ProfilerStep ranges as "
                                   "steps, memory events) or a TORCH_TRACE folder (the compile logs tlparse reads: "
                                   "compiles, graph breaks, recompiles) into a new run. Every reader opens it; "
                                   "`neuron-prof compare` compares it with a neuron_prof run of the same job.")
    p.add_argument("trace", type=Path, help="trace.json, trace.json.gz, or a TORCH_TRACE folder")
    p.add_argument("-o", "--output", type=Path, required=True, help="the new run directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace.is_dir():
        from neuron_prof.torch_trace import import_torch_trace
        written = import_torch_trace(args.trace, args.output)
        for rank, counts in written.items():
            print(f"{args.output}: rank {rank}: " + ", ".join(f"{n} {t.replace('_', ' ')}" for t, n in counts.items())
                  + f" from {args.trace}")
        return 0
    from neuron_prof.kineto import PHASES, import_trace
    from neuron_prof.progress import Phases
    with Phases("import", PHASES) as progress:
        done = import_trace(args.trace, args.output, progress)
    print(f"{done.run_dir}: {done.ops:,} ops, {done.steps} steps, {done.memory_events:,} memory events from {args.trace}"
          + (f"; {done.skipped_device_events:,} GPU kernel, copy and runtime events not imported (not yet "
             "supported)" if done.skipped_device_events else ""))
    return 0
