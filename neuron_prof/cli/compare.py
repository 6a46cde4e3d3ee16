"""``neuron-prof compare RUN_A RUN_B``: the migration checklist of RUN_B against the baseline RUN_A."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from neuron_prof.errors import NeuronProfError
from neuron_prof.backends.targets import TARGETS, register_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two runs of a job: the migration checklist",
                       description="RUN_B against the baseline RUN_A, one row per check: step time, samples/s and "
                                   "tokens/s, cost per million tokens, compile time, graph breaks and recompiles, "
                                   "CPU fallbacks and op coverage, sync stalls, peak memory, loss agreement; then "
                                   "the graph breaks of one run only and the ops whose time changed most.")
    p.add_argument("run_a", type=Path, help="baseline run directory (e.g. the GPU run)")
    p.add_argument("run_b", type=Path, help="run compared with it (e.g. the same job on the new device)")
    p.add_argument("--label", action="append", default=[], metavar="A=NAME",
                   help="a name for run A or B in the output (e.g. --label A=gpu --label B=neuron)")
    p.add_argument("--price", action="append", default=[], metavar="A=USD_PER_HOUR",
                   help="price per instance-hour of run A or B (one instance per host its ranks ran on): adds the "
                        "cost per million tokens")
    p.add_argument("--peak-tflops", action="append", default=[], metavar="A=TFLOPS",
                   help="peak TFLOP/s of run A's or B's device: adds their MFU")
    p.add_argument("--peak-device", action="append", default=[], metavar="A=NAME",
                   help="a known device whose published peak run A or B is read against (see report --peak-device)")
    p.add_argument("--target", choices=sorted(TARGETS),
                   help="a backend to move to, registered in this process: adds the share of each run's op time "
                        "in ops that fall back to the CPU there (port-check's prediction); "
                        + "; ".join(f"{name}: {what}" for name, (_, what) in TARGETS.items()))
    p.add_argument("--loss-rtol", type=float, default=None, metavar="R",
                   help="relative difference of a step's loss that counts as divergence (default 1e-3)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the comparison as JSON (for CI gates)")
    out.add_argument("--markdown", action="store_true", help="print it as Markdown (a pull request, a report)")
    p.set_defaults(func=run)


def _pairs(values: list[str], flag: str, convert) -> dict[str, object]:
    """``A=x``/``B=y`` options into {"a": x, "b": y}; a one-line error for anything else."""
    out: dict[str, object] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or key.strip().upper() not in ("A", "B") or not value.strip():
            raise NeuronProfError(f"{flag} {v!r}: expected A=VALUE or B=VALUE")
        try:
            out[key.strip().lower()] = convert(value.strip())
        except ValueError:
            raise NeuronProfError(f"{flag} {v!r}: {value.strip()!r} is not a number") from None
    return out


def _price(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _peak(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


def run(args: argparse.Namespace) -> int:
    labels = _pairs(args.label, "--label", str)
    prices = _pairs(args.price, "--price", _price)
    tflops = _pairs(args.peak_tflops, "--peak-tflops", _peak)
    devices = _pairs(args.peak_device, "--peak-device", str)
    from neuron_prof.analysis.flops import DEVICE_PEAKS
    for key, name in devices.items():
        if name not in DEVICE_PEAKS:
            raise NeuronProfError(f"--peak-device {key.upper()}={name}: not a known device; one of "
                                  f"{', '.join(sorted(DEVICE_PEAKS))}")
    if args.loss_rtol is not None and not args.loss_rtol > 0:
        raise NeuronProfError(f"--loss-rtol {args.loss_rtol}: expected a number > 0")
    from neuron_prof.analysis.compare import LOSS_RTOL
    from neuron_prof.analysis.flops import PeakRequest
    from neuron_prof.reports.compare import PHASES, compare_runs, render_markdown, render_text, to_json
    from neuron_prof.progress import Phases
    from neuron_prof.store.run import load
    a, b = load(args.run_a), load(args.run_b)
    peaks = tuple(PeakRequest(tflops=tflops.get(k), device=devices.get(k)) for k in ("a", "b"))
    target = register_target(args.target) if args.target else None
    with Phases("compare", PHASES) as progress:
        result = compare_runs(a, b, (str(labels.get("a", "a")), str(labels.get("b", "b"))),
                              (prices.get("a"), prices.get("b")), loss_rtol=args.loss_rtol or LOSS_RTOL,
                              progress=progress, peaks=peaks, target=target)
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        print(render_markdown(result) if args.markdown else render_text(result), end="")
    return 0
