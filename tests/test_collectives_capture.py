"""The collectives collector on real gloo jobs (127.0.0.1): what every rank's run says it issued.

One job script (JOB) trains DDP, issues explicit collectives on the world and on subgroups and a
functional collective, then trains FSDP2. It runs three ways, each once per module: 2 and 4 ranks
started by torch.multiprocessing and captured by ``neuron_prof.profile``, and 2 ranks started by
torchrun under ``neuron-prof record``. Every expectation comes from the script's own models and
calls (sizes, DDP's bucket rule, FSDP2's padding), never from a run. Two more jobs break on
purpose: a size mismatch under a short process-group timeout, and a rank killed with SIGKILL while
stuck in a collective its peer never joins.
"""
from __future__ import annotations

import functools
import math
import os
import runpy
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

import neuron_prof
from conftest import cli, free_port, gloo_env, kill_group, line_of, run_bounded, stuck_collectives, write_script
from neuron_prof.store.schema import INFLIGHT

pytestmark = [pytest.mark.multiprocess]

JOB = '''
"""DDP steps, explicit collectives (world and subgroups), a functional collective, FSDP2 steps.
``job.py spawn WORLD PORT RUN OUT``: torch.multiprocessing starts the ranks, neuron_prof.profile
captures (after an uncaptured reference training of the same DDP model). ``job.py env - - - OUT``:
one rank of a launcher (torchrun), captured by neuron-prof record."""
import datetime
import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.fsdp import fully_shard

import neuron_prof

DDP_STEPS = 4
FSDP_STEPS = 2
BUCKET_MB = 0.07


def ddp_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))


def fsdp_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 7))


def batch(rank, step, width):
    return torch.randn(8, width, generator=torch.Generator().manual_seed(100 * rank + step))


def subgroup_members(world):
    half = world // 2
    return [[r for r in range(world) if r % half == k] for k in range(half)]


def train_ddp(rank, prof):
    model = torch.nn.parallel.DistributedDataParallel(ddp_net(), bucket_cap_mb=BUCKET_MB)  # DDP_WRAP
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(DDP_STEPS):
        loss = model(batch(rank, step, 128)).square().mean()
        loss.backward()  # DDP_BACKWARD
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def explicit(rank, world):
    out = [torch.empty(100) for _ in range(world)]
    dist.all_gather(out, torch.full((100,), float(rank)))  # ALL_GATHER
    dist.broadcast(torch.arange(50, dtype=torch.float64), src=world - 1)  # BROADCAST
    rs_in, rs_out = torch.ones(24 * world, dtype=torch.int64), torch.empty(24, dtype=torch.int64)
    dist.reduce_scatter_tensor(rs_out, rs_in)  # REDUCE_SCATTER
    dist.barrier()  # BARRIER
    dist.all_to_all_single(torch.empty(8 * world), torch.ones(8 * world))  # ALL_TO_ALL
    if rank % 2 == 0:
        dist.send(torch.ones(33, dtype=torch.float16), rank + 1)  # SEND
    else:
        dist.recv(torch.empty(33, dtype=torch.float16), rank - 1)  # RECV
    total = funcol.all_reduce(torch.ones(30), "sum", dist.group.WORLD) + 0  # FUNCTIONAL
    assert int(total[0]) == world
    sub, _ = dist.new_subgroups_by_enumeration(subgroup_members(world))
    dist.all_reduce(torch.ones(7), group=sub)  # SUB_ALL_REDUCE
    dist.broadcast(torch.ones(5, dtype=torch.int32), group_src=1, group=sub)  # SUB_BROADCAST
    dist.all_gather_into_tensor(torch.empty(3 * sub.size()), torch.ones(3), group=sub)  # SUB_ALL_GATHER


def train_fsdp(rank, prof):
    model = fsdp_net()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(FSDP_STEPS):
        loss = model(batch(rank, step, 16)).sum()  # FSDP_FORWARD
        loss.backward()  # FSDP_BACKWARD
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()


def rank_main(rank, world, mode, run_dir, out):
    torch.set_num_threads(1)  # as torchrun sets it: the launchers' results are comparable
    faulthandler.dump_traceback_later(150, exit=True)  # a hung rank ends itself
    if mode == "spawn":
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        reference = train_ddp(rank, None)
        prof = neuron_prof.profile(run_dir).start()
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        rank, world, reference, prof = dist.get_rank(), dist.get_world_size(), None, None
    captured = train_ddp(rank, prof)
    explicit(rank, world)
    train_fsdp(rank, prof)
    if prof is not None:
        prof.stop()
    dist.destroy_process_group()
    torch.save({"reference": reference, "captured": captured}, os.path.join(out, f"params-{rank}.pt"))


if __name__ == "__main__":
    mode, world, port, run_dir, out = sys.argv[1:6]
    if mode == "spawn":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        import torch.multiprocessing as mp
        mp.spawn(rank_main, args=(int(world), mode, run_dir, out), nprocs=int(world))
    else:
        rank_main(-1, -1, mode, run_dir, out)
'''

