"""``neuron-prof record -o RUN -- python train.py ...``: capture a command with no code change."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from neuron_prof.capture.options import RECORD_ENV, CaptureOptions
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.reader import describe_exit
from neuron_prof.store.schema import CONFLICT_GLOB, SCHEMA_VERSION
from neuron_prof.store.writer import load_json, run_ranks, update_run_meta, write_run_meta
from neuron_prof.version import __version__

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "capture" / "bootstrap"
PARENT_ENV = "NEURON_PROF_PARENT"  # sitecustomize.py's, which imports nothing of neuron_prof to say it once


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a command under capture",
                       description="Run COMMAND under capture: its own Python process and the ranks a launcher "
                                   "starts are captured from their import of torch, other Python processes from "
                                   "their first optimizer step. Steps end when the training loop's optimizer "
                                   "steps. Exit code and output are the command's.")
    CaptureOptions.add_flags(p)
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
    unknown = [c for c in args.collectors if c not in REGISTRY]
    if unknown:
        raise NeuronProfError(f"unknown collector {unknown[0]!r} in --collectors; choose from "
                              f"{', '.join(sorted(REGISTRY))}")
    run_id = uuid.uuid4().hex  # shared by every process of the command: their rank folders say whose they are
    _begin_run(run_dir, run_id, cmd)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
    env[RECORD_ENV] = CaptureOptions.from_flags(args, run_dir=run_dir, command=cmd, run_id=run_id).to_json()
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
