"""The disk budget: a rank's folder stays under ``max_bytes`` plus one step's detail and the
per-step facts of later steps; detail stops there, step statistics go on, the report says where."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import neuron_prof
from conftest import cli, write_script
from neuron_prof.reports.summary.build import summarize
from neuron_prof.store.schema import TABLES, row_dtype
from neuron_prof.capture.buffer import DEFAULT_MAX_BYTES

STEP_FACTS = 128
"""Bytes a step adds once detail stopped, at most: its rows of steps (22 B), memory_steps (44 B, one
device) and process_memory (20 B), with room for Arrow framing and manifest lines."""
FIXED = 16 << 10
"""Files and framing that do not grow with steps: rank.json, stream headers and end markers, the
closing manifest lines."""


def _tiny_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return step


def _folder_bytes(rank_dir: Path) -> int:
    return sum(e.stat().st_size for e in os.scandir(rank_dir) if e.is_file()) if rank_dir.is_dir() else 0


def _row_bytes(table: str) -> int:
    return row_dtype(TABLES[table]).itemsize


def test_small_budget_stops_detail_keeps_every_step_and_says_where(tmp_path):
    run_dir, steps, budget = tmp_path / "run", 400, 300_000
    step = _tiny_mlp()
    with neuron_prof.profile(run_dir, max_bytes=budget) as prof:
        for _ in range(steps):
            step()
            prof.step()

    run = neuron_prof.load(run_dir)
    (cut,) = summarize(run).to_json()["health"]["detail_cuts"]
    n = cut["step"]
    assert cut["by"] == "max_bytes" and cut["limit"] == budget and 0 < n < steps - 100
    assert set(cut["tables"]) >= {"ops", "memory_events"}
    # detail: every step up to the cut, none after; memory allocations stop with it
    assert sorted(run.ops["step"].unique()) == list(range(n + 1))
    cut_end = run.steps.set_index("step").loc[n, ["ts", "dur"]].sum()
    allocs = run.memory_events[run.memory_events["kind"] == "alloc"]
    assert len(allocs) and allocs["ts"].max() <= cut_end
    # step statistics still see every step
    assert int(run.steps["complete"].sum()) == steps and int(run.memory_steps["step"].nunique()) >= steps
    assert summarize(run).to_json()["steps"][0]["steps"] == steps

    # the bound: the budget, plus the detail of the one step whose flush crossed it (the largest
    # step's ops and memory rows, its new strings and manifest line within 4 KiB), plus each later
    # step's facts
    per_step = (run.ops.groupby("step").size() * _row_bytes("ops")).add(
        run.memory_events.groupby("step").size() * _row_bytes("memory_events"), fill_value=0)
    one_step = int(per_step.max()) + 4096
    assert budget <= cut["bytes"] <= budget + one_step
    size = _folder_bytes(run_dir / "rank-00000")
    assert size <= budget + one_step + cut["later_steps"] * STEP_FACTS + FIXED, (size, cut)

    text = cli("report", run_dir).stdout
    assert f"detail stopped after step {n}," in text and "raise with --max-bytes" in text
    assert f"disk budget reached at step {n}" in text
    assert f"of the {steps - 1 - n} later steps were not captured" in text


def test_default_budget_bounds_a_long_small_op_capture(tmp_path):
    """At the defaults, a small-op loop (about 14 kB of rows per step) reaches the budget in
    seconds; the folder never holds more than the budget and one step's detail while detail is on,
    and 2,000 steps after the cut add only their step facts."""
    run_dir = tmp_path / "run"
    rank_dir = run_dir / "rank-00000"
    step = _tiny_mlp()
    after = 0
    with neuron_prof.profile(run_dir) as prof:
        while after < 2000:
            step()
            prof.step()
            if not prof.session.recording:
                after += 1
            elif prof.step_num % 500 == 0:  # an unbounded capture fails here, not after filling the disk
                assert _folder_bytes(rank_dir) <= DEFAULT_MAX_BYTES + (1 << 20), prof.step_num
    size = _folder_bytes(rank_dir)
    last = json.loads((rank_dir / "manifest.jsonl").read_text().splitlines()[-1])
    cut = last["detail_cut"]
    assert cut["by"] == "max_bytes" and DEFAULT_MAX_BYTES <= cut["bytes"] <= DEFAULT_MAX_BYTES + (64 << 10)
    assert size <= cut["bytes"] + 2000 * STEP_FACTS + FIXED, (size, cut)


def test_record_takes_max_bytes(tmp_path):
    script = write_script(tmp_path / "train.py", """
        import torch
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(200):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    """)
    run_dir = tmp_path / "run"
    res = cli("record", "-q", "-o", run_dir, "--max-bytes", "100K", "--", sys.executable, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads((run_dir / "rank-00000" / "rank.json").read_text())["max_bytes"] == 100 << 10
    s = json.loads(cli("report", run_dir, "--json").stdout)
    (cut,) = s["health"]["detail_cuts"]
    assert cut["by"] == "max_bytes" and cut["limit"] == 100 << 10 and cut["later_steps"] > 0
    assert s["steps"][0]["steps"] == 200