JOB_SECONDS = 240  # 4 ranks on 2 shared cores take ~30 s


@dataclass
class Job:
    """One run of JOB: its run read back, the script (for lines and models), the saved parameters."""
    name: str
    world: int
    script: Path
    run_dir: Path
    out: Path

    @functools.cached_property
    def run(self):
        return neuron_prof.load(self.run_dir)

    def params(self, rank: int) -> dict:
        return torch.load(self.out / f"params-{rank}.pt")

    def line(self, marker: str) -> str:
        return f"{self.script.name}:{line_of(self.script, marker)}"


def _job(tmp: Path, name: str, world: int) -> Job:
    script = write_script(tmp / "job.py", JOB)
    job = Job(name, world, script, tmp / "run", tmp / "out")
    job.out.mkdir()
    if name.startswith("spawn"):
        res = run_bounded([sys.executable, str(script), "spawn", str(world), str(free_port()), str(job.run_dir),
                           str(job.out)], JOB_SECONDS, cwd=tmp)
    else:
        res = cli("record", "-o", job.run_dir, "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                  str(world), "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, "env", "-", "-",
                  "-", job.out, cwd=tmp, timeout=JOB_SECONDS)
    assert res.returncode == 0, res.stderr[-3000:]
    return job


@pytest.fixture(scope="module")
def spawn2(tmp_path_factory) -> Job:
    return _job(tmp_path_factory.mktemp("spawn2"), "spawn2", 2)


@pytest.fixture(scope="module")
def spawn4(tmp_path_factory) -> Job:
    return _job(tmp_path_factory.mktemp("spawn4"), "spawn4", 4)


@pytest.fixture(scope="module")
def torchrun2(tmp_path_factory) -> Job:
    return _job(tmp_path_factory.mktemp("torchrun2"), "torchrun2", 2)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """The job script's own definitions (models, bucket size, subgroups), for expectations."""
    return runpy.run_path(str(write_script(tmp_path_factory.mktemp("models") / "job.py", JOB)), run_name="job")


ALL_JOBS = ["spawn2", "spawn4", "torchrun2"]


def _rows(run, rank: int, line: str) -> pd.DataFrame:
    c = run.collectives
    return c[(c["rank"] == rank) & (c["user_source"] == line)].sort_values("ts")


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def ddp_buckets(params: list[torch.Tensor], cap_mb: float) -> list[int]:
    """DDP's buckets after its rebuild (first step on): gradients in the order they become ready
    (the reverse of registration, for a Sequential), a bucket closing once it holds cap_mb."""
    cap, sizes, cur = cap_mb * 1024 * 1024, [], 0
    for p in reversed(params):
        cur += _nbytes(p)
        if cur >= cap:
            sizes.append(cur)
            cur = 0
    return sizes + ([cur] if cur else [])


def fsdp2_shard_bytes(module: torch.nn.Module, world: int) -> int:
    """One rank's shard of a fully_shard unit as FSDP2 lays it out: each parameter's dim 0 padded
    to a multiple of the world size and split evenly (so ceil(dim0 / world) rows, not
    ceil(numel / world) elements), the shards of the unit's parameters concatenated."""
    return sum(math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0]) * p.element_size()
               for p in module.parameters())


