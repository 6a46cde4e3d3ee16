"""``neuron-prof record -o RUN -- python train.py ...``: capture a command with no code change."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from neuron_prof.capture.always_on import DEFAULT_DETAIL_EVERY, DEFAULT_HANG_TIMEOUT_S, DEFAULT_RING_STEPS
from neuron_prof.capture.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.reader import describe_exit
from neuron_prof.store.schema import CONFLICT_GLOB, SCHEMA_VERSION
from neuron_prof.capture.session import DEFAULT_COLLECTORS
from neuron_prof.store.writer import load_json, run_ranks, update_run_meta, write_run_meta
from neuron_prof.units import parse_bytes
from neuron_prof.version import __version__

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "capture" / "bootstrap"
PARENT_ENV = "NEURON_PROF_PARENT"  # sitecustomize.py's, which imports nothing of neuron_prof to say it once


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


def parse_size(text: str) -> int:
    """A positive byte count, as ``units.parse_bytes`` reads one: ``300000``, ``512M``, ``1.5G``,
    ``2GiB`` (powers of 1024), ``500MB`` (powers of 1000)."""
    try:
        size = parse_bytes(text)
    except ValueError:
        size = 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected a positive byte count such as 512M or 2G")
    return size


def _at_least(convert: Callable[[str], float], low: float, what: str, expected: str) -> Callable[[str], float]:
    """An argparse type: ``convert(text)``, at least ``low``."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not value >= low:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {expected}")
        return value
    return parse


