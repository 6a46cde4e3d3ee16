"""The viewer's Graph breaks / Compile page on real captured runs: every table equals what the
``neuron_prof.analysis.compile`` functions compute on the same run."""
from __future__ import annotations

import base64
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch._dynamo

import neuron_prof
from conftest import GRAPH_BREAK_CLASSES, capture_graph_breaks, line_of, shown, viewer_page, write_script
from neuron_prof.analysis import compile as comp
from neuron_prof.analysis.ops import in_steps
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.steps import basis_steps
from neuron_prof.examples import graph_breaks

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

SRC = Path(inspect.getsourcefile(graph_breaks)).resolve()


@pytest.fixture(scope="module")
def compile_run(tmp_path_factory) -> Path:
    return capture_graph_breaks(tmp_path_factory.mktemp("viewer_compile") / "run", "aot_eager",
                                collectors=["eager", "compiler"])


def _page(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "compile", title="Graph breaks / Compile")


def _table(at: AppTest, column: str) -> pd.DataFrame:
    """The page's (first) table that has ``column``."""
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert found, f"no table with a {column!r} column"
    return found[0]


def _arr(v) -> list:
    """A plotly figure array from its JSON: a list, or a typed array {dtype, bdata[, shape]}."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(p.proto.spec) for p in at.get("plotly_chart")]


def _line(source: str) -> int:
    return int(source.rsplit(":", 1)[1])


def test_break_site_table_has_the_six_sites_of_graph_break_sites(compile_run, monkeypatch):
    at = _page(monkeypatch, compile_run)
    run = neuron_prof.load(compile_run)
    basis = basis_steps(analyze(run).step_kinds, captured_only=True)
    runs = comp.region_runs(run.ops, analyze(run).op_parent, analyze(run).op_compile.compile_ns)
    runs = runs[in_steps(runs, basis.steps)]
    want = comp.graph_break_sites(run.graph_breaks, runs, basis.per_rank)
    got = _table(at, "reason_class")
    assert len(got) == len(want) == 6
    assert list(got["source"]) == list(want["source"])
    assert list(got["reason_class"]) == list(want["reason_class"])
    assert list(got["gb_id"]) == list(want["gb_id"])
    assert list(got["breaks"]) == list(want["breaks"]) == [3] * 6
    assert got["hits_per_step"].tolist() == pytest.approx(want["hits_per_step"].tolist())
    assert got["frame_ms_per_step"].tolist() == pytest.approx(want["frame_ms_per_step"].tolist())
    assert list(got["reason"]) == list(want["reason"])
    # the marked lines of the example, each with its class
    by_line = {(Path(s.rsplit(":", 1)[0]).resolve(), _line(s)): cls
               for s, cls in zip(got["source"], got["reason_class"])}
    assert by_line == {(SRC, line_of(SRC, m)): cls for m, cls in GRAPH_BREAK_CLASSES.items()}
    assert [m.value for m in at.metric if m.label == "graph break sites"] == ["6"]


def test_selecting_a_site_shows_its_stack_and_the_marked_source_line(compile_run, monkeypatch):
    at = _page(monkeypatch, compile_run)
    sites = _table(at, "reason_class")
    src_lines = SRC.read_text().splitlines()
    box = at.selectbox(key="compile_site")
    assert len(box.options) == 6
    seen = set()
    for i, (source, cls) in enumerate(zip(sites["source"], sites["reason_class"])):
        box = at.selectbox(key="compile_site")
        box.select(i).run()
        assert not at.exception, [e.value for e in at.exception]
        line = _line(source)
        marker = next(m for m, c in GRAPH_BREAK_CLASSES.items() if c == cls)
        assert line == line_of(SRC, marker)
        # the user stack: innermost frame is the break line in the example
        stack = _table(at, "function")
        assert Path(stack["file"].iloc[0]).resolve() == SRC and int(stack["line"].iloc[0]) == line
        assert stack["function"].iloc[0] == "step"
        # the source window: the break line's text, marked, with its number
        code = [c.value for c in at.code if re.search(r"^>> +\d+ \| ", c.value, re.M)]
        assert len(code) == 1
        marked = [ln for ln in code[0].splitlines() if ln.startswith(">>")]
        assert len(marked) == 1
        number, text = re.match(r">> +(\d+) \| (.*)$", marked[0]).groups()
        assert int(number) == line and text == src_lines[line - 1] and marker in text
        # the neighbouring lines are the file's too
        for ln in code[0].splitlines():
            n, t = re.match(r"(?:>>|  ) +(\d+) \| (.*)$", ln).groups()
            assert t == src_lines[int(n) - 1]
        seen.add(marker)
    assert seen == set(GRAPH_BREAK_CLASSES)


def test_recompiles_by_frame_list_the_failed_guards(compile_run, monkeypatch):
    at = _page(monkeypatch, compile_run)
    run = neuron_prof.load(compile_run)
    want = comp.recompile_summary(run.recompiles, run.compiles)
    got = _table(at, "recompiles")
    assert list(got["func"]) == list(want["func"])
    assert list(got["recompiles"]) == list(want["recompiles"])
    assert not got["cache_limit_hit"].any()
    guards = [list(r) for r in got["reasons"]]
    assert guards == [list(r) for r in want["reasons"]]
    step_row = [g for f, g in zip(got["func"], guards) if f.startswith("step ")][0]
    assert "tensor 'x' size mismatch at index 0. expected 8, actual 16" in " ".join(step_row)
    assert any("dtype mismatch" in g for g in step_row)
    assert not at.error  # no cache-limit alarm on this run


def test_compile_time_table_phase_chart_and_graph_runs(compile_run, monkeypatch):
    at = _page(monkeypatch, compile_run)
    run = neuron_prof.load(compile_run)
    want = comp.compile_time(run.compiles, run.compile_phases)
    got = _table(at, "total_ms")
    assert list(got["compile_id"]) == list(want["compile_id"]) and len(got) == len(run.compiles) == 21
    assert got["total_ms"].tolist() == pytest.approx(want["total_ms"].tolist())
    # the bar chart: one trace per top-level phase, its bars the table's phase columns
    charts = _charts(at)
    assert len(charts) == 1
    traces = charts[0]["data"]
    top = set(run.compile_phases[run.compile_phases["depth"] == 0]["phase"].astype(str))
    assert {t["name"] for t in traces} == top
    backend = next(t for t in traces if t["name"] == "backend compile")
    bars = dict(zip(_arr(backend["y"]), _arr(backend["x"])))
    for cid, func, ms in zip(want["compile_id"], want["func"], want["backend compile"]):
        assert bars[f"{cid} {func}"] == pytest.approx(ms)
    # compiled graphs at run time: every step of this run compiles, so they are over all three
    basis = basis_steps(analyze(run).step_kinds, captured_only=True)
    assert basis.kind == "all" and basis.per_rank == 3
    runs_want = comp.graph_runs(comp.region_runs(run.ops, analyze(run).op_parent, analyze(run).op_compile.compile_ns), basis.per_rank)
    runs_got = _table(at, "runs_per_step")
    assert list(runs_got["compile_id"]) == list(runs_want["compile_id"])
    assert runs_got["self_ms"].tolist() == pytest.approx(runs_want["self_ms"].tolist())
    assert runs_got["runs"].sum() == 21
    # aot_eager neither fuses nor looks up caches: said plainly, no table
    captions = " ".join(c.value for c in at.caption)
    assert "no fused kernels recorded" in captions and "no cache lookups recorded" in captions


def test_a_run_without_torch_compile_shows_how_to_get_it(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert len(at.info) == 1 and "no torch.compile activity" in shown(at.info[0].value)
    assert "compiler" in at.info[0].value
    assert not at.dataframe and not at.selectbox


LIMIT_AND_BREAK = """
import sys
import torch
import torch._dynamo
import neuron_prof