# ---- DDP


@pytest.mark.parametrize("name", ALL_JOBS)
def test_ddp_bucket_all_reduces_on_every_rank_sum_to_the_gradient_bytes(name, request, models):
    job: Job = request.getfixturevalue(name)
    params = list(models["ddp_net"]().parameters())
    grad_bytes = sum(_nbytes(p) for p in params)
    buckets = ddp_buckets(params, models["BUCKET_MB"])
    assert len(buckets) >= 2 and sum(buckets) == grad_bytes  # the model does split
    run = job.run
    assert run.ranks == list(range(job.world))
    for rank in run.ranks:
        ar = _rows(run, rank, job.line("DDP_BACKWARD"))
        assert set(ar["op"]) == {"all_reduce"} and set(ar["call"]) == {"c10d::allreduce_"}
        assert ar["bwd"].all() and ar["async_op"].all() and set(ar["dtype"]) == {"float32"}
        assert set(ar["group_desc"]) == {"default_pg"} and set(ar["group_size"]) == {job.world}
        assert (ar["status"] == "completed").all() and (ar["done"] >= ar["ts"]).all()
        per_step = [list(g["bytes"]) for _, g in ar.groupby("step", sort=True)]
        assert len(per_step) == models["DDP_STEPS"]
        # the first step all-reduces before DDP rebuilds its buckets (one bucket of up to 1 MB);
        # every step moves exactly the model's gradient bytes, the later ones bucket by bucket
        assert all(sum(s) == grad_bytes for s in per_step), per_step
        assert per_step[1:] == [buckets] * (models["DDP_STEPS"] - 1), per_step


@pytest.mark.parametrize("name", ["spawn2", "torchrun2"])
def test_ddp_constructor_broadcast_is_recorded(name, request, models):
    """profile() started before DDP(...) on a live process group, and record's capture from
    ``import torch`` (the group comes up under it), both see DDP sync rank 0's parameters."""
    job: Job = request.getfixturevalue(name)
    grad_bytes = sum(_nbytes(p) for p in models["ddp_net"]().parameters())
    run = job.run
    for rank in run.ranks:
        wrap = _rows(run, rank, job.line("DDP_WRAP"))
        sync = wrap[(wrap["op"] == "broadcast") & (wrap["dtype"] == "float32")]
        assert list(sync["bytes"]) == [grad_bytes] and list(sync["peer"]) == [0]
        assert (sync["status"] == "completed").all()


def test_record_run_matches_the_profile_run(spawn2, torchrun2):
    """The same job under torchrun + record and under spawn + profile(): the same collectives with
    the same facts, in the same order, on every rank (group sequence numbers aside: the spawn
    run's uncaptured reference training used the first ones)."""
    facts = ["op", "call", "bytes", "out_bytes", "dtype", "peer", "async_op", "bwd", "user_source", "group_desc",
             "group_size", "status"]
    a, b = spawn2.run.collectives, torchrun2.run.collectives
    for rank in (0, 1):
        ra = a[a["rank"] == rank].sort_values("ts")[facts].astype(str).values.tolist()
        rb = b[b["rank"] == rank].sort_values("ts")[facts].astype(str).values.tolist()
        assert ra == rb
    # record's capture began with the interpreter: DDP's constructor ran in the start-up, before step 0
    wrap = _rows(torchrun2.run, 0, torchrun2.line("DDP_WRAP"))
    assert len(wrap) and (wrap["step"] == -1).all()


def test_capture_does_not_change_the_trained_parameters(spawn2, torchrun2):
    for rank in (0, 1):
        ref = spawn2.params(rank)["reference"]  # trained before profile() started
        for captured in (spawn2.params(rank)["captured"], torchrun2.params(rank)["captured"]):
            assert ref.keys() == captured.keys()
            assert all(torch.equal(ref[k], captured[k]) for k in ref), rank


