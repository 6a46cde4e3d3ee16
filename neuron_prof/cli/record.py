"""``neuron-prof record -o RUN -- python train.py ...``: capture a command with no code change."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from neuron_prof.errors import NeuronProfError

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "_bootstrap"


def parse_schedule(text: str) -> dict[str, int]:
    """``WAIT,WARMUP,ACTIVE[,REPEAT]`` as torch.profiler.schedule takes them."""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
        raise argparse.ArgumentTypeError(f"invalid schedule {text!r}: expected WAIT,WARMUP,ACTIVE[,REPEAT], "
                                         "e.g. 1,1,3,1")
    return dict(zip(("wait", "warmup", "active", "repeat"), parts))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a command under capture",
                       description="Run COMMAND with every Python process captured. Steps end when the "
                                   "training loop's optimizer steps. Exit code and output are the command's.")
    p.add_argument("-o", "--output", type=Path, help="run directory (default: runs/run-YYYYmmdd-HHMMSS)")
    p.add_argument("--schedule", type=parse_schedule, metavar="WAIT,WARMUP,ACTIVE[,REPEAT]",
                   help="capture only these steps in detail (default: every step, up to --max-events)")
    p.add_argument("--collectors", default="eager,compiler,memory",
                   help="comma-separated event sources (default: eager,compiler,memory)")
    p.add_argument("--max-events", type=int, default=50_000_000, help="event cap per rank (default 50M)")
    p.add_argument("-q", "--quiet", action="store_true", help="don't print where the run went")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise NeuronProfError("record needs a command: neuron-prof record -o RUN -- python train.py")
    run_dir = (args.output or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    from neuron_prof.collectors import REGISTRY
    collectors = [c for c in args.collectors.split(",") if c]
    unknown = [c for c in collectors if c not in REGISTRY]
    if unknown:
        raise NeuronProfError(f"unknown collector {unknown[0]!r} in --collectors; choose from "
                              f"{', '.join(sorted(REGISTRY))}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
    env["NEURON_PROF_RECORD"] = json.dumps({
        "run_dir": str(run_dir), "schedule": args.schedule, "collectors": collectors,
        "max_events": args.max_events, "command": cmd})
    try:
        proc = subprocess.Popen(cmd, env=env)
    except (FileNotFoundError, PermissionError) as exc:
        raise NeuronProfError(f"{cmd[0]}: cannot run ({exc.strerror}); check the command after --") from None
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:  # the child got the same SIGINT; wait for it to finish writing
            continue
    if not args.quiet:
        if any(run_dir.glob("rank-*")):
            print(f"neuron-prof: run written to {run_dir}  (next: neuron-prof report {run_dir})", file=sys.stderr)
        else:
            print(f"neuron-prof: nothing captured in {run_dir}: no Python process of the command ran a training "
                  "step or any op", file=sys.stderr)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention
