"""`neuron-prof import TORCH_TRACE_DIR`: the compile logs tlparse reads, as a run. One process
compiles under TORCH_TRACE and under neuron_prof's compiler collector at once: the imported run
has the captured run's compiles, graph breaks (site, class, GB id) and recompiles."""
from __future__ import annotations

import os
import subprocess
import sys

import neuron_prof
from conftest import cli, line_of, write_script

SCRIPT = """
import sys, torch, neuron_prof

def f(x, n):
    y = x.sin()
    if y.sum() > 0:  # BREAK-LINE
        y = y * 2
    return y.cos() + n

g = torch.compile(f, backend="eager")
with neuron_prof.profile(sys.argv[1], collectors=["compiler"]):
    for i in range(3):
        g(torch.ones(8), i)  # the int changes: a recompile
    g(torch.ones(4, 4), 0)  # the rank changes: another
"""


def _frame(df):
    return sorted(zip(df["compile_id"].astype(str), df["func"].astype(str), df["status"].astype(str),
                      df["graph_ops"].astype(int)))


def test_compiles_breaks_and_recompiles_are_the_collectors(tmp_path):
    script = write_script(tmp_path / "train.py", SCRIPT)
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace")}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "captured")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = cli("import", tmp_path / "trace", "-o", tmp_path / "imported")
    assert imported.returncode == 0, imported.stderr
    a, b = neuron_prof.load(tmp_path / "captured"), neuron_prof.load(tmp_path / "imported")
    assert len(a.compiles) >= 4 and _frame(b.compiles) == _frame(a.compiles)
    assert f"{len(a.compiles)} compiles" in imported.stdout
    site = f"{script}:{line_of(script, '# BREAK-LINE')}"
    for run in (a, b):
        assert set(run.graph_breaks["source_full"].astype(str)) == {site}
    key = ["compile_id", "gb_id", "reason_class", "reason"]
    assert (b.graph_breaks[key].astype(str).sort_values(key).values.tolist()
            == a.graph_breaks[key].astype(str).sort_values(key).values.tolist())
    assert sorted(b.recompiles["reason"].astype(str)) == sorted(a.recompiles["reason"].astype(str))
    assert sorted(b.recompiles["compile_id"].astype(str)) == sorted(a.recompiles["compile_id"].astype(str))
    report = cli("report", tmp_path / "imported")
    assert report.returncode == 0 and "data-dependent branch" in report.stdout


def test_a_folder_without_compile_logs_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    done = cli("import", tmp_path / "empty", "-o", tmp_path / "run")
    assert done.returncode == 2 and "no dedicated_log_torch_trace_*.log" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "dedicated_log_torch_trace_x.log").write_text("not a log\n\tnor this\n")
    done = cli("import", tmp_path / "junk", "-o", tmp_path / "run")
    assert done.returncode == 2 and "hold no compile" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