# ---- explicit collectives, subgroups, sequence numbers


def _explicit_expected(rank: int, world: int) -> list[tuple]:
    """(marker, op, dtype, bytes, out_bytes, peer, subgroup) of JOB's explicit() on ``rank``."""
    return [
        ("ALL_GATHER", "all_gather", "float32", 400, 400 * world, -1, False),
        ("BROADCAST", "broadcast", "float64", 400, 400, world - 1, False),
        ("REDUCE_SCATTER", "reduce_scatter", "int64", 8 * 24 * world, 8 * 24, -1, False),
        ("BARRIER", "barrier", "", 0, 0, -1, False),
        ("ALL_TO_ALL", "all_to_all", "float32", 4 * 8 * world, 4 * 8 * world, -1, False),
        ("SEND", "send", "float16", 66, 0, rank + 1, False) if rank % 2 == 0 else
        ("RECV", "recv", "float16", 0, 66, rank - 1, False),
        ("FUNCTIONAL", "all_reduce", "float32", 120, 120, -1, False),
        ("SUB_ALL_REDUCE", "all_reduce", "float32", 28, 28, -1, True),
        ("SUB_BROADCAST", "broadcast", "int32", 20, 20, 1, True),  # peer: the root's rank in the group
        ("SUB_ALL_GATHER", "all_gather", "float32", 12, 24, -1, True),
    ]


@pytest.mark.parametrize("name", ALL_JOBS)
def test_explicit_collectives_with_op_group_bytes_dtype_peer(name, request, models):
    job: Job = request.getfixturevalue(name)
    run = job.run
    c, groups = run.collectives, run.collective_groups
    for rank in run.ranks:
        expected = _explicit_expected(rank, job.world)
        lines = {job.line(m): m for m, *_ in expected}
        mine = c[(c["rank"] == rank) & c["user_source"].isin(list(lines))].sort_values("ts")
        got = [(lines[r.user_source], r.op, r.dtype, r.bytes, r.out_bytes, r.peer) for r in mine.itertuples()]
        assert got == [e[:6] for e in expected], rank
        world_group = mine[~mine["user_source"].isin([job.line(e[0]) for e in expected if e[6]])]
        sub = mine[mine["user_source"].isin([job.line(e[0]) for e in expected if e[6]])]
        assert set(world_group["group_desc"]) == {"default_pg"} and set(world_group["group_size"]) == {job.world}
        assert sub["group"].nunique() == 1 and set(sub["group_size"]) == {2}
        # the subgroup is known with its members as global ranks and this rank's place in it
        (g,) = groups[(groups["rank"] == rank) & (groups["group"] == sub["group"].iloc[0])].itertuples()
        want = next(m for m in models["subgroup_members"](job.world) if rank in m)
        assert list(g.ranks) == want and g.group_rank == want.index(rank) and g.size == 2 and g.backend == "gloo"
        assert sub["seq"].tolist() == [1, 2, 3]  # a group's own numbering
        # sync calls say so; the functional collective is issued async and waited on later
        assert not mine[mine["op"] != "all_reduce"]["async_op"].any()
        assert _rows(run, rank, job.line("FUNCTIONAL"))["async_op"].all()


@pytest.mark.parametrize("name", ALL_JOBS)
def test_every_group_sequence_number_is_seen_on_every_member_alike(name, request):
    """Matching ranks by (group, seq) works: each collective of a group appears once on each of
    its members with one op and one size; a point-to-point pair shares its seq, the sender's
    bytes are the receiver's, each names the other. Each rank's numbering has no gap."""
    job: Job = request.getfixturevalue(name)
    run = job.run
    c = run.collectives
    members = {(str(g.group), g.rank): list(g.ranks) for g in run.collective_groups.itertuples()}
    assert set(members) == set(zip(c["group"].astype(str), c["rank"]))
    for (group, seq), rows in c.groupby(["group", "seq"], observed=True):
        group_ranks = {tuple(members[(str(group), r)]) for r in rows["rank"]}
        assert len(group_ranks) == 1, (group, seq)
        assert sorted(rows["rank"]) == list(group_ranks.pop()), (group, seq)
        if set(rows["op"]) <= {"send", "recv"}:
            send, recv = rows[rows["op"] == "send"], rows[rows["op"] == "recv"]
            assert len(send) == len(recv)
            pairs = {(int(s.rank), int(s.peer), int(s.bytes)) for s in send.itertuples()}
            assert pairs == {(int(r.peer), int(r.rank), int(r.out_bytes)) for r in recv.itertuples()}
        else:
            assert rows["op"].nunique() == 1 and rows["bytes"].nunique() == 1, rows
    for (rank, group), rows in c.groupby(["rank", "group"], observed=True):
        seqs = rows.sort_values("ts")["seq"].tolist()
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (rank, group)