torch._dynamo.config.recompile_limit = 1
torch._dynamo.config.automatic_dynamic_shapes = False


def scale(x):
    y = x * 2
    torch._dynamo.graph_break()  # BREAK:here
    return y + 1


compiled = torch.compile(scale, backend="eager")
with neuron_prof.profile(sys.argv[1], collectors=["eager", "compiler"]) as prof:
    for n in (2, 3, 4):
        compiled(torch.randn(n))
        prof.step()
"""


def test_cache_limit_is_flagged_and_a_vanished_source_file_is_not_read(tmp_path, monkeypatch):
    script = write_script(tmp_path / "limit_break.py", LIMIT_AND_BREAK)
    line = line_of(script, "BREAK:here")
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    at = _page(monkeypatch, tmp_path / "run")
    assert len(at.error) == 1 and "recompile (cache size) limit was hit" in at.error[0].value
    assert "for scale:" in at.error[0].value
    rec = _table(at, "recompiles")
    assert rec[rec["cache_limit_hit"]]["func"].tolist() == ["scale"]
    # while the script is there its break line is shown ...
    code = [c.value for c in at.code if c.value.startswith(("  ", ">>"))]
    assert any(f">> {line} | " in c and "BREAK:here" in c for c in code)
    # ... once it is gone, the page says so instead of failing
    script.unlink()
    at.selectbox(key="compile_site").select(0).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [c for c in at.code if ">> " in c.value]
    assert any("is not shown: it is not here any more" in shown(c.value) for c in at.caption)
    # the report agrees on the alarm
    from neuron_prof.reports.summary.build import summarize
    assert summarize(neuron_prof.load(tmp_path / "run")).compile.cache_limit_hit is True
