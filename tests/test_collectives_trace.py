"""The merged Perfetto trace of real gloo jobs: one process per rank on rank 0's clock, a
collectives track per rank and process group, the straggler's wait as its own slice, flows joining
the ranks' slices of each matched collective, and a hung collective drawn as "in flight"."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from conftest import check_trace, cli, free_port, gloo_env, stuck_collectives, write_script
from ddp_straggler import straggler_run
from neuron_prof.export.clock import TraceClock

# The sleep only has to stand out: with two CPU burners on the 2 cores, waits outside the slow
# steps stay under ~60 ms (ranks run one intra-op thread each), over 10x below 1 s.
SLOW_RANK, SLOW_STEPS, SLEEP_S, STEPS = 1, [2, 5], 1.0, 7
TRACK = "Collectives default_pg (group 0)"  # then "... #2", ... where a rank's collectives overlap in time


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    """(run, the checker's report of its exported trace, what export printed)."""
    tmp = tmp_path_factory.mktemp("coll_trace")
    run_dir = straggler_run(tmp, steps=STEPS, slow_rank=SLOW_RANK, slow_steps=SLOW_STEPS, sleep_s=SLEEP_S)
    out = tmp / "t.perfetto-trace"
    res = cli("export", run_dir, "-o", out, timeout=300)
    assert res.returncode == 0, res.stderr
    return neuron_prof.load(run_dir), check_trace(out), res.stderr


def _process_names(report) -> dict[int, str]:
    return {u: t["name"] for u, t in report.tracks.items() if t["kind"] == "process"}


def _rank_of(report) -> dict[int, int]:
    """process uuid -> rank (process names start "rank N ")."""
    return {u: int(name.split()[1]) for u, name in _process_names(report).items()}


def _tracks(report, name: str) -> dict[int, int]:
    """rank -> uuid of its track called ``name``."""
    ranks = _rank_of(report)
    return {ranks[report.process_of(u)]: u for u, t in report.tracks.items() if t["name"] == name}


def _slices(report, track: int, depth: int | None = None) -> list:
    return [s for s in report.slices if s.track == track and (depth is None or s.depth == depth)]


def _lanes(report) -> dict[int, set[int]]:
    """rank -> uuids of its collective tracks of the default group (its lanes)."""
    ranks = _rank_of(report)
    out: dict[int, set[int]] = {}
    for u, t in report.tracks.items():
        if t["name"] == TRACK or t["name"].startswith(TRACK + " #"):
            out.setdefault(ranks[report.process_of(u)], set()).add(u)
    return out


def _coll(report, rank: int, depth: int) -> list:
    """``rank``'s collective slices (depth 0) or what is inside them (depth 1), all lanes."""
    lanes = _lanes(report)[rank]
    return [s for s in report.slices if s.track in lanes and s.depth == depth]


def _step_of(report, rank: int, ts: int) -> int:
    """The step whose slice on ``rank``'s Steps track holds ``ts``."""
    for s in _slices(report, _tracks(report, "Steps")[rank]):
        if s.name.startswith("step ") and s.ts <= ts < s.ts + s.dur:
            return int(s.name.split()[1])
    raise AssertionError(f"no step of rank {rank} holds {ts}")


@pytest.mark.multiprocess
def test_one_process_per_rank_each_with_its_collectives_track(straggler):
    run, report, printed = straggler
    assert f"{len(run.collectives)} collectives, {len(report.flows)} cross-rank flows" in printed
    assert sorted(_rank_of(report).values()) == [0, 1]
    assert sorted(_lanes(report)) == [0, 1]
    for rank in (0, 1):
        ops = [s.name for s in _coll(report, rank, 0)]
        # DDP's one gradient bucket (the model is far below 25 MB): one all-reduce per step
        assert ops.count("all_reduce") == STEPS, ops
        assert len(ops) == len(run.collectives[run.collectives["rank"] == rank])


@pytest.mark.multiprocess
def test_every_rank_is_on_rank0s_clock(straggler):
    """Both ranks share one host clock (measured so), so every event of either rank sits at its own
    time plus rank 0's wall-clock offset: rank 1's own offset (read a moment later) is not used."""
    run, report, _ = straggler
    assert run.clock_sync["same_clock"].all()
    wall = {rd.rank: int(rd.meta["clock_offset_ns"]) for rd in run.rank_data}
    steps = _tracks(report, "Steps")
    for rank in (0, 1):
        own = run.steps[(run.steps["rank"] == rank)]
        drawn = sorted(s.ts for s in _slices(report, steps[rank]) if s.name.startswith("step "))
        assert drawn == sorted(own["ts"] + wall[0])


@pytest.mark.multiprocess
@pytest.mark.timing
def test_the_waiting_rank_has_a_wait_slice_ending_at_the_stragglers_arrival_in_exactly_those_steps(straggler):
    run, report, _ = straggler
    waits = {rank: [s for s in _coll(report, rank, 1) if s.name.startswith("wait for rank")] for rank in (0, 1)}
    long0 = [s for s in waits[0] if _step_of(report, 0, s.ts) in SLOW_STEPS]
    assert sorted(_step_of(report, 0, s.ts) for s in long0) == SLOW_STEPS
    # step 0 (warm-up: ranks start their first step apart) aside, each slow step's wait is longer
    # than every wait of the other steps on either rank (the sleep against noise: SLEEP_S above)
    others = [s.dur for r in (0, 1) for s in waits[r] if _step_of(report, r, s.ts) not in [0, *SLOW_STEPS]]
    assert all(s.dur > max(others, default=0) for s in long0), (long0, others)
    starts1 = {s.ts for s in _coll(report, SLOW_RANK, 0) if s.name == "all_reduce"}
    for s in long0:
        assert s.name == f"wait for rank {SLOW_RANK}"
        assert s.ts + s.dur in starts1  # it ends where the straggler's all-reduce begins (one clock)
    # the straggler arrived last in the steps it straggled: it did not wait at all
    assert not [s for s in waits[1] if _step_of(report, 1, s.ts) in SLOW_STEPS]
    # after the wait, the transfer: nested in the same collective, ending with it
    parents = {(s.track, s.ts): s for s in _coll(report, 0, 0)}
    transfers = {(s.track, s.ts): s for s in _coll(report, 0, 1) if s.name == "transfer"}
    for s in long0:
        parent, transfer = parents[s.track, s.ts], transfers[s.track, s.ts + s.dur]
        assert parent.name == "all_reduce" and transfer.ts + transfer.dur == parent.ts + parent.dur


@pytest.mark.multiprocess
def test_flows_join_the_ranks_slices_of_each_matched_collective(straggler):
    run, report, _ = straggler
    assert report.stats["flows_across_processes"] == len(report.flows) > 0
    wall0 = int(run.rank_data[0].meta["clock_offset_ns"])
    c = run.collectives
    # on one clock, each (group, seq)'s two slices start at the ranks' own issue times
    want = {tuple(sorted(g["ts"] + wall0)) for _, g in c.groupby(["group", "seq"], observed=True)}
    assert len(want) == len(c) // 2
    got = {(f.src.ts, f.dst.ts) for f in report.flows}
    assert got == want
    lanes = _lanes(report)
    for f in report.flows:
        assert f.src.track in lanes[0] | lanes[1] and f.dst.track in lanes[0] | lanes[1]
        assert report.process_of(f.src.track) != report.process_of(f.dst.track) and f.src.name == f.dst.name


@pytest.mark.multiprocess
def test_the_chrome_export_has_the_same_flows(straggler, tmp_path):
    run, report, _ = straggler
    out = tmp_path / "t.json"
    assert cli("export", run.path, "-o", out, "--format", "chrome").returncode == 0
    events = json.loads(out.read_text())["traceEvents"]
    starts = {e["id"]: e["pid"] for e in events if e["ph"] == "s"}
    ends = {e["id"]: e["pid"] for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(report.flows) and set(starts) == set(ends)
    # each flow joins one rank's slice of a collective to the other's, starting at the earlier one
    # (which rank issued a given collective first is up to the machine's load: the flows' starts
    # need not cover both ranks, their ends and starts together do)
    assert all(starts[i] != ends[i] for i in starts)
    assert set(starts.values()) | set(ends.values()) == {rd.meta["pid"] for rd in run.rank_data}


def test_trace_clock_follows_each_ranks_drift():
    """A rank 5 ms behind rank 0 at the start and 7 ms behind at the end: its slices move by the
    offset at their own ends, so a slice keeps its place against rank 0's while the clocks drift."""
    offsets = pd.DataFrame({"rank": [0, 1], "offset_start": [0, 5_000_000], "offset_end": [0, 7_000_000],
                            "ts_start": [0, 1_000_000_000], "ts_end": [0, 3_000_000_000], "rtt": [0, 10_000],
                            "same_clock": [True, False], "measured": [True, True]})
    clock = TraceClock(offsets, wall=100)
    assert clock.at(0, [1_000_000_000]).tolist() == [1_000_000_100]
    ts, dur = clock.span(1, np.array([1_000_000_000, 2_000_000_000]), np.array([1_000_000_000, 0]))
    assert ts.tolist() == [1_005_000_100, 2_006_000_100]
    assert dur.tolist() == [1_001_000_000, 0]


HANG = """
import sys
import time
import torch
import torch.distributed as dist
import neuron_prof

run_dir, marker = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(256)
with neuron_prof.profile(run_dir) as prof:
    for _ in range(3):
        dist.all_reduce(x)
        prof.step()
    if rank == 0:
        open(marker + ".0", "w").close()
        dist.all_reduce(x)  # HANG: rank 1 never joins
open(marker + f".{rank}", "w").close()
time.sleep(300)  # until the test kills it
"""


@pytest.mark.multiprocess
def test_a_hung_collective_is_an_ended_in_flight_slice_that_names_the_missing_rank(tmp_path):
    """Rank 0 is killed (-9) while stuck in an all-reduce rank 1 never issued: the trace still
    draws it, ended at rank 0's last event, named in flight, waiting for rank 1."""
    script = write_script(tmp_path / "hang.py", HANG)
    run_dir, marker = tmp_path / "run", tmp_path / "ready"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(run_dir), str(marker)], cwd=tmp_path,
                              env={**os.environ, **gloo_env(r, 2, port)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        # rank 1 closed its capture, and rank 0 issued its fourth all-reduce (its in-flight row)
        while not (all(Path(f"{marker}.{r}").exists() for r in (0, 1)) and (stuck_collectives(run_dir)["seq"] == 4).any()):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.stderr.read() for p in procs if p.poll() is not None]
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
            p.stderr.close()

    out = tmp_path / "t.perfetto-trace"
    res = cli("export", run_dir, "-o", out, timeout=300)
    assert res.returncode == 0, res.stderr
    report = check_trace(out)  # no slice left unterminated
    stuck = [s for s in _coll(report, 0, 0) if s.name.endswith("(in flight)")]
    assert [s.name for s in stuck] == ["all_reduce (in flight)"]
    inside = [s for s in _coll(report, 0, 1) if (s.track, s.ts) == (stuck[0].track, stuck[0].ts)]
    assert [s.name for s in inside] == ["waiting for rank 1"] and inside[0].dur == stuck[0].dur
    # it ends at rank 0's last recorded event, after every other slice of rank 0 began
    rank0 = {u for u in report.tracks if report.process_of(u) == report.process_of(stuck[0].track)}
    assert stuck[0].ts + stuck[0].dur >= max(s.ts for s in report.slices if s.track in rank0)
    assert [s.name for s in _coll(report, 1, 0)] == ["all_reduce"] * 3


@pytest.mark.multiprocess
@pytest.mark.timing
def test_four_ranks_the_stragglers_collective_links_to_each_other_rank(tmp_path):
    run_dir = straggler_run(tmp_path, steps=4, slow_rank=2, slow_steps=[2], sleep_s=SLEEP_S, world=4)
    out = tmp_path / "t.perfetto-trace"
    assert cli("export", run_dir, "-o", out, timeout=300).returncode == 0
    report = check_trace(out)
    assert sorted(_rank_of(report).values()) == [0, 1, 2, 3]
    lanes = _lanes(report)
    run = neuron_prof.load(run_dir)
    n = run.collectives.groupby(["group", "seq"], observed=True).ngroups
    assert len(report.flows) == report.stats["flows_across_processes"] == 3 * n  # last rank -> each other rank
    # the slow step's all-reduce: three arrows, each between rank 2's slice and another rank's
    slow = [s for s in _coll(report, 2, 0) if _step_of(report, 2, s.ts) == 2 and s.name == "all_reduce"]
    assert len(slow) == 1
    end = (slow[0].track, slow[0].ts)
    others = [b.track for f in report.flows for a, b in ((f.src, f.dst), (f.dst, f.src)) if (a.track, a.ts) == end]
    assert sorted(r for r, ls in lanes.items() for t in others if t in ls) == [0, 1, 3]
    # each of the others waited for rank 2 (the last to arrive: its sleep against noise, SLEEP_S
    # above), from its own arrival to rank 2's, which did not wait
    for rank in (0, 1, 3):
        waits = [s for s in _coll(report, rank, 1) if s.name == "wait for rank 2" and _step_of(report, rank, s.ts) == 2]
        assert len(waits) == 1 and waits[0].ts + waits[0].dur == slow[0].ts
    assert not [s for s in _coll(report, 2, 1) if s.name.startswith("wait for") and _step_of(report, 2, s.ts) == 2]
