"""Viewer speed at scale: the Overview's first render and the server's memory on a 10M-op run,
and the Memory page's time per interaction on a run with 1M allocations.

    .venv/bin/python benchmarks/viewer_speed.py [--ops 10000000] [--allocs 1000000] [--steps 100]
        [--keep DIR] [--only generate|overview|report|memory|profile]... [--json OUT]

Generates two synthetic runs with the real writer (``neuron_prof.store.writer.RankWriter``: journaled
per step, compacted into the Arrow streams, closed with a manifest, as a capture does):

``ops`` run
    ``--ops`` op events over ``--steps`` steps: nested ops (depth 0..3, each op 0..3 children that
    subdivide it), ~300 distinct op names, ~300 module paths, 400 stacks, 2,000 shape strings;
    per step a forward on the main thread, a backward on an autograd thread (``bwd``), an
    ``Optimizer.step#Adam.step`` range and one sync point (``aten::item`` >
    ``aten::_local_scalar_dense``).
``memory`` run
    ``--allocs`` allocations (``memory_events`` alloc rows, each with its free row unless it is a
    parameter or one of a few leaked blocks, so about twice as many event rows), sizes 512 B..4 MiB,
    temporaries freed in their op, activations freed in backward, a 64 MiB spike in the middle
    step, 0.1% of blocks leaked; parameters listed in ``memory_tensors`` at every step boundary;
    ``memory_steps`` at every boundary; a few ops per step.

Then measures, with ``neuron-prof view``'s server (``neuron_prof.viewer.server.start``) and Debian's
Chromium driven headless by Playwright:

- Overview (ops run): time from opening the page until its title, until the metrics, until the
  findings and until the whole page has rendered (script done, charts drawn); the server's peak
  RSS (VmHWM) after it. Twice: with no summary stored in the run (the page computes it), then
  with the summary stored as the end of a capture stores it (``stored.store_summary``,
  whose own time and peak RSS in a fresh process are reported too).
- ``report``: ``neuron-prof report RUN --json`` as a fresh process, without and with the stored
  summary: wall time and peak RSS.
- Memory page (memory run): the first load, then each of a few selectbox changes (timeline range,
  the peak's step, the diff's step and grouping): time from the click until the rerun is over and
  its charts are drawn. Peak RSS after.
- ``profile``: in a fresh process, wall time and peak RSS of ``neuron_prof.load(run)``,
  ``run.ops`` and ``neuron_prof.reports.summary.build.summarize(run)`` on the ops run, and cProfile's top
  functions for the last two.

Without ``--keep`` the runs go to a temporary folder that is deleted at the end; with it they are
kept and reused on the next call (delete the folder to regenerate).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from neuron_prof.store.schema import SCHEMA_VERSION
from neuron_prof.store.writer import RankWriter, write_run_meta

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]
TARGETS = {"overview_s": 5.0, "overview_stored_s": 3.0, "rss_gb": 2.0, "memory_interaction_s": 3.0}
"""Seconds until the Overview's findings without a stored summary (issue 9) and with one (issue 24), the
server's peak RSS, seconds per Memory page interaction."""
MAIN_TID, AUTOGRAD_TID = 4242, 4243
T0 = 1_000_000_000_000  # CLOCK_MONOTONIC ns of the first step


# ---------------------------------------------------------------------------------- generation

