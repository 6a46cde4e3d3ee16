"""The collectives analyses (analysis.clock, collective_match, stragglers, comm_cost): unit
tests on small hand-made tables (expectations worked out by hand), and real 2-rank gloo jobs
started with torch.multiprocessing: DDP in which rank 1 sleeps before ``loss.backward()`` in
chosen steps (the straggler, its steps and the wait it caused come out of the analyses, the
report and its JSON), a different op on each rank at one seq (a mismatch) and a rank that never
joins its peer's all-reduce, killed with SIGKILL (a hang)."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import cli, free_port, kill_group, line_of, run_bounded, stuck_collectives, write_script
from neuron_prof.analysis import clock, collective_match, comm_cost, stragglers
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.steps import time_split
from neuron_prof.reports.findings import steps_text

MS = 1_000_000


# ---------------------------------------------------------------- hand-made tables

def _coll(rows: list[dict]) -> pd.DataFrame:
    """Collective rows as Run.collectives has them; unspecified fields get plain defaults."""
    base = {"dur": 1000, "done": -1, "tid": 1, "op": "all_reduce", "call": "c10d::allreduce_", "group": "0",
            "group_desc": "default_pg", "group_size": 2, "count": 1, "bytes": 4096, "out_bytes": 4096,
            "dtype": "float32", "peer": -1, "async_op": False, "status": "completed", "module": "",
            "source": "train.py:9", "user_source": "train.py:9", "bwd": True, "step": 0}
    df = pd.DataFrame([{**base, **r} for r in rows])
    for c in ("op", "group", "dtype", "status", "source"):
        df[c] = df[c].astype("category")
    return df


def _steps(durs: dict[int, list[int]]) -> pd.DataFrame:
    """step_kinds rows: step 0 of each rank is warm-up, the rest steady."""
    rows = [{"rank": r, "step": i, "ts": 0, "dur": d, "active": True, "complete": True, "compile_ns": 0,
             "warmup": i == 0, "steady": i > 0} for r, ds in durs.items() for i, d in enumerate(ds)]
    return pd.DataFrame(rows)


def _one_clock(ranks):
    return clock.clock_offsets(pd.DataFrame(), ranks)


def test_clock_offsets_drift_one_sample_same_clock_and_none():
    cs = pd.DataFrame([
        {"rank": 1, "ts": 1_000, "offset": 5_000, "rtt": 200, "same_clock": False, "phase": "start"},
        {"rank": 1, "ts": 1_001_000, "offset": 7_000, "rtt": 300, "same_clock": False, "phase": "end"},
        {"rank": 2, "ts": 500, "offset": -40, "rtt": 10, "same_clock": False, "phase": "start"},
        {"rank": 3, "ts": 500, "offset": 123_456, "rtt": 10, "same_clock": True, "phase": "start"},
    ])
    off = clock.clock_offsets(cs, [0, 1, 2, 3, 4]).set_index("rank")
    assert off.loc[1, "rtt"] == 300 and off.loc[1, "measured"] and not off.loc[1, "same_clock"]
    assert off.loc[3, "same_clock"] and off.loc[3, "offset_start"] == 0  # one clock: 0, whatever the estimate
    assert not off.loc[4, "measured"] and off.loc[4, "offset_start"] == 0
    ts = np.array([1_000, 501_000, 1_001_000, 2_001_000, 10, 10, 10, 10, -1])
    ranks = np.array([1, 1, 1, 1, 0, 2, 3, 4, 1])
    # rank 1 drifts 2000 ns over 1 ms: +5000 at its start sample, +6000 half way, +9000 1 ms after the end
    assert list(clock.to_rank0(ts, ranks, off.reset_index())) == [
        6_000, 507_000, 1_008_000, 2_010_000, 10, -30, 10, 10, -1]


def test_matched_joins_ranks_on_rank0s_clock_and_names_a_missing_rank():
    offsets = clock.clock_offsets(pd.DataFrame([{"rank": 1, "ts": 0, "offset": 1_000, "rtt": 10, "same_clock": False,
                                             "phase": "start"}]), [0, 1, 2])
    coll = _coll([
        {"rank": 0, "seq": 1, "ts": 10_000, "done": 50_000},
        {"rank": 1, "seq": 1, "ts": 29_000, "done": 49_000},  # 30_000 on rank 0's clock: the last arrival
        {"rank": 2, "seq": 1, "ts": 20_000, "done": 52_000},
        {"rank": 0, "seq": 2, "ts": 60_000, "status": "in_flight"},
        {"rank": 1, "seq": 2, "ts": 60_000, "status": "in_flight"},
    ]).assign(group_size=3)
    groups = pd.DataFrame([{"rank": r, "group": "0", "ranks": [0, 1, 2]} for r in range(3)])
    m = collective_match.matched(coll, offsets, groups).set_index("seq")
    assert m.loc[1, "ranks_seen"] == [0, 1, 2] and m.loc[1, "missing"] == []
    assert (m.loc[1, "first_arrival"], m.loc[1, "last_arrival"], m.loc[1, "last_rank"]) == (10_000, 30_000, 1)
    assert m.loc[1, "wait_ns"] == 20_000
    assert (m.loc[1, "end"], m.loc[1, "transfer_ns"]) == (52_000, 22_000) and m.loc[1, "complete"]
    assert m.loc[2, "missing"] == [2] and not m.loc[2, "complete"]
    assert (m.loc[2, "end"], m.loc[2, "transfer_ns"]) == (-1, -1)

    w = collective_match.waits(coll, m.reset_index(), offsets)
    assert list(w.loc[w["seq"] == 1, "wait_ns"]) == [20_000, 0, 10_000]
    assert set(w.loc[w["seq"] == 1, "late_rank"]) == {1}

    stuck = collective_match.in_flight(coll, m.reset_index())
    assert list(stuck["rank"]) == [0, 1] and all(x == [2] for x in stuck["missing"])
    assert all(x == [0, 1] for x in stuck["arrived"])

    mm = collective_match.mismatches(coll, groups)
    assert list(zip(mm["seq"], mm["kind"], mm["ranks"])) == [(2, "missing", [2])]
    assert mm["detail"].iloc[0] == "rank 0 issued all_reduce of 4.0 KiB float32; rank 2 never did"


def test_wait_made_by_neuron_profs_own_step_boundary_work_is_not_the_ranks():
    steps = pd.DataFrame([{"rank": r, "step": i, "ts": t, "dur": 1000, "active": True, "complete": True}
                          for r, starts in {0: (0, 1500), 1: (0, 5000)}.items() for i, t in enumerate(starts)])
    coll = _coll([{"rank": 0, "seq": 1, "ts": 2000, "step": 1}, {"rank": 1, "seq": 1, "ts": 5500, "step": 1}])
    (m,) = collective_match.matched(coll, _one_clock([0, 1]), steps=steps).to_dict("records")
    # rank 1 flushed step 0 from 1000 to 5000: 3000 of rank 0's 3500 ns wait is the profiler's
    assert (m["last_rank"], m["wait_ns"], m["own_ns"]) == (1, 3500, 3000)


def test_a_rank_whose_capture_began_later_is_not_missing_earlier_collectives():
    coll = _coll([{"rank": 0, "seq": 1, "ts": 0}, {"rank": 0, "seq": 2, "ts": 10}, {"rank": 1, "seq": 2, "ts": 10}])
    m = collective_match.matched(coll, _one_clock([0, 1])).set_index("seq")
    assert m.loc[1, "missing"] == [] and collective_match.mismatches(coll).empty


def test_mismatches_name_a_size_an_op_and_a_dtype():
    coll = _coll([
        {"rank": 0, "seq": 1, "ts": 0, "bytes": 8192}, {"rank": 1, "seq": 1, "ts": 0, "bytes": 4096},
        {"rank": 0, "seq": 2, "ts": 9, "op": "all_gather"}, {"rank": 1, "seq": 2, "ts": 9},
        {"rank": 0, "seq": 3, "ts": 19}, {"rank": 1, "seq": 3, "ts": 19, "dtype": "bfloat16"},
        {"rank": 0, "seq": 4, "ts": 29, "op": "all_to_all", "bytes": 100}, {"rank": 1, "seq": 4, "ts": 29,
                                                                            "op": "all_to_all", "bytes": 300},
    ])
    mm = collective_match.mismatches(coll)
    # two ranks that disagree: the lowest rank's collective is the reference; all_to_all sizes may differ
    assert list(zip(mm["seq"], mm["kind"], mm["ranks"])) == [(1, "bytes", [1]), (2, "op", [1]), (3, "dtype", [1])]
    assert mm["detail"].iloc[0] == ("rank 1 issued all_reduce of 4.0 KiB float32, rank 0 issued all_reduce of "
                                    "8.0 KiB float32 at the same seq")


def test_overlap_counts_innermost_ops_on_any_thread_and_never_a_collective():
    coll = _coll([{"rank": 0, "seq": 1, "ts": 100, "dur": 5, "done": 200, "step": 0},
                  {"rank": 0, "seq": 2, "ts": 150, "dur": 5, "done": 260, "step": 0}])
    ops = pd.DataFrame([
        {"rank": 0, "ts": 40, "dur": 80, "tid": 1, "name": "aten::mm", "depth": 0},  # 100..120 overlaps
        {"rank": 0, "ts": 100, "dur": 100, "tid": 9, "name": "gloo:all_reduce", "depth": 0},  # not compute
        {"rank": 0, "ts": 230, "dur": 100, "tid": 2, "name": "aten::add", "depth": 0},  # 230..260 overlaps
        {"rank": 0, "ts": 240, "dur": 10, "tid": 2, "name": "aten::fill_", "depth": 1},  # inside: once
        {"rank": 0, "ts": 150, "dur": 50, "tid": 3, "name": "DistributedDataParallel.forward", "depth": 0},
        {"rank": 0, "ts": 155, "dur": 5, "tid": 3, "name": "aten::addmm", "depth": 1},  # 155..160 computes
        {"rank": 0, "ts": 165, "dur": 2, "tid": 3, "name": "c10d::broadcast_", "depth": 1},  # then waits to 200
        {"rank": 0, "ts": 165, "dur": 1, "tid": 3, "name": "aten::empty", "depth": 2},  # inside: communication
    ]).assign(name=lambda d: d["name"].astype("category"))
    steps = pd.DataFrame([{"rank": 0, "step": 0, "ts": 0, "dur": 400, "active": True}])
    (row,) = comm_cost.overlap(coll, ops, steps).to_dict("records")
    # in collectives 100..260 = 160; compute within it 100..120 (mm), 155..160 (addmm), 240..250
    # (fill_, add's only child: add's own time is not counted) = 35
    assert (row["comm_ns"], row["overlapped_ns"], row["exposed_ns"], row["step_ns"]) == (160, 35, 125, 400)
    assert row["comm_share"] == pytest.approx(125 / 400)


def test_time_split_takes_communication_from_the_exposed_collective_time():
    steps = _steps({0: [0, 1000]}).iloc[1:]
    top = pd.DataFrame({"rank": [0, 0], "step": [1, 1], "tid": [1, 1], "dur": [500, 100]})
    comm = pd.DataFrame({"rank": [0], "step": [1], "dur": [100]})  # c10d op on the calling thread
    sync = pd.DataFrame({"rank": [], "step": [], "dur": []})
    exposed = pd.DataFrame({"rank": [0], "step": [1], "exposed_ns": [300]})
    (row,) = time_split(top, steps, sync, comm, exposed).to_dict("records")
    assert (row["compute_ms"], row["communication_ms"], row["idle_ms"]) == (500 / MS, 300 / MS, 200 / MS)
    (plain,) = time_split(top, steps, sync, comm).to_dict("records")
    assert (plain["communication_ms"], plain["idle_ms"]) == (100 / MS, 400 / MS)


def _straggled(late: dict[int, tuple[int, int]], n_steps: int = 9, step_ms: int = 100) -> tuple:
    """Two ranks, one all-reduce per step; in the steps of ``late`` the given rank arrives the
    given ns after the other, else rank 0 or 1 by 50-90 us of jitter."""
    rows = []
    for step in range(n_steps):
        rank, by = late.get(step, (step % 2, 50_000 + 5_000 * step))
        t = step * 200 * MS
        rows += [{"rank": rank, "seq": step, "step": step, "ts": t + by, "done": t + by + MS},
                 {"rank": 1 - rank, "seq": step, "step": step, "ts": t, "done": t + by + MS}]
    coll = _coll(rows)
    steps = _steps({0: [step_ms * MS] * n_steps, 1: [step_ms * MS] * n_steps})
    m = collective_match.matched(coll, _one_clock([0, 1]))
    return m, collective_match.waits(coll, m, _one_clock([0, 1])), steps


def test_the_straggler_needs_real_waiting_not_jitter():
    m, w, steps = _straggled({3: (1, 40 * MS), 5: (1, 30 * MS), 0: (0, 90 * MS)})
    per = stragglers.straggler_steps(w, steps)
    assert list(per["step"]) == list(range(1, 9))  # step 0 is warm-up: left out
    assert per.loc[per["significant"], ["step", "rank"]].values.tolist() == [[3, 1], [5, 1]]
    r = stragglers.stragglers(m, w, steps)
    assert r.iloc[0]["rank"] == 1 and r.iloc[0]["steps"] == [3, 5] and r.iloc[0]["times_last"] == 2
    # the noise floor: tops of the other steps 55..90 us, median 75, MAD 15 -> 75 + 3 x 1.4826 x 15 us
    assert per["threshold_ns"].iloc[0] == pytest.approx(10 * MS)  # SHARE of the 100 ms step is higher
    jitter = sum(50_000 + 5_000 * s for s in range(1, 9) if s not in (3, 5) and s % 2 == 1)
    assert r.iloc[0]["wait_caused_ns"] == 70 * MS + jitter
    assert r.set_index("rank").loc[0, "steps"] == [] and r.iloc[0]["share"] > 0.99
    # 5 ms is 5% of a step: below SHARE, so no step is significant however quiet the rest is
    m, w, steps = _straggled({4: (1, 5 * MS)})
    assert not stragglers.straggler_steps(w, steps)["significant"].any()


def test_steps_read_as_a_list():
    assert [steps_text(x) for x in ([4], [3, 6], [1, 3, 5])] == ["step 4", "steps 3 and 6", "steps 1, 3 and 5"]


def test_a_rank_late_in_every_step_is_named_in_every_step():
    m, w, steps = _straggled({s: (1, 30 * MS + s * 1000) for s in range(9)})
    assert stragglers.stragglers(m, w, steps).iloc[0]["steps"] == list(range(1, 9))


def test_bandwidth_uses_nccl_tests_bus_factors():
    coll = _coll([{"rank": r, "seq": 1, "ts": 0, "done": 1000, "op": op, "bytes": b, "out_bytes": o, "group_size": 4}
                  for r in range(4) for op, b, o in [("all_reduce", 1000, 1000)]]
                 + [{"rank": r, "seq": 2, "ts": 2000, "done": 4000, "op": "all_gather", "bytes": 500, "out_bytes": 2000,
                     "group_size": 4} for r in range(4)])
    bw = comm_cost.bandwidth(collective_match.matched(coll, _one_clock(range(4)))).set_index("op")
    assert bw.loc["all_reduce", "algbw"] == pytest.approx(1.0) and bw.loc["all_reduce", "busbw"] == pytest.approx(1.5)
    assert bw.loc["all_gather", "algbw"] == pytest.approx(1.0) and bw.loc["all_gather", "busbw"] == pytest.approx(0.75)
    g = comm_cost.group_bandwidth(bw.reset_index()).set_index("op")
    assert g.loc["all_reduce", "calls"] == 1 and g.loc["all_gather", "bytes"] == 2000
    # two all-reduces whose transfers overlap: the link moved both in the union of their times
    both = _coll([{"rank": r, "seq": q, "ts": 0, "done": 1000 + 500 * q} for r in range(2) for q in (1, 2)])
    g = comm_cost.group_bandwidth(comm_cost.bandwidth(collective_match.matched(both, _one_clock(range(2)))))
    assert (g.loc[0, "calls"], g.loc[0, "transfer_ns"]) == (2, 2000)
    assert g.loc[0, "algbw"] == pytest.approx(4096 * 2 / 2000)


# ---------------------------------------------------------------- a real 2-rank job

# The sleep only has to stand out: with two CPU burners on the 2 cores, waits outside the slow
# steps stay under ~60 ms (ranks run one intra-op thread each), over 10x below half of 1 s.
SLEEP = 1.0
SLOW_STEPS = (3, 6)
STEPS = 10

DDP = """
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import neuron_prof


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))


