"""Trace writer throughput: numpy columns -> file, end to end.

    python benchmarks/export_speed.py [--n 2000000] [--object] [--only perfetto|chrome] [--check]

Generates N slices with realistic nesting (4 threads, depth up to 5, ~300 distinct names,
3 string annotations: shapes, dtypes, module; some empty) in a non-sorted (level) order, and
prints slices/s for the Perfetto and Chrome JSON writers. Names and annotations are drawn
independently, so nearly every slice's (name, annotations) is its own: the worst case for the
Perfetto writer, which encodes each distinct packet tail once (a captured run repeats its ops
step after step: ``benchmarks/export_run.py``). ``--object`` passes names/args as
numpy object arrays instead of pandas Categorical. ``--check`` validates the Perfetto output with
neuron_prof's strict reader (``neuron-prof inspect``'s checks; slow).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from neuron_prof.export.chrome import ChromeTraceWriter
from neuron_prof.export.perfetto import PerfettoTraceWriter


def make_slices(n: int, threads: int = 4, max_depth: int = 5, n_names: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    per_root = sum(1.5 ** k for k in range(max_depth))
    n_roots = int(1.05 * n / per_root) + 1
    tid = rng.integers(0, threads, n_roots)
    dur = rng.integers(2_000_000, 4_000_000, n_roots)
    gap = rng.integers(1_000, 50_000, n_roots)
    ts = np.empty(n_roots, np.int64)
    for t in range(threads):  # back-to-back top-level slices per thread
        m = tid == t
        ts[m] = 1_700_000_000_000_000_000 + np.cumsum(dur[m] + gap[m]) - dur[m]
    levels = [(tid, ts, dur)]
    total = n_roots
    while len(levels) < max_depth and total < n:
        ptid, pts, pdur = levels[-1]
        k = rng.integers(0, 4, len(pts))                 # 0..3 children each
        par = np.repeat(np.arange(len(pts)), k)
        j = np.arange(len(par)) - np.repeat(np.cumsum(k) - k, k)
        slot = pdur[par] // k[par]
        g = slot // 10 + rng.integers(0, 3, len(par))
        cts = pts[par] + j * slot + g
        cdur = np.maximum(slot - 2 * g, 0)
        levels.append((ptid[par], cts, cdur))
        total += len(par)
    tid = np.concatenate([l[0] for l in levels])[:n]
    ts = np.concatenate([l[1] for l in levels])[:n]
    dur = np.concatenate([l[2] for l in levels])[:n]
    depth = np.concatenate([np.full(len(l[0]), i) for i, l in enumerate(levels)])[:n]
    names = np.array([f"aten::op_{i}" for i in range(n_names)], dtype=object)
    name = pd.Categorical.from_codes(rng.integers(0, n_names, len(ts)), names)
    shapes_c = np.array([""] + [f"[[{a}, {b}], [{b}, {c}]]" for a, b, c in rng.integers(1, 4096, (2000, 3))],
                        dtype=object)
    dtypes_c = np.array(["", "float32", "bfloat16", "float16", "int64", "bool"], dtype=object)
    module_c = np.array([""] + [f"model.layers.{i}.{m}" for i in range(24) for m in ("attn", "mlp", "norm", "embed")],
                        dtype=object)
    args = {
        "shapes": pd.Categorical.from_codes(rng.integers(0, len(shapes_c), len(ts)), shapes_c),
        "dtypes": pd.Categorical.from_codes(rng.integers(0, len(dtypes_c), len(ts)), dtypes_c),
        "module": pd.Categorical.from_codes(np.minimum(depth * 20 + rng.integers(0, 20, len(ts)),
                                                       len(module_c) - 1), module_c),
    }
    return tid, ts, dur, name, args


def run_writer(cls, path, tid, ts, dur, name, args):
    t0 = time.perf_counter()
    w = cls(path)
    p = w.process(1234, "rank 0")
    handles = np.array([w.thread_track(p, 1000 + t, f"thread {t}") for t in range(int(tid.max()) + 1)])
    w.slices(handles[tid], ts, dur, name, args)
    w.close()
    return time.perf_counter() - t0, w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--object", action="store_true", help="names/args as object arrays, not Categorical")
    ap.add_argument("--only", choices=["perfetto", "chrome"])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    tid, ts, dur, name, args = make_slices(a.n)
    if a.object:
        name = np.asarray(name, dtype=object)
        args = {k: np.asarray(v, dtype=object) for k, v in args.items()}
    print(f"{len(ts):,} slices, {len(name.categories) if hasattr(name, 'categories') else len(set(name))} names, "
          f"{'object arrays' if a.object else 'Categorical'}")
    with tempfile.TemporaryDirectory() as d:
        for label, cls, fn in (("perfetto", PerfettoTraceWriter, "t.perfetto-trace"),
                               ("chrome", ChromeTraceWriter, "t.json")):
            if a.only and a.only != label:
                continue
            path = os.path.join(d, fn)
            took, w = run_writer(cls, path, tid, ts, dur, name, args)
            size = os.path.getsize(path)
            print(f"{label:9s} {len(ts) / took:12,.0f} slices/s  ({took:.2f}s, {size / 1e6:.1f} MB, "
                  f"repaired {w.stats['repaired_slices']})")
            if label == "perfetto" and a.check:
                from neuron_prof.export.check import check_bytes
                t0 = time.perf_counter()
                rep = check_bytes(Path(path).read_bytes(), keep_events=False)
                print(f"          check: {'OK' if rep.ok else 'FAIL'} {dict(rep.stats)} "
                      f"({time.perf_counter() - t0:.0f}s)", rep.errors[:3], rep.warnings[:3])


if __name__ == "__main__":
    main()
