"""Disk rate of a long capture of a small-op loop: what one rank's folder holds, second by second.

    .venv/bin/python benchmarks/disk_rate.py [--seconds 120] [--max-bytes N] [--json out.json]

A tiny MLP (16 wide, 2 layers, batch 4, SGD: a few dozen tiny ops per step, so the capture's rows,
not the math, set the pace) trains for ``--seconds`` under ``neuron_prof.profile`` at its default
settings (or ``--max-bytes``) in a child process; this process samples the size of the rank's
folder once a second. Printed: the total, the rate before and after the budget cut detail, and
the cut itself as the run records it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOP = """
import sys, time, torch, neuron_prof
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(4, 16)
kwargs = {} if sys.argv[3] == "default" else {"max_bytes": int(sys.argv[3])}
end = time.monotonic() + float(sys.argv[2])
with neuron_prof.profile(sys.argv[1], **kwargs) as prof:
    while time.monotonic() < end:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
"""


def folder_bytes(path: Path) -> int:
    """The bytes of the regular files in ``path`` (one rank's folder)."""
    try:
        return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(path) if e.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return 0


def measure(seconds: float, max_bytes: int | None, workdir: Path) -> dict:
    run_dir = workdir / f"run-{time.monotonic_ns()}"
    rank_dir = run_dir / "rank-00000"
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(run_dir), str(seconds),
                             "default" if max_bytes is None else str(max_bytes)])
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    while proc.poll() is None:
        samples.append((time.monotonic() - t0, folder_bytes(rank_dir)))
        time.sleep(1.0)
    if proc.returncode:
        raise SystemExit(f"the training loop failed (exit {proc.returncode})")
    import neuron_prof

    run = neuron_prof.load(run_dir)
    rd = run.rank_data[0]
    cut = rd.last_commit.get("detail_cut")
    steps = int(run.steps["complete"].sum())
    final = folder_bytes(rank_dir)
    start = next((t for t, b in samples if b), 0.0)
    cut_at = None
    if cut:
        cut_at = start + (cut["ts"] - int(run.steps["ts"].min())) / 1e9
    before = [(t, b) for t, b in samples if cut_at is None or t <= cut_at]
    after = [(t, b) for t, b in samples if cut_at is not None and t > cut_at + 2]

    def rate(pts: list[tuple[float, int]]) -> float | None:
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 and pts[-1][0] > pts[0][0] else None

    return {"seconds": seconds, "max_bytes": max_bytes, "steps": steps, "final_bytes": final,
            "peak_sampled_bytes": max((b for _, b in samples), default=0),
            "rate_before_cut_Bps": rate(before), "rate_after_cut_Bps": rate(after),
            "bytes_per_step_after_cut": (final - cut["bytes"]) / max(1, steps - 1 - cut["step"]) if cut else None,
            "cut": cut, "ops": int(len(run.ops)), "memory_events": int(len(run.memory_events))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--max-bytes", type=int, help="the budget to capture with (default: profile()'s default)")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = measure(args.seconds, args.max_bytes, Path(d))
    mb = 1e6
    print(f"{r['seconds']:.0f} s of a tiny-MLP loop, {r['steps']} steps, max_bytes "
          f"{'default' if r['max_bytes'] is None else r['max_bytes']}: rank folder {r['final_bytes'] / mb:.1f} MB "
          f"({r['ops']} op rows, {r['memory_events']} memory events)")
    if r["rate_before_cut_Bps"] is not None:
        print(f"  while capturing detail: {r['rate_before_cut_Bps'] / mb:.2f} MB/s")
    if r["cut"]:
        c = r["cut"]
        print(f"  detail cut at step {c['step']} after {c['bytes'] / mb:.1f} MB ({', '.join(c['tables'])})")
    if r["rate_after_cut_Bps"] is not None:
        print(f"  after the cut: {r['rate_after_cut_Bps'] / 1e3:.2f} kB/s, "
              f"{r['bytes_per_step_after_cut']:.0f} B per step")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
