"""Graph-break investigation end to end: capture, report (text and JSON), Perfetto compile track."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
import torch._dynamo

import neuron_prof
from conftest import GRAPH_BREAK_CLASSES, capture_graph_breaks, check_trace, cli, line_of
from neuron_prof.examples import graph_breaks

@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> Path:
    return capture_graph_breaks(tmp_path_factory.mktemp("compile") / "run", "inductor")


def _site_lines(src: Path) -> dict[str, int]:
    return {marker: line_of(src, marker) for marker in GRAPH_BREAK_CLASSES}


def test_report_json_lists_every_break_site_with_its_class_and_hits(compiled_run):
    res = cli("report", compiled_run, "--json")
    assert res.returncode == 0, res.stderr
    c = json.loads(res.stdout)["compile"]
    src = Path(inspect.getsourcefile(graph_breaks)).resolve()
    lines = _site_lines(src)
    sites = {(int(s["source"].rsplit(":", 1)[1]), s["reason_class"]): s for s in c["break_sites"]}
    assert c["graph_breaks"] == len(GRAPH_BREAK_CLASSES) == len(sites)
    for marker, cls in GRAPH_BREAK_CLASSES.items():
        site = sites[(lines[marker], cls)]
        assert (Path.cwd() / site["source"].rsplit(":", 1)[0]).resolve() == src
        assert site["hits"] == 3  # called once per step, three steps
    assert c["recompiles"] >= 2
    reasons = " ".join(r for f in c["recompiles_by_frame"] for r in f["reasons"])
    assert "size mismatch" in reasons and "dtype" in reasons
    assert c["frames_compiled"] >= 7 and c["compile_ms"] > 0


def test_report_text_has_the_compile_section(compiled_run):
    text = cli("report", compiled_run).stdout
    assert "Graph breaks by site" in text and "graph_breaks.py:" in text and "recompiles of" in text
    # the frame that recompiled is named with its file as every source line is: relative to the cwd
    src = Path(inspect.getsourcefile(graph_breaks)).resolve()
    assert f"recompiles of step ({src.relative_to(Path.cwd())}:" in text and f"({src}:" not in text


def test_perfetto_compile_track_breaks_and_flows(compiled_run, tmp_path):
    out = tmp_path / "c.perfetto-trace"
    assert cli("export", compiled_run, "-o", out).returncode == 0
    report = check_trace(out)
    run = neuron_prof.load(compiled_run)
    tracks = {u: t["name"] for u, t in report.tracks.items()}
    compile_track = [u for u, n in tracks.items() if n == "Compile"]
    assert len(compile_track) == 1
    spans = [s for s in report.slices if s[0] == compile_track[0] and s[4].startswith("compile ")]
    assert len(spans) == len(run.compiles)
    instants = [s for s in report.slices if tracks.get(s[0]) == "Graph breaks" and s[4].startswith("graph break")]
    assert len(instants) == len(run.graph_breaks)
    assert report.flows and all(f[1][2].startswith("compile ") and f[2][2].startswith("Torch-Compiled Region")
                                for f in report.flows)


def test_a_run_without_compile_reports_none(demo_run):
    c = json.loads(cli("report", demo_run, "--json").stdout)["compile"]
    assert c["graph_breaks"] == 0 and c["recompiles"] == 0 and c["frames_compiled"] == 0


def test_resumed_frames_run_nested_and_self_times_add_up(compiled_run):
    from neuron_prof.analysis.compile import region_runs
    run = neuron_prof.load(compiled_run)
    runs = region_runs(run.ops)
    assert len(runs) == 7 * 3  # 7 compiled frames (the function + 6 resume frames), once per step
    for step, grp in runs.groupby("step"):
        outer = grp.sort_values("ts").iloc[0]
        assert outer["compile_id"].startswith("0/")
        # every region of the step lies inside the outermost one, and self times tile it
        assert ((grp["ts"] >= outer["ts"]) & (grp["ts"] + grp["dur"] <= outer["ts"] + outer["dur"])).all()
        assert grp["self_ns"].sum() == outer["dur"]


LIMIT = """
import sys
import torch
import torch._dynamo
import neuron_prof

torch._dynamo.config.recompile_limit = 1
torch._dynamo.config.automatic_dynamic_shapes = False


def scale(x):
    return x * 2 + 1


compiled = torch.compile(scale, backend="eager")
with neuron_prof.profile(sys.argv[1]) as prof:
    for n in (2, 3, 4):
        compiled(torch.randn(n))
        prof.step()
"""


def test_hitting_the_recompile_limit_is_flagged(tmp_path):
    import subprocess
    import sys
    from conftest import write_script
    script = write_script(tmp_path / "limit.py", LIMIT)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    c = json.loads(cli("report", tmp_path / "run", "--json").stdout)["compile"]
    assert c["cache_limit_hit"] is True
    assert [f["func"] for f in c["recompiles_by_frame"] if f["cache_limit_hit"]] == ["scale"]
    assert "recompile (cache size) limit was hit" in cli("report", tmp_path / "run").stdout


def test_the_chromium_hook_feeds_phases_and_is_removed_on_stop(compiled_run, tmp_path):
    from torch._dynamo.utils import ChromiumEventLogger
    phases = neuron_prof.load(compiled_run).compile_phases
    assert {"backend compile", "dynamo: bytecode tracing"} <= set(phases["phase"].astype(str))
    before = ChromiumEventLogger._log_timed_event
    with neuron_prof.profile(tmp_path / "r", collectors=["compiler"]):
        assert ChromiumEventLogger._log_timed_event is not before
    assert ChromiumEventLogger._log_timed_event is before