def worker(rank, run_dir, port, steps, slow, sleep):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    with neuron_prof.profile(run_dir) as prof:
        for step in range(steps):
            loss = ddp(torch.randn(8, 64)).sum()
            if rank == 1 and step in slow:
                time.sleep(sleep)
            loss.backward()  # BACKWARD
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    run_dir, port, steps, sleep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5])
    slow = {int(s) for s in sys.argv[4].split(",")}
    mp.spawn(worker, args=(run_dir, port, steps, slow, sleep), nprocs=2)
"""


def _slow(per) -> list[tuple[int, int]]:
    """(step, rank) of the significant straggler steps that cost more than half the injected
    sleep. This 2-core machine is shared: a rank can really stall for tens of milliseconds
    now and then, and such a stall is a real (if small) straggler step; the sleeps must stand out
    from them (margin: SLEEP above), on the right rank, in exactly the chosen steps."""
    big = per[per["significant"] & (per["wait_caused_ns"] > SLEEP / 2 * 1e9)]
    return [(int(s), int(r)) for s, r in zip(big["step"], big["rank"])]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One real run shared by the tests below: (run directory, script)."""
    tmp = tmp_path_factory.mktemp("ddp_straggler")
    script = write_script(tmp / "train.py", DDP)
    run_dir = tmp / "run"
    # one intra-op thread per rank, as torchrun sets it: torch's default (one OpenMP thread per
    # core) spin-waits against the other rank on a busy 2-core machine, stretching steps by 100s of ms
    res = run_bounded([sys.executable, str(script), str(run_dir), str(free_port()), str(STEPS),
                       ",".join(map(str, SLOW_STEPS)), str(SLEEP)], timeout=240, cwd=tmp, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    return run_dir, script


@pytest.mark.multiprocess
@pytest.mark.timing
def test_real_ddp_straggler_is_rank_1_in_exactly_the_slow_steps(ddp_run):
    import neuron_prof
    run_dir, script = ddp_run
    run = neuron_prof.load(run_dir)
    model = runpy.run_path(str(script))["model"]()  # the script's own model: what DDP all-reduces
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    m = analyze(run).collectives_matched
    grads = m[(m["op"] == "all_reduce") & (m["step"] >= 1)]
    assert sorted(grads["step"].unique()) == list(range(1, STEPS))
    assert (grads.groupby("step")["bytes"].sum() == param_bytes).all()  # every bucket, both ranks
    assert all(r == [0, 1] for r in grads["ranks_seen"]) and grads["complete"].all()

    per = stragglers.straggler_steps(analyze(run).collective_waits, analyze(run).step_kinds,
                                     collective_match.own_spans(run.steps, analyze(run).collective_offsets))
    sig = per[per["significant"]]
    assert set(SLOW_STEPS) <= set(sig["step"]) and set(sig.loc[sig["step"].isin(SLOW_STEPS), "rank"]) == {1}
    assert _slow(per) == [(s, 1) for s in SLOW_STEPS]
    ranking = stragglers.stragglers(m, analyze(run).collective_waits, analyze(run).step_kinds,
                                    collective_match.own_spans(run.steps, analyze(run).collective_offsets))
    assert ranking.iloc[0]["rank"] == 1 and set(SLOW_STEPS) <= set(ranking.iloc[0]["steps"])
    assert (m["own_ns"] <= m["wait_ns"]).all()

    w = analyze(run).collective_waits
    ar = w[(w["op"].astype(str) == "all_reduce") & w["step"].isin(SLOW_STEPS)]
    for s in SLOW_STEPS:
        # the sleeper arrived last: it does not wait, and rank 0's wait ends at its arrival
        (r0,), (r1,) = (ar[(ar["rank"] == r) & (ar["step"] == s)].itertuples() for r in (0, 1))
        assert r0.seq == r1.seq and r1.wait_ns == 0 and r0.start < r1.start == r0.start + r0.wait_ns
    steady = [s for s in range(1, STEPS) if s not in SLOW_STEPS]
    waited = w[w["op"].astype(str) == "all_reduce"].groupby(["rank", "step"])["wait_ns"].sum()
    quiet = waited[waited.index.get_level_values("step").isin(steady)].max()
    assert all(waited[(0, s)] > quiet for s in SLOW_STEPS), waited  # rank 0's waits are the sleeps
    ov = analyze(run).collective_overlap.set_index(["rank", "step"])["exposed_ns"]
    quiet = ov[ov.index.get_level_values("step").isin(steady)].max()
    for s in SLOW_STEPS:
        assert ov[(0, s)] > max(quiet, ov[(1, s)])  # waiting, no compute under it; the sleeper not
    assert collective_match.mismatches(run.collectives, run.collective_groups).empty
    assert collective_match.in_flight(run.collectives, m).empty


@pytest.mark.multiprocess
@pytest.mark.timing
def test_real_ddp_report_and_json_name_the_straggler(ddp_run):
    run_dir, script = ddp_run
    res = cli("report", run_dir, "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    c = s["collectives"]
    top = c["stragglers"][0]
    assert top["rank"] == 1 and set(SLOW_STEPS) <= set(top["steps"])
    per = pd.DataFrame(c["straggler_steps"])
    assert _slow(per) == [(s, 1) for s in SLOW_STEPS]
    assert top["wait_in_steps_ns"] == per.loc[(per["rank"] == 1) & per["significant"], "wait_caused_ns"].sum()
    line = f"train.py:{line_of(script, '# BACKWARD')}"
    assert top["where"]["op"] == "all_reduce" and top["where"]["bwd"] and top["where"]["source"] == line
    assert c["mismatches"] == [] and c["in_flight"] == [] and all(x["same_clock"] for x in c["clock"])
    split = {x["rank"]: x for x in s["time_split"]}
    n = next(x["steady"] for x in s["steps"] if x["rank"] == 0)
    # rank 0's exposed communication holds its waits for the sleeper (half the sleeps: margin as in
    # _slow); rank 1's sleep is idle (time.sleep never returns early: load cannot shrink it), and
    # rank 1 communicates less than half as long (the sleeps against its transfers and noise waits)
    assert split[0]["communication_ms"] * n > 0.5 * SLEEP * 1e3 * len(SLOW_STEPS)
    assert split[1]["idle_ms"] * n > 0.6 * SLEEP * 1e3 * len(SLOW_STEPS)
    assert split[1]["communication_ms"] < split[0]["communication_ms"] / 2

    text = cli("report", run_dir, timeout=120)
    assert text.returncode == 0, text.stderr
    findings = text.stdout.split("\n\n")[1]
    assert f"rank 1 made the others wait {top['wait_in_steps_ns'] / 1e6:.0f} ms in {steps_text(top['steps'])} " \
           "(all_reduce of" in findings
    assert f"from {line}, backward)" in findings
    section = text.stdout.split("\nCollectives (")[1].split("\n\n")[0]
    assert "group 0 default_pg (gloo, ranks 0, 1)" in section and "every rank reads rank 0's clock" in section
    assert steps_text(top["steps"]) in section


def test_a_single_rank_run_has_no_collectives_section(tmp_path):
    import torch
    import neuron_prof
    from neuron_prof.reports.summary.build import summarize
    from neuron_prof.reports.summary.text import render_text
    with neuron_prof.profile(tmp_path / "one", collectors=["eager"]) as prof:
        for _ in range(3):
            torch.nn.functional.linear(torch.randn(4, 8), torch.randn(8, 8)).sum()
            prof.step()
    s = summarize(neuron_prof.load(tmp_path / "one"))
    assert s.to_json()["collectives"] == {"captured": False, "ranks": 1}
    text = render_text(s).split("\n", 2)[2]  # after the command line, which names this file
    assert "collective" not in text.lower()


BROKEN = """
import datetime, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import neuron_prof


def worker(rank, run_dir, port, mode):
    # the mismatch ends by the group's timeout; the hang by the test's kill -9, well before it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=5 if mode == "mismatch" else 120))
    with neuron_prof.profile(run_dir) as prof:
        for _ in range(3):
            dist.all_reduce(torch.ones(1000))
            prof.step()
        if mode == "mismatch":  # a different op on each rank (gloo aborts at once on different sizes)
            try:
                if rank == 0:
                    dist.all_reduce(torch.ones(1000))
                else:
                    dist.broadcast(torch.ones(1000), src=1)
            except RuntimeError:
                pass  # the group timed out
        elif rank == 0:
            dist.all_reduce(torch.ones(1000))  # HANG: rank 1 never comes
        else:
            Path(run_dir).with_suffix(".waiting").touch()
            time.sleep(120)
        prof.step()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
"""


def _broken(tmp, mode: str):
    """The BROKEN job in ``mode``, its whole session SIGKILLed once it is stuck (the hang) or
    ended (the mismatch: by the group's timeout); (run directory, script)."""
    import time
    script = write_script(tmp / "broken.py", BROKEN)
    run_dir = tmp / mode
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), str(free_port()), mode], cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            # rank 1 sleeps, rank 0 has issued its fourth all-reduce (seq 4, after the three both
            # ranks completed), alone
            if run_dir.with_suffix(".waiting").exists() and (stuck_collectives(run_dir)["seq"] == 4).any():
                break
            time.sleep(0.2)
    finally:
        kill_group(proc)  # kill -9, every rank
        proc.wait(timeout=30)
    return run_dir, script


