"""A run of 256 ranks at scale: written by the real writer, then loaded and reported.

    .venv/bin/python benchmarks/scale_ranks.py [--ranks 256] [--steps 100] [--keep DIR] [--profile] [--json OUT]

Generation (synthetic, as a capture writes it): per fake rank one ``neuron_prof.store.writer.RankWriter``
and the session's interning (``neuron_prof.store.interner.Interner``: strings, frames, stacks), the
collectives and step rows journaled step by step with a commit per step, compacted every
COMPACT_EVERY steps (a capture compacts every 2 s; a step here lasts ~120 ms), closed with a
manifest. The job it describes:

- hosts of 8 ranks, each host's CLOCK_MONOTONIC off by up to 50 ms; per rank a ``clock_sync`` row
  at start and end (same_clock on rank 0's host; elsewhere the offset estimated within rtt/2, with
  drift), ``groups``: the world (``default_pg``) and the rank's host-local tensor-parallel group;
- per step 20 collectives per rank: 8 tensor-parallel all-reduces of 4 MiB in forward, 8 in
  backward, 4 gradient all-reduces of 25 MiB over the world in backward; simulated in order, each
  rank arriving after its own compute (jittered) and every member leaving when the last one has
  arrived and the bytes have moved (ring all-reduce at 10 GB/s bus bandwidth), so waits cascade
  as in a real job;
- one straggler: rank STRAGGLER (modulo --ranks) arrives STRAGGLER_MS late at its first forward collective in every
  10th step (steps 5, 15, ...).

Measurement, each in a fresh process (wall time; peak RSS from ``os.wait4``'s rusage of that
child): ``neuron_prof.load`` and the collective tables (``run.collectives``,
``collective_groups``, ``clock_sync``), ``neuron_prof.reports.summary.build.summarize`` and ``render_text``
(with the collectives section once the analysis layer provides it), ``json.dumps`` of the summary;
and the CLI as a user runs it, ``neuron-prof report RUN`` and ``neuron-prof report RUN --json``.
Targets: <= 30 s and <= 4 GB. ``--profile`` adds cProfile's top functions of the in-process
measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing import get_context
from pathlib import Path

import numpy as np

RANKS_PER_HOST = 8
STRAGGLER = 137
STRAGGLER_MS = 40
COMPACT_EVERY = 16
TARGETS = {"seconds": 30.0, "rss_gb": 4.0}
T0 = 1_000_000_000_000
BUS_GBPS = 10.0
# one step's collectives: (op, group: "world" or "tp", bytes, in backward, source line, module)
PLAN = ([("all_reduce", "tp", 4 << 20, False, 41, f"model.layers.{k}.mlp") for k in range(8)]
        + [("all_reduce", "tp", 4 << 20, True, 57, "") for _ in range(8)]
        + [("all_reduce", "world", 25 << 20, True, 57, "") for _ in range(4)])


# ---------------------------------------------------------------------------------- simulation

def simulate(ranks: int, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """True times (ns, one clock) of every collective: ``ready``/``done`` [rank, step, k], step
    starts and ends [rank, step]."""
    rng = np.random.default_rng(seed)
    tp = np.arange(ranks) // RANKS_PER_HOST
    world = np.zeros(ranks, dtype=np.int64)
    ready = np.zeros((ranks, steps, len(PLAN)), np.int64)
    done = np.zeros_like(ready)
    step_start = np.zeros((ranks, steps), np.int64)
    step_end = np.zeros_like(step_start)
    cur = np.full(ranks, T0, np.int64) + rng.integers(0, 200_000, ranks)
    for s in range(steps):
        step_start[:, s] = cur
        cur = cur + 2_000_000 + rng.integers(0, 300_000, ranks)  # data loading
        for k, (op, group, nbytes, bwd, _, _) in enumerate(PLAN):
            compute = 4_000_000 if k < 8 else 2_500_000 if k < 16 else 1_000_000
            arrive = cur + compute + rng.integers(-150_000, 150_000, ranks)
            if k == 0 and s % 10 == 5:
                arrive[STRAGGLER % ranks] += STRAGGLER_MS * 1_000_000
            members = tp if group == "tp" else world
            n = RANKS_PER_HOST if group == "tp" else ranks
            last = np.zeros(members.max() + 1, np.int64)
            np.maximum.at(last, members, arrive)
            transfer = int(2 * (n - 1) / n * nbytes / BUS_GBPS)  # ns: bytes / (GB/s)
            ready[:, s, k] = arrive
            done[:, s, k] = last[members] + transfer + rng.integers(0, 20_000, ranks)
            cur = done[:, s, k]
        cur = cur + 3_000_000 + rng.integers(0, 200_000, ranks)  # optimizer step
        step_end[:, s] = cur
    return {"ready": ready, "done": done, "step_start": step_start, "step_end": step_end}


def host_offsets(ranks: int, seed: int = 1) -> np.ndarray:
    """Each rank's clock minus the true clock (ns): one value per host, rank 0's host at 0."""
    hosts = (ranks + RANKS_PER_HOST - 1) // RANKS_PER_HOST
    off = np.random.default_rng(seed).integers(-50_000_000, 50_000_000, hosts)
    off[0] = 0
    return np.repeat(off, RANKS_PER_HOST)[:ranks]


# ---------------------------------------------------------------------------------- writing

_SIM: dict = {}


def _init_worker(sim: dict) -> None:
    _SIM.update(sim)


def write_rank(rank: int) -> None:
    from neuron_prof.store.schema import COLLECTIVE_STATUS, SCHEMA_VERSION
    from neuron_prof.store.interner import Interner
    from neuron_prof.store.writer import RankWriter, update_run_meta

    sim, run_dir, ranks, run_id = _SIM["sim"], Path(_SIM["run_dir"]), _SIM["ranks"], _SIM["run_id"]
    steps = sim["step_start"].shape[1]
    off = int(_SIM["offsets"][rank])
    rng = np.random.default_rng(1000 + rank)
    interner = Interner()
    host = f"host-{rank // RANKS_PER_HOST:03d}"
    meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "rank": rank, "world_size": ranks, "pid": 10_000 + rank,
            "hostname": host, "device": "cpu", "torch_version": "2.13.0+cpu", "python": sys.version.split()[0],
            "clock_offset_ns": 1_700_000_000_000_000_000 - T0 - off, "start_ns": T0 + off,
            "collectors": ["collectives"], "schedule": None, "max_buffered_events": 2_000_000,
            "max_events": 50_000_000, "max_bytes": 256 << 20, "stepless": False}
    writer = RankWriter(run_dir / f"rank-{rank:05d}", meta)
    if rank == 0:
        update_run_meta(run_dir, run_id, {
            "schema_version": SCHEMA_VERSION, "neuron_prof_version": "bench", "run_id_scope": "command",
            "command": ["torchrun", "--nnodes", str(ranks // RANKS_PER_HOST), "train.py"], "cwd": "/work/train",
            "torch_version": "2.13.0+cpu", "device": "cpu", "world_size": ranks,
            "start_time_ns": 1_700_000_000_000_000_000, "hostname": host}, replace=True)
    tp_name = str(1 + rank // RANKS_PER_HOST)
    group_of = {"world": interner.string("0"), "tp": interner.string(tp_name)}
    tp_members = list(range(rank - rank % RANKS_PER_HOST, min(ranks, rank - rank % RANKS_PER_HOST + RANKS_PER_HOST)))
    k = len(PLAN)
    op = np.array([interner.string(p[0]) for p in PLAN], np.int32)
    call = np.full(k, interner.string("c10d::allreduce_"), np.int32)
    group = np.array([group_of[p[1]] for p in PLAN], np.int32)
    nbytes = np.array([p[2] for p in PLAN], np.int64)
    bwd = np.array([p[3] for p in PLAN], bool)
    module = np.array([interner.string(p[5]) for p in PLAN], np.int32)
    stack = np.array([interner.stack([("/work/train/train.py", "train_step", p[4]), ("/work/train/train.py", "main",
                                                                                   120)]) for p in PLAN], np.int32)
    dtype = np.full(k, interner.string("bfloat16"), np.int32)
    completed = np.full(k, COLLECTIVE_STATUS.index("completed"), np.int8)
    seq_per_step = np.array([np.sum([q[1] == p[1] for q in PLAN[:i + 1]]) for i, p in enumerate(PLAN)], np.int64)
    per_group = {g: sum(p[1] == g for p in PLAN) for g in ("world", "tp")}
    writer.append("groups", {
        "group": np.array([group_of["world"], group_of["tp"]], np.int32),
        "desc": np.array([interner.string("default_pg"), interner.string("tp")], np.int32),
        "backend": np.full(2, interner.string("nccl"), np.int32),
        "size": np.array([ranks, len(tp_members)], np.int32),
        "group_rank": np.array([rank, rank % RANKS_PER_HOST], np.int32),
        "ranks": [list(range(ranks)), tp_members]})
    writer.append("clock_sync", _clock_rows(rank, off, sim, rng, interner))
    written = 0
    for s in range(steps):
        ready, done = sim["ready"][rank, s] + off, sim["done"][rank, s] + off
        dur = rng.integers(15_000, 60_000, k)
        seq = seq_per_step + np.array([per_group[p[1]] * s for p in PLAN], np.int64)
        writer.append("collectives", {
            "ts": ready, "dur": dur, "done": done, "tid": np.where(bwd, 20_000 + rank, 10_000 + rank).astype(np.int64),
            "op": op, "call": call, "group": group, "seq": seq, "count": np.ones(k, np.int32), "bytes": nbytes,
            "out_bytes": nbytes, "dtype": dtype, "peer": np.full(k, -1, np.int32), "async_op": bwd,
            "status": completed, "module": module, "stack": stack, "bwd": bwd})
        writer.append("steps", {"step": np.array([s], np.int32), "ts": sim["step_start"][rank, s:s + 1] + off,
                                "dur": sim["step_end"][rank, s:s + 1] - sim["step_start"][rank, s:s + 1],
                                "active": np.array([True]), "complete": np.array([True])})
        for table, cols in interner.take_new().items():
            writer.append(table, cols)
        written += k
        counters = {"dropped": {}, "written": {"collectives": written}, "cap_reached_at_step": None}
        (writer.compact if (s + 1) % COMPACT_EVERY == 0 else writer.commit)(s + 1, counters)
    writer.close(steps, counters)


def _clock_rows(rank: int, off: int, sim: dict, rng: np.random.Generator, interner) -> dict:
    """Start and end measurements: rank 0's time = ts + offset, the estimate within rtt/2, the
    end one drifted by up to 30 µs; ranks on rank 0's host read one clock."""
    same = rank < RANKS_PER_HOST
    ts = np.array([sim["step_start"][rank, 0], sim["step_end"][rank, -1]], np.int64) + off
    rtt = np.zeros(2, np.int64) if rank == 0 else rng.integers(60_000, 200_000, 2)
    drift = np.array([0, 0 if same else int(rng.integers(-30_000, 30_000))], np.int64)
    err = (rng.random(2) - 0.5) * rtt
    return {"ts": ts, "offset": (-off + drift + err).astype(np.int64), "rtt": rtt.astype(np.int64),
            "same_clock": np.full(2, same), "phase": np.array([interner.string("start"), interner.string("end")],
                                                              np.int32)}