# ---- FSDP2


@pytest.mark.parametrize("name", ALL_JOBS)
def test_fsdp2_all_gathers_and_reduce_scatters_move_the_parameter_shards(name, request, models):
    job: Job = request.getfixturevalue(name)
    units = [m for m in models["fsdp_net"]() if isinstance(m, torch.nn.Linear)]
    shards = [fsdp2_shard_bytes(u, job.world) for u in units]
    assert len(set(shards)) == len(shards)  # the units are told apart by size
    run = job.run
    for rank in run.ranks:
        fsdp = pd.concat([_rows(run, rank, job.line("FSDP_FORWARD")), _rows(run, rank, job.line("FSDP_BACKWARD"))])
        steps = [g for _, g in fsdp.groupby("step", sort=True)]
        assert len(steps) == models["FSDP_STEPS"]
        for s in steps:
            ag, rs = s[s["op"] == "all_gather"], s[s["op"] == "reduce_scatter"]
            assert len(ag) + len(rs) == len(s)
            # every unit gathered in forward and again in backward (resharded after forward),
            # each gradient reduce-scattered once, in backward
            assert Counter(ag["bytes"]) == {b: 2 for b in shards}
            assert (ag["out_bytes"] == ag["bytes"] * job.world).all()
            assert sorted(ag[~ag["bwd"]]["bytes"]) == sorted(shards)
            assert Counter(rs["out_bytes"]) == {b: 1 for b in shards}
            assert (rs["bytes"] == rs["out_bytes"] * job.world).all() and rs["bwd"].all()
            assert set(s["dtype"]) == {"float32"} and set(s["group_desc"]) == {"default_pg"}


# ---- clocks


@pytest.mark.timing
@pytest.mark.parametrize("name", ALL_JOBS)
def test_every_rank_measures_its_clock_at_start_and_end(name, request):
    # the end rows exist if the end measurement finished within the capture's 3 s join
    # (collectors/_clocksync.py JOIN_SECONDS); the ranks get there together, after their last
    # collective, and 4 ranks measured in ~0.1 s with two CPU burners: 30x below
    job: Job = request.getfixturevalue(name)
    cs = job.run.clock_sync
    assert sorted(zip(cs["rank"], cs["phase"].astype(str))) == sorted(
        (r, p) for r in range(job.world) for p in ("end", "start"))
    assert cs["same_clock"].all()  # one host, one boot
    assert (cs["offset"].abs() <= cs["rtt"]).all(), cs
    assert (cs[cs["rank"] == 0][["offset", "rtt"]] == 0).all().all()
    assert (cs[cs["rank"] > 0]["rtt"] > 0).all()


# ---- jobs that break


MISMATCH = """
import datetime, faulthandler, sys
import torch
import torch.distributed as dist
import neuron_prof

faulthandler.dump_traceback_later(60, exit=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
with neuron_prof.profile(sys.argv[1]) as prof:
    dist.all_reduce(torch.ones(4))
    prof.step()
    try:
        dist.all_reduce(torch.ones(1000 if rank == 0 else 2000))  # MISMATCH
        print("no error", flush=True)
    except RuntimeError as exc:
        print("failed:", str(exc)[:200], flush=True)
"""