@pytest.fixture(scope="module")
def broken_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("broken")
    return {mode: _broken(tmp, mode) for mode in ("mismatch", "hang")}


@pytest.mark.multiprocess
def test_real_mismatched_collective_is_a_mismatch_and_failed_on_both_ranks(broken_runs):
    import neuron_prof
    run_dir, script = broken_runs["mismatch"]
    run = neuron_prof.load(run_dir)
    seq = int(run.collectives["seq"].max())
    (mm,) = analyze(run).collective_mismatches.to_dict("records")
    assert (mm["seq"], mm["kind"], mm["ranks"]) == (seq, "op", [1])
    assert mm["detail"] == ("rank 1 issued broadcast of 3.9 KiB float32, rank 0 issued all_reduce of 3.9 KiB "
                            "float32 at the same seq")
    stuck = collective_match.in_flight(run.collectives, analyze(run).collectives_matched)
    assert list(zip(stuck["rank"], stuck["seq"], stuck["status"])) == [(0, seq, "failed"), (1, seq, "failed")]
    assert all(x == [] for x in stuck["missing"])
    res = cli("report", run_dir, timeout=120)
    assert res.returncode == 0, res.stderr
    findings = res.stdout.split("\n\n")[1]
    assert f"collective mismatch: group 0 seq {seq}: rank 1 issued broadcast of 3.9 KiB" in findings
    assert f"rank 0's all_reduce (group 0, seq {seq}) failed; every rank of the group arrived" in findings


