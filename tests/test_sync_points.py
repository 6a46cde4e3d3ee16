"""A deliberate .item() in the loop is reported as a sync point at its exact file:line."""
from __future__ import annotations

import json
import subprocess
import sys

import neuron_prof
from conftest import cli, line_of, write_script

SCRIPT = """
import sys
import torch
import neuron_prof

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with neuron_prof.profile(sys.argv[1]) as prof:
    for i in range(4):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() > 1e9:  # SYNC-HERE
            print("diverged")
        mask = torch.randn(8) > 0
        idx = mask.nonzero()  # NONZERO-HERE
        if i == 0:
            print(loss.detach())  # PRINT-HERE
        prof.step()
"""


def test_item_nonzero_and_print_are_reported_at_their_lines(tmp_path):
    script = write_script(tmp_path / "train_sync.py", SCRIPT)
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, str(script), str(run_dir)], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    item_line, nz_line = line_of(script, "SYNC-HERE"), line_of(script, "NONZERO-HERE")
    print_line = line_of(script, "PRINT-HERE")

    rep = cli("report", run_dir, "--json")
    assert rep.returncode == 0, rep.stderr
    by_source = {(r["source"], r["name"]): r for r in json.loads(rep.stdout)["sync_points"]["by_source"]}
    item = by_source[(f"train_sync.py:{item_line}", "aten::_local_scalar_dense")]
    assert item["count"] == 4 and item["per_step"] == 1.0
    assert by_source[(f"train_sync.py:{nz_line}", "aten::nonzero")]["count"] == 4
    # printing a tensor reads its values (formatting calls .item() and masked_select)
    assert (f"train_sync.py:{print_line}", "aten::masked_select") in by_source
    assert {src for src, _ in by_source} == {f"train_sync.py:{line}" for line in (item_line, nz_line, print_line)}

    text = cli("report", run_dir).stdout
    assert f"train_sync.py:{item_line}" in text and f"train_sync.py:{print_line}" in text

    ops = neuron_prof.load(run_dir).ops
    item_ops = ops[(ops["name"] == "aten::item") & (ops["source"] == f"train_sync.py:{item_line}")]
    assert len(item_ops) == 4 and set(item_ops["step"]) == {0, 1, 2, 3}