_positive_int = _at_least(int, 1, "count", "a whole number >= 1")
_seconds = _at_least(float, 0, "time", "seconds >= 0 (0: no watchdog)")
_positive_number = _at_least(float, 0, "count", "a number >= 0")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a command under capture",
                       description="Run COMMAND under capture: its own Python process and the ranks a launcher "
                                   "starts are captured from their import of torch, other Python processes from "
                                   "their first optimizer step. Steps end when the training loop's optimizer "
                                   "steps. Exit code and output are the command's.")
    p.add_argument("-o", "--output", type=Path, help="run directory (default: runs/run-YYYYmmdd-HHMMSS)")
    p.add_argument("--schedule", type=parse_schedule, metavar="WAIT,WARMUP,ACTIVE[,REPEAT]",
                   help="capture only these steps in detail (default: every step, up to --max-bytes)")
    p.add_argument("--collectors", default=",".join(DEFAULT_COLLECTORS),
                   help=f"comma-separated event sources (default: {','.join(DEFAULT_COLLECTORS)}; collectives "
                        "records only where torch.distributed runs)")
    p.add_argument("--max-bytes", type=parse_size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                   help=f"disk budget per rank, every table counted: detail capture stops when a rank's folder "
                        f"holds this much, step times and per-step memory go on (default {DEFAULT_MAX_BYTES >> 20}M)")
    p.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                   help=f"op and mark rows per rank after which detail capture stops (default {DEFAULT_MAX_EVENTS:,})")
    p.add_argument("--always-on", action="store_true",
                   help="for whole jobs: step times, compiles, per-step memory, losses and collectives to disk; "
                        "op and allocation detail one step in --detail-every, that of the last --ring-steps such "
                        "steps kept in memory and written on an exception, SIGUSR1, SIGTERM or a hang (no step for "
                        "--hang-timeout seconds); `neuron-prof trigger PID` captures the next steps in detail")
    p.add_argument("--ring-steps", type=_positive_int, default=DEFAULT_RING_STEPS, metavar="N",
                   help=f"--always-on: sampled steps whose detail is kept in memory (default {DEFAULT_RING_STEPS})")
    p.add_argument("--detail-every", type=_positive_int, default=DEFAULT_DETAIL_EVERY, metavar="N",
                   help=f"--always-on: full detail one step in N (default {DEFAULT_DETAIL_EVERY}; 1: every step)")
    p.add_argument("--hang-timeout", type=_seconds, default=DEFAULT_HANG_TIMEOUT_S, metavar="SECONDS",
                   help=f"--always-on: no step for this long is a hang, dumped (default {DEFAULT_HANG_TIMEOUT_S:.0f}; "
                        "0: no watchdog)")
    p.add_argument("--follow-cpu-memory", action="store_true",
                   help="--always-on: follow CPU allocations between sampled steps too (the CPU's tensor memory "
                        "at every step and its live set at an out-of-memory error; about 1.1x on a launch-bound "
                        "CPU step); without it the CPU's per-step memory is the process's resident memory")
    p.add_argument("--tokens-per-step", type=_positive_number, metavar="N",
                   help="tokens each step trains on (throughput and cost per token in `neuron-prof compare`)")
    p.add_argument("--samples-per-step", type=_positive_number, metavar="N", help="samples each step trains on")
    p.add_argument("-q", "--quiet", action="store_true", help="don't print where the run went")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise NeuronProfError("record needs a command: neuron-prof record -o RUN -- python train.py")
    if args.always_on and args.schedule:
        raise NeuronProfError("--always-on samples its own detail steps and takes no --schedule; drop one")
    if args.follow_cpu_memory and not args.always_on:
        raise NeuronProfError("--follow-cpu-memory is for --always-on (detail capture follows CPU memory at every "
                              "step already); drop it or add --always-on")
    run_dir = (args.output or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    from neuron_prof.collectors import REGISTRY
    collectors = [c for c in args.collectors.split(",") if c]
    unknown = [c for c in collectors if c not in REGISTRY]
    if unknown:
        raise NeuronProfError(f"unknown collector {unknown[0]!r} in --collectors; choose from "
                              f"{', '.join(sorted(REGISTRY))}")
    run_id = uuid.uuid4().hex  # shared by every process of the command: their rank folders say whose they are
    _begin_run(run_dir, run_id, cmd)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
    env["NEURON_PROF_RECORD"] = json.dumps({
        "run_dir": str(run_dir), "schedule": args.schedule, "collectors": collectors,
        "max_events": args.max_events, "max_bytes": args.max_bytes, "command": cmd, "run_id": run_id,
        "mode": "always-on" if args.always_on else "detail", "ring_steps": args.ring_steps,
        "detail_every": args.detail_every, "follow_cpu_memory": args.follow_cpu_memory,
        "hang_timeout_s": args.hang_timeout or None, "tokens_per_step": args.tokens_per_step,
        "samples_per_step": args.samples_per_step})
    env[PARENT_ENV] = "launcher"  # the command's own Python process is a main (sitecustomize.py)
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
    exit_status = {"signal": -code} if code < 0 else {"code": code}
    update_run_meta(run_dir, run_id, {"exit": exit_status, "end_time_ns": time.time_ns()}, replace=False)
    if not args.quiet:
        _say_how_it_went(run_dir, run_id, exit_status)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


def _begin_run(run_dir: Path, run_id: str, cmd: list[str]) -> None:
    """run.json before the command starts: a command that dies before any rank writes still
    leaves a run that says what happened (the rank-0 writer completes it, keeping the run id)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_run_meta(run_dir, {
            "schema_version": SCHEMA_VERSION, "neuron_prof_version": __version__, "run_id": run_id,
            "run_id_scope": "command", "command": cmd, "cwd": os.getcwd(), "hostname": socket.gethostname(),
            "start_time_ns": time.time_ns()})
    except OSError as exc:
        raise NeuronProfError(f"{run_dir}: cannot write the run directory ({exc.strerror}); pass another "
                              "with -o") from None


def _say_how_it_went(run_dir: Path, run_id: str, exit_status: dict[str, int]) -> None:
    how = f"neuron-prof: the command {describe_exit(exit_status)}"
    ranks = run_ranks(run_dir, run_id)
    if not ranks:
        print(f"{how}; nothing captured in {run_dir}: no Python process of the command completed a training "
              "step or ran an op", file=sys.stderr)
        return
    print(f"{how}; run written to {run_dir} (rank{'s' if len(ranks) > 1 else ''} "
          f"{', '.join(map(str, ranks))}; next: neuron-prof report {run_dir})", file=sys.stderr)
    conflicts = [p for p in run_dir.glob(CONFLICT_GLOB) if load_json(p).get("run_id") == run_id]
    if conflicts:
        print(f"neuron-prof: {len(conflicts)} process(es) wanted a rank another process owned and wrote nothing; "
              "the report's Capture health lists them", file=sys.stderr)