class Strings:
    """The run's interned strings (id 0 is the empty string, as in a capture)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        return self.ids.setdefault(s, len(self.ids))

    def many(self, values) -> np.ndarray:
        return np.array([self(v) for v in values], dtype=np.int32)

    def columns(self) -> dict:
        return {"id": np.arange(len(self.ids), dtype=np.int32), "value": list(self.ids)}


def _stacks(strings: Strings, rng: np.random.Generator, n: int) -> tuple[dict, dict]:
    """``n`` Python stacks of 3..6 frames over a few files (innermost first), ids 1..n."""
    files = [f"/work/train/{f}.py" for f in ("train", "model", "layers", "attention", "mlp", "data", "optim")]
    funcs = ["forward", "train_step", "main", "__call__", "_call_impl", "backward", "step", "loss_fn"]
    frames: dict[tuple[int, int, int], int] = {}
    stack_rows = []
    for _ in range(n):
        fids = []
        for _ in range(int(rng.integers(3, 7))):
            key = (strings(files[rng.integers(len(files))]), strings(funcs[rng.integers(len(funcs))]),
                   int(rng.integers(1, 800)))
            fids.append(frames.setdefault(key, len(frames) + 1))
        stack_rows.append(fids)
    f = np.array(list(frames), dtype=np.int32).reshape(-1, 3)
    frames_cols = {"id": np.arange(1, len(f) + 1, dtype=np.int32), "file": f[:, 0], "func": f[:, 1], "line": f[:, 2]}
    stacks_cols = {"id": np.arange(0, n + 1, dtype=np.int32), "frames": [[]] + stack_rows}
    return frames_cols, stacks_cols


def _meta(rank: int = 0) -> tuple[dict, dict]:
    run_id = uuid.uuid4().hex  # the writer claims the folder for this run
    rank_meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "rank": rank, "world_size": 1, "pid": os.getpid(),
                 "hostname": socket.gethostname(), "device": "cpu", "torch_version": "2.13.0+cpu",
                 "python": sys.version.split()[0], "clock_offset_ns": 1_700_000_000_000_000_000 - T0,
                 "start_ns": T0, "collectors": ["eager", "memory"], "schedule": None,
                 "max_buffered_events": 2_000_000, "max_events": 50_000_000}
    run_meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "neuron_prof_version": "bench",
                "command": ["python", "benchmarks/viewer_speed.py", "(synthetic run)"], "cwd": "/work/train",
                "torch_version": "2.13.0+cpu", "device": "cpu", "world_size": 1,
                "start_time_ns": 1_700_000_000_000_000_000, "hostname": socket.gethostname()}
    return rank_meta, run_meta


def _tree(rng: np.random.Generator, roots_ts: np.ndarray, roots_dur: np.ndarray, max_depth: int = 3):
    """Children subdividing their parent, 0..3 per op, down to ``max_depth``: per level (parent
    index into the previous level, ts, dur)."""
    levels = [(np.arange(len(roots_ts)), roots_ts, roots_dur)]
    for _ in range(max_depth):
        _, pts, pdur = levels[-1]
        k = rng.integers(0, 4, len(pts))
        par = np.repeat(np.arange(len(pts)), k)
        j = np.arange(len(par)) - np.repeat(np.cumsum(k) - k, k)
        slot = pdur[par] // np.maximum(k[par], 1)
        gap = slot // 10 + rng.integers(0, 3, len(par))
        levels.append((par, pts[par] + j * slot + gap, np.maximum(slot - 2 * gap, 1)))
    return levels


def _step_ops(rng, n: int, t: int, step: int, pools: dict) -> tuple[dict, int]:
    """About ``n`` (exactly ``n``) nested ops of one step starting at ``t``; returns (columns, end)."""
    n_roots = max(int(n / 8.125 * 1.1), 8)
    while True:
        dur = rng.integers(20_000, 200_000, n_roots)
        gap = rng.integers(2_000, 20_000, n_roots)
        ts = t + np.cumsum(dur + gap) - dur
        levels = _tree(rng, ts, dur)
        total = sum(len(lv[0]) for lv in levels)
        if total >= n:
            break
        n_roots = int(n_roots * 1.2)
    # root roles by position in the step: forward 60%, backward 35% (another thread), optimizer
    r = np.arange(n_roots)
    fwd_end, bwd_end = int(n_roots * 0.60), int(n_roots * 0.95)
    root_bwd = (r >= fwd_end) & (r < bwd_end)
    root_tid = np.where(root_bwd, AUTOGRAD_TID, MAIN_TID)
    root_module = np.where(r < fwd_end, rng.choice(pools["modules"], n_roots), 0)
    root_name = np.where(root_bwd, rng.choice(pools["bwd_names"], n_roots), rng.choice(pools["names"], n_roots))
    root_name[fwd_end // 2] = pools["item"]            # a sync point: .item() in the forward
    root_name[bwd_end] = pools["optimizer_step"]
    root_name[-1] = pools["zero_grad"]
    cols = {k: [] for k in ("ts", "dur", "tid", "name", "module", "stack", "shapes", "dtypes", "devices", "bwd",
                            "depth")}
    # properties flow down the tree: root index of every op
    root_of = [np.arange(n_roots)]
    for d, (par, lts, ldur) in enumerate(levels):
        root = root_of[-1] if d == 0 else root_of[-1][par]
        if d:
            root_of.append(root)
        m = len(lts)
        name = root_name if d == 0 else rng.choice(pools["names"], m)
        if d == 1:  # .item()'s only op is the read of the device value
            name = np.where(root_name[root] == pools["item"], pools["local_scalar_dense"], name)
        cols["ts"].append(lts)
        cols["dur"].append(ldur)
        cols["tid"].append(root_tid[root])
        cols["name"].append(name)
        cols["module"].append(root_module[root])
        cols["stack"].append(rng.choice(pools["stacks"], m))
        cols["shapes"].append(rng.choice(pools["shapes"], m))
        cols["dtypes"].append(rng.choice(pools["dtypes"], m))
        cols["devices"].append(rng.choice(pools["devices"], m))
        cols["bwd"].append(root_bwd[root])
        cols["depth"].append(np.full(m, d, dtype=np.int16))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    # exactly n: drop the extra leaves (deepest level, from its end); nesting stays intact
    order = np.lexsort((-out["ts"], out["depth"]))[::-1]  # deepest, latest first
    keep = np.ones(len(out["ts"]), dtype=bool)
    keep[order[: len(keep) - n]] = False
    out = {k: v[keep] for k, v in out.items()}
    order = np.lexsort((out["depth"], out["ts"]))         # start order, parents first
    out = {k: v[order] for k, v in out.items()}
    out["seq"] = np.where(out["bwd"], -1, np.arange(len(order))).astype(np.int64)
    out["fwd_tid"] = np.where(out["bwd"], MAIN_TID, 0).astype(np.int64)
    out["name"] = out["name"].astype(np.int32)
    out["recompute"] = np.zeros(len(order), bool)
    end = int(ts[-1] + dur[-1]) + 50_000
    return out, end


def generate_ops_run(run_dir: Path, n_ops: int, n_steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    strings = Strings()
    real = ["aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::copy_", "aten::add_", "aten::mul",
            "aten::relu", "aten::gelu", "aten::softmax", "aten::layer_norm", "aten::native_layer_norm", "aten::view",
            "aten::t", "aten::transpose", "aten::empty", "aten::to", "aten::_to_copy", "aten::sum", "aten::mean"]
    names = real + [f"aten::op_{i}" for i in range(300 - len(real))]
    bwd_names = [f"autograd::engine::evaluate_function: {k}Backward0" for k in
                 ("Addmm", "Mm", "Relu", "Gelu", "Softmax", "NativeLayerNorm", "View", "T", "Mul", "Add")]
    modules = [f"model.layers.{i}.{m}" for i in range(24) for m in
               ("self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp", "mlp.up", "mlp.down", "mlp.act", "input_norm", "post_norm", "dropout")] + \
              ["model.embed", "model.norm", "lm_head"]
    frames_cols, stacks_cols = _stacks(strings, rng, 400)
    shapes = [""] + [f"[[{a}, {b}], [{b}, {c}]]" for a, b, c in rng.integers(1, 4096, (1999, 3))]
    pools = {
        "names": strings.many(names), "bwd_names": strings.many(bwd_names), "modules": strings.many(modules),
        "stacks": np.arange(1, 401, dtype=np.int32), "shapes": strings.many(shapes),
        "dtypes": strings.many(["", "float32", "float32, float32", "bfloat16", "int64"]),
        "devices": strings.many(["cpu", "cpu, cpu", "cpu, cpu, cpu", ""]),
        "item": strings("aten::item"), "local_scalar_dense": strings("aten::_local_scalar_dense"),
        "optimizer_step": strings("Optimizer.step#Adam.step"), "zero_grad": strings("Optimizer.zero_grad#Adam.zero_grad"),
    }
    rank_meta, run_meta = _meta()
    writer = RankWriter(run_dir / "rank-00000", rank_meta)
    write_run_meta(run_dir, run_meta)
    writer.append("threads", {"tid": np.array([MAIN_TID, AUTOGRAD_TID], np.int64),
                              "name": strings.many(["MainThread", "pt_autograd_0"])})
    writer.append("frames", frames_cols)
    writer.append("stacks", stacks_cols)
    written = 0
    t = T0
    per_step = np.diff(np.linspace(0, n_ops, n_steps + 1).astype(np.int64))
    for step, n in enumerate(per_step):
        cols, end = _step_ops(rng, int(n), t + 100_000, step, pools)
        writer.append("ops", cols)
        writer.append("steps", {"step": np.array([step], np.int32), "ts": np.array([t], np.int64),
                                "dur": np.array([end - t], np.int64), "active": np.array([True]),
                                "complete": np.array([True])})
        written += len(cols["ts"])
        if step == 0:
            writer.append("strings", strings.columns())
        writer.compact(step + 1, {"dropped": {}, "written": {"ops": written}, "cap_reached_at_step": None})
        t = end
    writer.close(n_steps, {"dropped": {}, "written": {"ops": written}, "cap_reached_at_step": None})


def generate_memory_run(run_dir: Path, n_allocs: int, n_steps: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    strings = Strings()
    frames_cols, stacks_cols = _stacks(strings, rng, 200)
    step_ns = 50_000_000
    starts = T0 + np.arange(n_steps, dtype=np.int64) * step_ns
    n_params = 100
    n = n_allocs - n_params
    # parameters: made before the first step's ops, live for ever
    p_ts = T0 + np.arange(n_params, dtype=np.int64) * 1_000
    p_bytes = (2 ** rng.integers(12, 22, n_params)).astype(np.int64)
    # the rest: spread over the steps
    step = np.sort(rng.integers(0, n_steps, n))
    ts = starts[step] + 100_000 + rng.integers(0, step_ns - 2_000_000, n)
    order = np.argsort(ts, kind="stable")
    step, ts = step[order], ts[order]
    size = (2 ** rng.integers(9, 23, n)).astype(np.int64)       # 512 B .. 4 MiB
    mid = n_steps // 2
    spike = int(np.flatnonzero(step == mid)[len(np.flatnonzero(step == mid)) // 2])
    size[spike] = 64 << 20
    in_step = ts - starts[step]
    bwd_phase = in_step > step_ns * 0.6
    kind = rng.random(n)
    activation = (kind < 0.2) & ~bwd_phase
    leaked = kind > 0.999
    life = np.where(activation, step_ns * 0.8 - in_step, rng.exponential(300_000, n)).astype(np.int64)
    life = np.clip(life, 1_000, None)
    life[spike] = 2_000_000
    free_ts = ts + life
    freed = ~leaked
    ops = [f"aten::{o}" for o in ("empty", "addmm", "mm", "mul", "add", "gelu", "softmax", "_to_copy", "randn",
                                 "native_layer_norm", "clone", "cat", "zeros", "copy_", "sum")]
    op_ids = strings.many(ops)
    top_ids = strings.many(ops[1:] + ["aten::linear", "Optimizer.step#Adam.step"])
    module_ids = strings.many([""] + [f"model.layers.{i}.{m}" for i in range(24) for m in ("self_attn", "mlp", "norm")])
    shape_ids = strings.many([f"[{a}, {b}]" for a, b in rng.integers(1, 4096, (500, 2))])
    dtype_ids = strings.many(["float32", "bfloat16", "int64"])
    dev = strings("cpu")
    a_op = rng.choice(op_ids, n)
    a_top = rng.choice(top_ids, n)
    a_mod = np.where(activation, rng.choice(module_ids[1:], n), rng.choice(module_ids, n))
    a_stack = rng.integers(1, 201, n).astype(np.int32)
    a_shape = rng.choice(shape_ids, n)
    a_dtype = rng.choice(dtype_ids, n)
    addr = 0x7F00_0000_0000 + np.arange(n_allocs, dtype=np.int64) * 4096 * 1024
    # events: parameter allocs, allocs, frees (by ts)
    ev_ts = np.concatenate([p_ts, ts, free_ts[freed]])
    ev = {
        "ts": ev_ts,
        "alloc_ts": np.concatenate([p_ts, ts, ts[freed]]),
        "addr": np.concatenate([addr[:n_params], addr[n_params:], addr[n_params:][freed]]),
        "bytes": np.concatenate([p_bytes, size, -size[freed]]),
        "device": np.full(len(ev_ts), dev, np.int32),
        "tid": np.full(len(ev_ts), MAIN_TID, np.int64),
        "op": np.concatenate([np.full(n_params, op_ids[0]), a_op, rng.choice(op_ids, int(freed.sum()))]),
        "top_op": np.concatenate([np.full(n_params, op_ids[0]), a_top, a_top[freed]]),
        "module": np.concatenate([np.zeros(n_params, np.int32), a_mod, a_mod[freed]]),
        "stack": np.concatenate([np.ones(n_params, np.int32), a_stack, a_stack[freed]]),
        "shape": np.concatenate([np.full(n_params, shape_ids[0]), a_shape, a_shape[freed]]),
        "dtype": np.concatenate([np.full(n_params, dtype_ids[0]), a_dtype, a_dtype[freed]]),
        "bwd": np.concatenate([np.zeros(n_params, bool), bwd_phase, (activation | bwd_phase)[freed]]),
        "kind": np.concatenate([np.zeros(n_params + n, np.int8), np.ones(int(freed.sum()), np.int8)]),
    }
    order = np.argsort(ev["ts"], kind="stable")
    ev = {k: v[order] for k, v in ev.items()}
    ev["total_allocated"] = np.cumsum(ev["bytes"])
    ev["total_reserved"] = np.zeros(len(ev_ts), np.int64)
    ev["grad"] = np.zeros(len(ev_ts), bool)
    rank_meta, run_meta = _meta()
    writer = RankWriter(run_dir / "rank-00000", rank_meta)
    write_run_meta(run_dir, run_meta)
    writer.append("threads", {"tid": np.array([MAIN_TID], np.int64), "name": strings.many(["MainThread"])})
    writer.append("frames", frames_cols)
    writer.append("stacks", stacks_cols)
    ends = starts + step_ns
    bounds = np.searchsorted(ev["ts"], ends, side="right")
    cat_param = strings("parameter")
    op_names = strings.many(["aten::linear", "aten::addmm", "aten::relu", "aten::mse_loss"])
    lo = 0
    for s in range(n_steps):
        hi = int(bounds[s])
        writer.append("memory_events", {k: v[lo:hi] for k, v in ev.items()})
        live = int(ev["total_allocated"][hi - 1]) if hi else 0
        peak = int(ev["total_allocated"][lo:hi].max()) if hi > lo else live
        writer.append("memory_steps", {"step": np.array([s], np.int32), "ts": np.array([ends[s]], np.int64),
                                       "device": np.array([dev], np.int32), "live": np.array([live], np.int64),
                                       "peak": np.array([peak], np.int64), "allocated": np.array([live], np.int64),
                                       "reserved": np.array([0], np.int64)})
        writer.append("memory_tensors", {
            "ts": np.full(n_params, ends[s], np.int64), "step": np.full(n_params, s, np.int32),
            "addr": addr[:n_params], "device": np.full(n_params, dev, np.int32), "bytes": p_bytes,
            "category": np.full(n_params, cat_param, np.int32), "shape": np.full(n_params, shape_ids[0], np.int32),
            "dtype": np.full(n_params, dtype_ids[0], np.int32)})
        k = 8  # a few ops per step, so the run has an op timeline too
        o_ts = starts[s] + 100_000 + np.arange(k, dtype=np.int64) * (step_ns // (k + 1))
        writer.append("ops", {"ts": o_ts, "dur": np.full(k, step_ns // (k + 2), np.int64),
                              "tid": np.full(k, MAIN_TID, np.int64), "name": rng.choice(op_names, k),
                              "module": np.zeros(k, np.int32), "stack": np.ones(k, np.int32),
                              "shapes": np.zeros(k, np.int32), "dtypes": np.zeros(k, np.int32),
                              "devices": np.full(k, dev, np.int32), "seq": np.arange(k, dtype=np.int64),
                              "fwd_tid": np.zeros(k, np.int64), "bwd": np.zeros(k, bool),
                              "depth": np.zeros(k, np.int16), "recompute": np.zeros(k, bool)})
        writer.append("steps", {"step": np.array([s], np.int32), "ts": np.array([starts[s]], np.int64),
                                "dur": np.array([step_ns], np.int64), "active": np.array([True]),
                                "complete": np.array([True])})
        if s == 0:
            writer.append("strings", strings.columns())
        writer.compact(s + 1, {"dropped": {}, "written": {"ops": (s + 1) * k}, "cap_reached_at_step": None})
        lo = hi
    writer.close(n_steps, {"dropped": {}, "written": {"ops": n_steps * 8}, "cap_reached_at_step": None})


# ---------------------------------------------------------------------------------- measuring

def _hwm_gb(pid: int) -> tuple[float, float]:
    """(VmHWM, VmRSS) of a process in GB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            k, v = line.split(":")
            vals[k] = int(v.split()[0]) * 1024 / 1e9
    return vals["VmHWM"], vals["VmRSS"]