@pytest.mark.multiprocess
def test_real_hang_names_the_collective_and_the_rank_that_never_arrived(broken_runs):
    import neuron_prof
    run_dir, script = broken_runs["hang"]
    run = neuron_prof.load(run_dir)
    stuck = collective_match.in_flight(run.collectives, analyze(run).collectives_matched)
    (x,) = stuck.to_dict("records")
    assert (x["rank"], x["op"], x["status"], x["arrived"], x["missing"]) == (0, "all_reduce", "in_flight", [0], [1])
    assert x["seq"] == run.collectives.loc[run.collectives["rank"] == 1, "seq"].max() + 1
    s = json.loads(cli("report", run_dir, "--json", timeout=120).stdout)["collectives"]
    assert [(i["rank"], i["seq"], i["missing"]) for i in s["in_flight"]] == [(0, x["seq"], [1])]
    text = cli("report", run_dir, timeout=120).stdout
    findings = text.split("\n\n")[1]
    assert f"rank 0 was stuck in all_reduce (group 0, seq {x['seq']}); rank 1 never arrived" in findings
    assert "collective mismatch" not in findings  # the missing rank is said once, in the in-flight line
    assert f"!! in flight: rank 0 was stuck in all_reduce (group 0, seq {x['seq']}); rank 1 never arrived" in text


