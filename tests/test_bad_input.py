"""Bad input gets one line naming the file and the fix, exit code 2, no traceback, nothing lost."""
from __future__ import annotations

import shutil

import pytest

from conftest import check_trace, cli, one_line_error


def test_missing_run_dir(tmp_path):
    missing = tmp_path / "nope"
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, missing), str(missing), "neuron-prof record")


def test_empty_dir(tmp_path):
    one_line_error(cli("report", tmp_path), str(tmp_path), "not a neuron_prof run", "neuron-prof record")


def test_truncated_table_names_the_file_and_keeps_it(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    table = run / "rank-00000" / "ops.arrows"
    data = table.read_bytes()
    table.write_bytes(data[: len(data) // 2])
    res = cli("report", run)
    one_line_error(res, str(table), "truncated", "re-record")
    assert table.stat().st_size == len(data) // 2  # nothing deleted or rewritten


def test_corrupt_rank_metadata(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    (run / "rank-00000" / "rank.json").write_text("{not json")
    one_line_error(cli("report", run), "rank.json", "unreadable")


@pytest.mark.parametrize("cut", [3, 0.5])
def test_truncated_trace(demo_run, tmp_path, cut):
    trace = tmp_path / "t.perfetto-trace"
    assert cli("export", demo_run, "-o", trace).returncode == 0
    check_trace(trace)
    assert cli("inspect", trace).returncode == 0
    data = trace.read_bytes()
    trace.write_bytes(data[: cut if isinstance(cut, int) else int(len(data) * cut)])
    one_line_error(cli("inspect", trace), str(trace), "truncated", "neuron-prof export")


def test_unknown_flag_and_bad_schedule(demo_run, tmp_path):
    one_line_error(cli("report", demo_run, "--bogus"), "--bogus", "--help")
    one_line_error(cli("record", "--schedule", "1,x", "--", "true"), "invalid schedule")
    one_line_error(cli("export", demo_run, "--format", "svg"), "svg")
    one_line_error(cli("record"), "needs a command")
    one_line_error(cli("record", "--collectors", "nope", "--", "true"), "unknown collector")


KILLED = """
import os
import sys
import torch
import neuron_prof

model = torch.nn.Linear(8, 8)
prof = neuron_prof.profile(sys.argv[1]).start()
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    prof.step()
os._exit(0)  # like kill -9: no close, rows still in the journals
"""


def test_rows_in_the_journal_are_read_and_a_truncated_journal_is_named(tmp_path):
    import subprocess
    import sys

    import neuron_prof
    from conftest import write_script
    script = write_script(tmp_path / "killed.py", KILLED)
    run = tmp_path / "run"
    subprocess.run([sys.executable, str(script), str(run)], check=True)
    journal = run / "rank-00000" / "ops.journal"
    assert journal.stat().st_size > 0 and not (run / "rank-00000" / "ops.arrows").exists()
    loaded = neuron_prof.load(run)
    assert int(loaded.steps["complete"].sum()) == 3 and set(loaded.ops["step"]) == {0, 1, 2}
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 3])
    one_line_error(cli("report", run), str(journal), "truncated", "re-record")
