"""Source lines as neuron_prof shows them: the user's files relative to the working directory,
installed packages as ``package/module.py``; the user's own line next to a library's; full paths
in exported traces.

The real run: a training script whose loss comes from a throwaway package in a ``site-packages``
folder (put on ``sys.path`` by the script), recorded with ``neuron-prof record`` from the
script's folder. The script keeps every step's loss (``history.append(loss)``), so memory leaks
from the package's line, called from the script's.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import cli, line_of, shown, viewer_page, write_script
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.paths import display_path, is_user_file

LIBRARY = """
def mse(pred, target):
    diff = pred - target
    return diff.pow(2).mean()  # LIB-LOSS-LINE
"""

TRAIN = """
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))
import torch
from leakylib.loss import mse

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for step in range(8):
    loss = mse(model(torch.randn(8, 16)), torch.randn(8, 1))  # USER-CALL-LINE
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss)
"""


@pytest.fixture(scope="module")
def library_run(tmp_path_factory):
    """(run dir, the library module's path, the script's path)."""
    tmp = tmp_path_factory.mktemp("paths")
    pkg = tmp / "site-packages" / "leakylib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    lib = write_script(pkg / "loss.py", LIBRARY)
    script = write_script(tmp / "train.py", TRAIN)
    res = cli("record", "-o", tmp / "run", "--", sys.executable, script.name, cwd=tmp)
    assert res.returncode == 0, res.stderr
    return tmp / "run", lib, script


def _lines(lib: Path, script: Path) -> tuple[str, str]:
    return f"leakylib/loss.py:{line_of(lib, 'LIB-LOSS-LINE')}", f"train.py:{line_of(script, 'USER-CALL-LINE')}"


def test_display_rule_on_real_files():
    import json as stdlib_json
    import torch
    # the standard library as its module path, an installed package from the package on
    assert display_path(stdlib_json.__file__, None) == os.path.join("json", "__init__.py")
    assert display_path(torch.__file__, None) == os.path.join("torch", "__init__.py")
    assert not is_user_file(stdlib_json.__file__) and not is_user_file(torch.__file__)
    # the user's own file relative to the working directory, even with a virtualenv inside it
    here = str(Path(__file__).resolve())
    assert display_path(here, str(Path(here).parents[1])) == os.path.join("tests", "test_paths.py")
    assert is_user_file(here)
    venv_in_project = os.path.join(str(Path(here).parents[1]), ".venv", "lib", "python3.11", "site-packages",
                                   "transformers", "loss", "loss_utils.py")
    assert display_path(venv_in_project, str(Path(here).parents[1])) == os.path.join("transformers", "loss",
                                                                                    "loss_utils.py")
    # anything else as it is
    assert display_path("/elsewhere/a.py", "/proj") == "/elsewhere/a.py" and is_user_file("/elsewhere/a.py")
    assert display_path("<frozen runpy>", "/proj") == "<frozen runpy>" and not is_user_file("<frozen runpy>")


def test_run_tables_show_short_sources_and_the_users_line(library_run):
    run_dir, lib, script = library_run
    lib_line, user_line = _lines(lib, script)
    run = neuron_prof.load(run_dir)
    ops = run.ops[run.ops["source"] == lib_line]
    assert set(ops["name"].astype(str)) >= {"aten::pow", "aten::mean"}
    assert set(ops["user_source"].astype(str)) == {user_line}
    assert set(ops["source_full"].astype(str)) == {f"{lib}:{line_of(lib, 'LIB-LOSS-LINE')}"}
    # a line of the user's file is its own user line
    mine = run.ops[run.ops["source"] == user_line]
    assert len(mine) and set(mine["user_source"].astype(str)) == {user_line}
    # no source anywhere is an absolute path into the run's folder
    for table in (run.ops, analyze(run).memory_allocations, analyze(run).memory_peaks, analyze(run).memory_leaks):
        for col in ("source", "user_source"):
            assert not any(str(s).startswith(str(lib.parents[2])) for s in table[col].unique()), (col, table)


def test_leak_names_the_library_line_and_the_users_call(library_run):
    run_dir, lib, script = library_run
    lib_line, user_line = _lines(lib, script)
    run = neuron_prof.load(run_dir)
    leaks = analyze(run).memory_leaks
    (site,) = leaks[leaks["source"] == lib_line].itertuples()
    assert site.user_source == user_line and site.op == "aten::mean" and site.grad
    report = cli("report", run_dir)
    assert report.returncode == 0, report.stderr
    out = report.stdout
    # the finding (first lines of the report, and the Overview's cards) names both lines: the user's
    # call in the loop where the leaked blocks were made, then the library line that allocated them
    assert f"from {user_line} via {lib_line} aten::mean, kept alive by " in out
    summary = json.loads(cli("report", run_dir, "--json").stdout)
    (leak,) = [x for x in summary["memory"]["leaks"] if x["source"] == lib_line]
    assert leak["user_source"] == user_line
    # the leak table has the "called from" column, and no path into the temporary folder
    table = out[out.index("!! LEAK"):]
    header = next(line for line in table.splitlines() if "surviving allocations from" in line)
    assert "called from" in header and user_line in table
    assert str(lib.parents[1]) not in out


def test_viewer_shows_short_sources_and_the_users_line(library_run, monkeypatch):
    run_dir, lib, script = library_run
    lib_line, user_line = _lines(lib, script)
    at = viewer_page(monkeypatch, run_dir, "memory", "Memory")
    (table,) = [d.value for d in at.dataframe if "bytes_per_step" in d.value.columns]
    row = table[table["source"] == lib_line]
    assert len(row) == 1 and row["user_source"].iloc[0] == user_line
    overview = viewer_page(monkeypatch, run_dir, "overview")
    texts = shown(" ".join(str(e.value) for e in (*overview.markdown, *overview.error, *overview.warning,
                                                  *overview.info)))
    assert f"from {user_line} via {lib_line} aten::mean, kept alive by " in texts
    assert str(lib.parents[1]) not in texts


def test_exported_trace_keeps_full_paths(library_run, tmp_path):
    run_dir, lib, _ = library_run
    full = f"{lib}:{line_of(lib, 'LIB-LOSS-LINE')}"
    res = cli("export", run_dir, "--format", "chrome", "-o", tmp_path / "t.json")
    assert res.returncode == 0, res.stderr
    events = json.loads((tmp_path / "t.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    sources = {e["args"]["source"] for e in events if e.get("ph") == "X" and "source" in e.get("args", {})}
    assert full in sources
    assert not any(s.startswith("leakylib/") for s in sources)
    res = cli("export", run_dir, "-o", tmp_path / "t.perfetto-trace")
    assert res.returncode == 0, res.stderr
    assert full.encode() in (tmp_path / "t.perfetto-trace").read_bytes()