_STATE_JS = """() => {
    if (window.__npStates) return;
    window.__npStates = [];
    const app = document.querySelector('[data-testid="stApp"]');
    new MutationObserver(() => window.__npStates.push([performance.now(), app.getAttribute('data-test-script-state')]))
        .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""
_DONE_JS = """(since) => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (since !== null && !(window.__npStates || []).some(([t, s]) => t >= since && s === 'running')) return false;
    if (document.querySelector('[data-testid="stSkeleton"], [data-testid="stStatusWidget"]')) return false;
    if (![...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(e => e.querySelector('.main-svg')))
        return false;
    if (!document.querySelector('[data-testid="stMain"] h1')) return false;
    return performance.now();
}"""


def _launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)


def measure_overview(run_dir: Path, timeout_s: float) -> dict:
    from playwright.sync_api import sync_playwright

    from neuron_prof.viewer.server import start
    proc, url = start(run_dir, quiet=True)
    try:
        with sync_playwright() as p:
            browser = _launch(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(timeout_s * 1000)
            t0 = time.perf_counter()
            page.goto(f"{url}/", wait_until="domcontentloaded")
            page.locator('[data-testid="stMain"] h1', has_text="Overview").wait_for(state="visible")
            t_title = time.perf_counter() - t0
            page.locator('[data-testid="stMetric"]').nth(4).wait_for(state="visible")
            t_metrics = time.perf_counter() - t0
            page.locator('[data-testid="stMain"] h3', has_text="Findings").wait_for(state="visible")
            t_findings = time.perf_counter() - t0
            page.wait_for_function(_DONE_JS, arg=None, polling=50)
            t_done = time.perf_counter() - t0
            errors = page.locator('[data-testid="stException"]').all_inner_texts()
            metrics = page.locator('[data-testid="stMetric"]').all_inner_texts()
            # a second visitor: the cached summary
            page2 = browser.new_page(viewport={"width": 1400, "height": 900})
            t1 = time.perf_counter()
            page2.goto(f"{url}/", wait_until="domcontentloaded")
            page2.locator('[data-testid="stMetric"]').nth(4).wait_for(state="visible")
            page2.wait_for_function(_DONE_JS, arg=None, polling=50)
            t_warm = time.perf_counter() - t1
            browser.close()
        hwm, rss = _hwm_gb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"title_s": round(t_title, 2), "metrics_s": round(t_metrics, 2), "findings_s": round(t_findings, 2),
            "rendered_s": round(t_done, 2),
            "second_visit_s": round(t_warm, 2), "server_peak_rss_gb": round(hwm, 2), "server_rss_after_gb": round(rss, 2),
            "metrics": [" ".join(m.split()) for m in metrics], "exceptions": errors}


def _drop_summary(run_dir: Path) -> None:
    """The run as a capture without a stored summary leaves it (readers store one when they compute it)."""
    from neuron_prof.reports.stored import SUMMARY_FILE
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)


def _summary_stamp(run_dir: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the stored summary: a reader that computed the summary rewrites it."""
    from neuron_prof.reports.stored import SUMMARY_FILE
    try:
        st = (run_dir / SUMMARY_FILE).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _timed(cmd: list[str]) -> dict:
    """Wall seconds and peak RSS (GB) of ``cmd`` as a fresh process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    return {"s": round(time.perf_counter() - t, 2), "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 2)}


def store_summary_cost(run_dir: Path) -> dict:
    """``stored.store_summary`` as the end of a capture calls it, in a fresh process: the
    cost a capture pays to give the viewer its first open."""
    _drop_summary(run_dir)
    code = ("import sys; from neuron_prof.reports.stored import store_summary; "
            "sys.exit(0 if store_summary(sys.argv[1]) else 3)")
    return _timed([sys.executable, "-c", code, str(run_dir)])


def measure_report(run_dir: Path) -> dict:
    """``neuron-prof report RUN --json``: without a stored summary (it computes and stores one),
    then with it."""
    _drop_summary(run_dir)
    cmd = [sys.executable, "-m", "neuron_prof", "report", str(run_dir), "--json"]
    computed = _timed(cmd)
    before = _summary_stamp(run_dir)
    stored = _timed(cmd)
    used = before is not None and _summary_stamp(run_dir) == before  # a report that computed it stores it again
    return {"computed": computed, "stored": {**stored, "used": used}}


def _select(page, label: str, option: str, timeout_s: float) -> float:
    """Pick ``option`` in the selectbox labelled ``label``; seconds until the rerun is over and
    its charts are drawn."""
    combo = page.get_by_role("combobox", name=label, exact=True).first
    combo.click()
    combo.fill(option)  # filters the list (long lists are virtualised)
    opt = page.get_by_role("option", name=option, exact=True)
    opt.wait_for(state="visible")
    page.evaluate(_STATE_JS)
    since = page.evaluate("() => performance.now()")
    opt.click()
    end = page.wait_for_function(_DONE_JS, arg=since, polling=50, timeout=timeout_s * 1000).json_value()
    return (end - since) / 1000


def measure_memory(run_dir: Path, n_steps: int, timeout_s: float) -> dict:
    from playwright.sync_api import sync_playwright

    from neuron_prof.viewer.server import start
    proc, url = start(run_dir, quiet=True)
    out: dict = {}
    try:
        with sync_playwright() as p:
            browser = _launch(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(timeout_s * 1000)
            t0 = time.perf_counter()
            page.goto(f"{url}/memory", wait_until="domcontentloaded")
            page.locator('[data-testid="stMain"] h1', has_text="Memory").wait_for(state="visible")
            t_title = time.perf_counter() - t0
            page.wait_for_function(_DONE_JS, arg=None, polling=50)
            out["first_load_s"] = round(time.perf_counter() - t0, 2)
            out["first_load_title_s"] = round(t_title, 2)
            mid, other = n_steps // 2, n_steps // 4
            steps_tried = []
            for label, option in (("range", f"step {mid}"), ("range", f"step {other}"), ("range", "whole capture"),
                                  ("by", "category"), ("by", "module"), ("from the end of step", str(other)),
                                  ("to the end of step", str(mid))):
                try:
                    steps_tried.append({"select": f"{label} = {option}",
                                        "s": round(_select(page, label, option, timeout_s), 2)})
                except Exception as exc:  # a page being rewritten may rename a widget: say so, go on
                    steps_tried.append({"select": f"{label} = {option}", "error": str(exc).splitlines()[0][:200]})
                    page.keyboard.press("Escape")
            out["interactions"] = steps_tried
            out["exceptions"] = page.locator('[data-testid="stException"]').all_inner_texts()
            browser.close()
        hwm, rss = _hwm_gb(proc.pid)
        out["server_peak_rss_gb"], out["server_rss_after_gb"] = round(hwm, 2), round(rss, 2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


_PROFILE_CODE = r"""
import cProfile, io, json, pstats, resource, sys, time
import neuron_prof
from neuron_prof.reports.summary.build import summarize
path, top = sys.argv[1], int(sys.argv[2])
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
out = {}
t = time.perf_counter(); run = neuron_prof.load(path); out["load_s"] = time.perf_counter() - t; out["load_peak_gb"] = rss()
prof = cProfile.Profile()
t = time.perf_counter(); prof.enable(); ops = run.ops; prof.disable(); out["ops_s"] = time.perf_counter() - t
out["ops_peak_gb"] = rss(); out["ops_rows"] = len(ops); out["ops_frame_gb"] = ops.memory_usage(deep=False).sum() / 1e9
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top); out["ops_profile"] = s.getvalue()
prof = cProfile.Profile()
t = time.perf_counter(); prof.enable(); summary = summarize(run); prof.disable(); out["summarize_s"] = time.perf_counter() - t
out["summarize_peak_gb"] = rss()
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top); out["summarize_profile"] = s.getvalue()
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top); out["summarize_profile_self"] = s.getvalue()
from neuron_prof.reports.stored import load_summary, write_summary
t = time.perf_counter(); write_summary(run, summary); out["write_summary_s"] = time.perf_counter() - t
t = time.perf_counter(); back = load_summary(run); out["load_summary_s"] = time.perf_counter() - t
out["stored_summary_read_back"] = back == summary
print(json.dumps(out))
"""


def profile_ops_run(run_dir: Path, top: int = 30) -> dict:
    r = subprocess.run([sys.executable, "-c", _PROFILE_CODE, str(run_dir), str(top)], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10_000_000)
    ap.add_argument("--allocs", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--keep", type=Path, help="generate the runs here and keep them (reused when present)")
    ap.add_argument("--only", action="append", choices=("generate", "overview", "report", "memory", "profile"),
                    help="run only these parts (repeatable; default: all)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for one page render")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    parts = set(args.only or ("generate", "overview", "report", "memory", "profile"))
    root = args.keep or Path(tempfile.mkdtemp(prefix="viewer_speed_"))
    root.mkdir(parents=True, exist_ok=True)
    ops_run = root / f"ops_{args.ops}_{args.steps}"
    mem_run = root / f"allocs_{args.allocs}_{args.steps}"
    results: dict = {"ops": args.ops, "allocs": args.allocs, "steps": args.steps, "runs": str(root)}
    try:
        for run_dir, gen, n in ((ops_run, generate_ops_run, args.ops), (mem_run, generate_memory_run, args.allocs)):
            if not (run_dir / "rank-00000" / "manifest.jsonl").exists():
                t = time.perf_counter()
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                gen(run_dir, n, args.steps)
                size = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
                results[f"generate_{run_dir.name}"] = {"s": round(time.perf_counter() - t, 1), "mb": round(size / 1e6)}
                print(f"generated {run_dir} in {time.perf_counter() - t:.1f} s ({size / 1e6:.0f} MB)", flush=True)
        if "overview" in parts:
            # first as a run without a stored summary (the page computes it, and stores it), then
            # with the summary stored as the end of capture stores it
            for key, label in (("overview", "no stored summary"), ("overview_stored", "summary stored at capture end")):
                if key == "overview":
                    _drop_summary(ops_run)
                else:
                    c = results["store_summary"] = store_summary_cost(ops_run)
                    print(f"store_summary (capture end, fresh process): {c['s']} s, peak RSS {c['peak_rss_gb']} GB",
                          flush=True)
                before = _summary_stamp(ops_run)
                r = results[key] = measure_overview(ops_run, args.timeout)
                if key == "overview_stored":  # a page that computed it stores it again: then it was not used
                    r["stored_summary_used"] = _summary_stamp(ops_run) == before
                    if not r["stored_summary_used"]:
                        print("!! the page computed the summary: the stored one was stale (code edited meanwhile?)")
                print(f"overview ({args.ops:,} ops, {label}): title {r['title_s']} s, metrics {r['metrics_s']} s, "
                      f"findings {r['findings_s']} s (target {TARGETS[key + '_s']} s), rendered {r['rendered_s']} s; "
                      f"second visit {r['second_visit_s']} s; server peak RSS {r['server_peak_rss_gb']} GB "
                      f"(target {TARGETS['rss_gb']} GB)", flush=True)
        if "report" in parts:
            r = results["report"] = measure_report(ops_run)
            print(f"neuron-prof report --json ({args.ops:,} ops): computed {r['computed']['s']} s (peak "
                  f"{r['computed']['peak_rss_gb']} GB), stored {r['stored']['s']} s "
                  f"(peak {r['stored']['peak_rss_gb']} GB)"
                  + ("" if r["stored"]["used"] else " (!! the stored summary was not used)"), flush=True)
        if "memory" in parts:
            r = results["memory"] = measure_memory(mem_run, args.steps, args.timeout)
            print(f"memory page ({args.allocs:,} allocations): first load {r['first_load_s']} s; server peak RSS "
                  f"{r['server_peak_rss_gb']} GB", flush=True)
            for i in r["interactions"]:
                print(f"  {i['select']}: " + (f"{i['s']} s (target {TARGETS['memory_interaction_s']} s)"
                                              if "s" in i else f"FAILED {i['error']}"), flush=True)
        if "profile" in parts:
            r = results["profile"] = profile_ops_run(ops_run)
            print(f"in-process ({args.ops:,} ops): load {r['load_s']:.1f} s (peak {r['load_peak_gb']:.2f} GB), "
                  f".ops {r['ops_s']:.1f} s (peak {r['ops_peak_gb']:.2f} GB, frame {r['ops_frame_gb']:.2f} GB), "
                  f"summarize {r['summarize_s']:.1f} s (peak {r['summarize_peak_gb']:.2f} GB); stored summary: "
                  f"written in {r['write_summary_s']:.3f} s, read back in {r['load_summary_s']:.3f} s"
                  + ("" if r["stored_summary_read_back"] else " (NOT read back: stale or refused)"))
            print("--- run.ops, by cumulative time\n" + r["ops_profile"])
            print("--- summarize(run), by cumulative time\n" + r["summarize_profile"])
            print("--- summarize(run), by own time\n" + r["summarize_profile_self"])
    finally:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
