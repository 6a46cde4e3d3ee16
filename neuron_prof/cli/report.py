"""``neuron-prof report RUN [--json]``: the 10-second terminal summary of a run."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from neuron_prof.errors import NeuronProfError
from neuron_prof.backends.targets import TARGETS, register_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="summarise a run in the terminal",
                       description="Steps, top ops by self time, FLOPs and MFU, sync points and capture health.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--json", action="store_true", help="print the same summary as JSON (for CI gates)")
    p.add_argument("--top", type=int, default=10, help="how many ops to list (default 10)")
    p.add_argument("--peak-tflops", type=float, metavar="X",
                   help="the device's peak TFLOP/s, what MFU and the roofline are against (default: --peak-device's, "
                        "else --calibrate's, else unknown)")
    p.add_argument("--peak-gbps", type=float, metavar="Y", help="the device's peak memory bandwidth in GB/s (the "
                                                                "roofline's slope; default as --peak-tflops)")
    p.add_argument("--peak-device", metavar="NAME",
                   help="take the peaks AWS publishes for a device: trainium1, trainium2 (a chip) or trainium1-core, "
                        "trainium2-core (one NeuronCore); sources in docs/report.md")
    p.add_argument("--calibrate", action="store_true",
                   help="for a CPU run, measure this machine's peaks now (a matmul and a copy, about 0.1 s) for the "
                        "figures not given: the report then differs from one run of it to the next")
    p.add_argument("--target", choices=sorted(TARGETS),
                   help="a backend to move to, registered in this process: adds port-check's porting inventory "
                        "(CUDA-only call sites, ops that fall back there, a verdict; under \"port_check\" in --json)")
    p.set_defaults(func=run)


def _positive(value: float | None, flag: str) -> float | None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise NeuronProfError(f"{flag} {value}: expected a number > 0")
    return value


def run(args: argparse.Namespace) -> int:
    from neuron_prof.analysis.flops import DEVICE_PEAKS, PeakRequest
    from neuron_prof.store.run import load
    from neuron_prof.reports.summary.text import render_text
    from neuron_prof.reports.stored import run_summary
    tflops, gbps = _positive(args.peak_tflops, "--peak-tflops"), _positive(args.peak_gbps, "--peak-gbps")
    if args.peak_device is not None and args.peak_device not in DEVICE_PEAKS:
        raise NeuronProfError(f"--peak-device {args.peak_device!r}: not a known device; known: "
                              f"{', '.join(DEVICE_PEAKS)} (or give --peak-tflops and --peak-gbps)")
    run_ = load(args.run)
    # the run's stored summary when it is fresh, read against the peaks asked for
    summary = run_summary(run_, top=args.top, peaks=PeakRequest(tflops, gbps, args.peak_device, args.calibrate))
    check = None
    if args.target:  # the inventory depends on the target and the code as it is now: never stored
        from neuron_prof.reports.port import port_check
        check = port_check(run_, register_target(args.target))
    if args.json:
        doc = summary.to_json()
        if check is not None:
            from neuron_prof.reports.port import to_json
            doc["port_check"] = to_json(check)
        print(json.dumps(doc, indent=2))
        return 0
    print(render_text(summary), end="")
    if check is not None:
        from neuron_prof.reports.port import render_text as render_port
        print("\n" + render_port(check, run_.display_path), end="")
    return 0