def test_a_delay_passed_on_through_a_subgroup_is_blamed_on_its_root():
    """Rank 1 is 30 ms late at its tensor-parallel all-reduce with rank 0 (group "tp"); released
    together, rank 0 then happens to reach the world all-reduce last, and ranks 2 and 3 wait 30 ms
    there. The wait at the world all-reduce is rank 1's doing, not rank 0's."""
    late, t = 30 * MS, 10 * MS
    rows = [{"rank": 0, "group": "tp", "group_size": 2, "seq": 1, "step": 1, "ts": t, "done": t + late + MS},
            {"rank": 1, "group": "tp", "group_size": 2, "seq": 1, "step": 1, "ts": t + late, "done": t + late + MS}]
    world = {0: t + late + 1.2 * MS, 1: t + late + 1.1 * MS, 2: t + 1.2 * MS, 3: t + 1.1 * MS}
    rows += [{"rank": r, "group": "0", "group_size": 4, "seq": 1, "step": 1, "ts": int(at), "done": t + late + 3 * MS}
             for r, at in world.items()]
    coll = _coll(rows)
    m = collective_match.matched(coll, _one_clock([0, 1, 2, 3]))
    w = collective_match.waits(coll, m, _one_clock([0, 1, 2, 3]))
    m = m.set_index("group")
    assert m.loc["tp", "last_rank"] == 1 and m.loc["tp", "root_rank"] == 1
    assert m.loc["0", "last_rank"] == 0 and m.loc["0", "root_rank"] == 1
    per = stragglers.straggler_steps(w, _steps({r: [100 * MS, 100 * MS] for r in range(4)}))
    assert per.loc[per["step"] == 1, "rank"].tolist() == [1]
    # ranks 0, 2 and 3 waited for rank 1 at the same time (rank 3 longest, 30.1 ms): one wait, not 30 + 30.1
    assert per.loc[per["step"] == 1, "wait_caused_ns"].tolist() == [late + MS // 10]