def test_mismatched_collective_shows_on_both_ranks_with_different_bytes_at_one_seq(tmp_path):
    """Rank 0 all-reduces 1000 floats, rank 1 2000: gloo aborts the rank that receives more than
    it expects, its peer's collective fails (or its 5 s timeout ends it). Nothing hangs, and the
    run holds the collective on both ranks at one (group, seq)."""
    script = write_script(tmp_path / "mismatch.py", MISMATCH)
    run_dir, port = tmp_path / "run", free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(run_dir)], cwd=tmp_path, env={**os.environ,
                              **gloo_env(r, 2, port)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for r in range(2)]
    try:
        for p in procs:
            p.communicate(timeout=90)
    finally:
        for p in procs:
            kill_group(p)
    run = neuron_prof.load(run_dir)
    c = run.collectives
    line = f"mismatch.py:{line_of(script, 'MISMATCH')}"
    both = c[c["seq"] == 2]
    assert sorted(both["rank"]) == [0, 1] and set(both["op"]) == {"all_reduce"} and set(both["group"]) == {"0"}
    assert dict(zip(both["rank"], both["bytes"])) == {0: 4000, 1: 8000}
    assert set(both["status"]) <= {"failed", "in_flight"}, both[["rank", "status"]]
    # a rank that lived to close its capture knows the issuing line; an aborted one's row comes
    # from its in-flight file, which has none
    closed = dict(zip(run.health["rank"], run.health["closed"]))
    assert sorted(closed.values()) == [False, True]
    for row in both.itertuples():
        assert row.user_source == (line if closed[row.rank] else "")
    assert (c[c["seq"] == 1]["status"] == "completed").all()


HANG = """
import datetime, faulthandler, sys, time
import torch
import torch.distributed as dist
import neuron_prof

faulthandler.dump_traceback_later(120, exit=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(int(sys.argv[2])):
        dist.all_reduce(torch.ones(16))
        prof.step()
    if rank == 0:
        dist.all_reduce(torch.ones(256))  # STUCK: rank 1 never joins
    else:
        time.sleep(120)
"""


@pytest.mark.parametrize("steps", [0, 2])
def test_rank_killed_in_a_collective_leaves_it_in_flight(tmp_path, steps):
    """Rank 0 all-reduces, rank 1 never joins; both are killed with SIGKILL. With steps=0 nothing
    was ever flushed: rank 0's in-flight file alone holds the collective (and its group is not
    known); with steps=2 the earlier collectives come from the tables."""
    script = write_script(tmp_path / "hang.py", HANG)
    run_dir, port = tmp_path / "run", free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(run_dir), str(steps)], cwd=tmp_path, env={**os.environ,
                              **gloo_env(r, 2, port)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for r in range(2)]
    try:
        deadline = time.monotonic() + 90
        # the all-reduce rank 1 never joins: an earlier one is in flight too while rank 1 is late to it
        # (a loaded machine), and killing then would catch the ranks before the hang
        while not (stuck_collectives(run_dir)["seq"] == steps + 1).any():
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "rank 0 never got stuck"
            time.sleep(0.3)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.communicate(timeout=30)
    finally:
        for p in procs:
            kill_group(p)
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2
    assert (run_dir / "rank-00000" / INFLIGHT).is_file()
    run = neuron_prof.load(run_dir)
    assert not run.health["closed"].any()
    c = run.collectives
    (stuck,) = c[(c["rank"] == 0) & (c["status"] == "in_flight")].itertuples()
    assert (stuck.op, str(stuck.group), stuck.seq, stuck.bytes, stuck.done) == ("all_reduce", "0", steps + 1, 1024, -1)
    assert (stuck.group_size, stuck.group_desc) == ((2, "default_pg") if steps else (0, ""))
    # the all-reduces before it completed on both ranks; rank 1 never issued the last
    assert sorted(zip(c["rank"], c["seq"], c["status"].astype(str))) == sorted(
        [(r, s, "completed") for r in (0, 1) for s in range(1, steps + 1)] + [(0, steps + 1, "in_flight")])
