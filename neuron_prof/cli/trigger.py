"""``neuron-prof trigger PID [--steps N] [--wait SECONDS]``: capture a running always-on job's next
steps in full detail, with no restart (neuron_prof.capture.ondemand)."""
from __future__ import annotations

import argparse

DEFAULT_STEPS = 5
DEFAULT_WAIT_S = 60.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trigger", help="capture a running always-on job's next steps in full detail",
                       description="Ask process PID, capturing in always-on mode (record --always-on, "
                                   "profile(mode=\"always-on\")), to capture its next N steps in full detail "
                                   "into its run, as a scheduled window would. The job goes on; nothing restarts.")
    p.add_argument("pid", type=int, help="the training process (a rank; not its launcher)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"how many steps to capture, from its next step on (default {DEFAULT_STEPS})")
    p.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
                   help=f"wait up to this long for the steps to be captured, and say which (default "
                        f"{DEFAULT_WAIT_S:.0f}; 0: do not wait)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.errors import NeuronProfError
    from neuron_prof.capture.ondemand import request
    if args.steps < 1:
        raise NeuronProfError(f"--steps must be a whole number >= 1, not {args.steps}")
    if not args.wait >= 0:
        raise NeuronProfError(f"--wait must be seconds >= 0, not {args.wait}")
    result = request(args.pid, args.steps, wait_s=args.wait or None)
    where = f"{result.run_dir} (rank {result.rank})"
    if not args.wait:
        print(f"process {result.pid} will capture its next {args.steps} steps in full detail into {where}")
    else:
        steps = result.steps
        print(f"process {result.pid} captured steps {steps[0]}-{steps[-1]} in full detail into {where}" if steps
              else f"process {result.pid} captured no step into {where}")
    return 0