def generate(run_dir: Path, ranks: int, steps: int) -> float:
    t0 = time.perf_counter()
    sim = {"sim": simulate(ranks, steps), "offsets": host_offsets(ranks), "run_dir": str(run_dir),
           "ranks": ranks, "run_id": uuid.uuid4().hex}
    run_dir.mkdir(parents=True, exist_ok=True)
    with get_context("fork").Pool(min(os.cpu_count() or 1, 4), initializer=_init_worker, initargs=(sim,)) as pool:
        pool.map(write_rank, range(ranks), chunksize=8)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------- measuring

def measure_in_process(run_dir: Path, profile: bool) -> dict:
    """Wall time of each phase, in this (fresh) process; printed as JSON for the parent."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    t = {}
    t0 = time.perf_counter()
    import neuron_prof
    from neuron_prof.reports.summary.build import summarize
    from neuron_prof.reports.summary.text import render_text
    t["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = neuron_prof.load(run_dir)
    t["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    coll = run.collectives
    _ = run.collective_groups, run.clock_sync
    t["collectives_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = summarize(run)
    t["summarize_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    text = render_text(summary)
    t["render_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dumped = json.dumps(summary.to_json())
    t["json_s"] = time.perf_counter() - t0
    t["rows"] = len(coll)
    t["ranks"] = len(run.ranks)
    t["collectives_section"] = summary.collectives.captured
    t["report_lines"] = text.count("\n")
    t["json_bytes"] = len(dumped)
    if prof:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
        t["profile"] = out.getvalue()
    return t


def in_child(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; its result, wall seconds and peak RSS in GB (its own rusage, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()), wall, usage.ru_maxrss / 1024 ** 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--keep", type=Path, help="write the run here and keep it (reused if it exists)")
    p.add_argument("--profile", action="store_true", help="cProfile the in-process measurement")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's side
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure_in_process(args.measure, args.profile)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        gen = generate(run_dir, args.ranks, args.steps) if not run_dir.exists() else None
        disk = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
        res, wall, rss = in_child([sys.executable, __file__, "--measure", str(run_dir)]
                                  + (["--profile"] if args.profile else []))
        if res.returncode:
            sys.exit(res.stderr[-3000:])
        phases = json.loads(res.stdout)
        cli = {}
        for name, extra in (("report", []), ("report --json", ["--json"])):
            r, w, m = in_child([sys.executable, "-m", "neuron_prof", "report", str(run_dir), *extra])
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            cli[name] = {"seconds": w, "rss_gb": m}
    profile = phases.pop("profile", None)
    figures = {"ranks": args.ranks, "steps": args.steps, "collectives_per_step": len(PLAN), "rows": phases["rows"],
               "generate_s": gen, "disk_mb": disk / 1e6, "in_process": {**phases, "wall_s": wall, "rss_gb": rss},
               "cli": cli, "targets": TARGETS}
    print(f"{args.ranks} ranks x {args.steps} steps x {len(PLAN)} collectives = {phases['rows']:,} rows, "
          f"{disk / 1e6:.1f} MB on disk" + (f", written in {gen:.1f} s" if gen is not None else " (kept run)"))
    print(f"  in one process: load {phases['load_s']:.2f} s, collectives tables {phases['collectives_s']:.2f} s, "
          f"summarize {phases['summarize_s']:.2f} s (collectives section: "
          f"{'yes' if phases['collectives_section'] else 'not yet'}), render {phases['render_s']:.2f} s, "
          f"json {phases['json_s']:.2f} s; whole process {wall:.1f} s, peak RSS {rss:.2f} GB")
    for name, c in cli.items():
        ok = c["seconds"] <= TARGETS["seconds"] and c["rss_gb"] <= TARGETS["rss_gb"]
        print(f"  neuron-prof {name}: {c['seconds']:.1f} s, peak RSS {c['rss_gb']:.2f} GB "
              f"({'within' if ok else 'OVER'} the {TARGETS['seconds']:.0f} s / {TARGETS['rss_gb']:.0f} GB targets)")
    if profile:
        print(profile)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
