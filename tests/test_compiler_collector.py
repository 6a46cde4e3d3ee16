"""The compiler collector on real ``torch.compile`` (dynamo + aot_eager / Inductor / a callable).

Workload: examples/graph_breaks.py (six graph breaks, a size recompile and a dtype recompile).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
import torch

from neuron_prof.collectors import compiler as compiler_mod
from neuron_prof.collectors.compiler import CompilerCollector, reason_class, report_cache, report_fusion
from neuron_prof.examples import graph_breaks as gb
from neuron_prof.store.schema import TABLES

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace:UserWarning")

EXAMPLE = Path(gb.__file__).resolve()
EXPECTED_CLASSES = {
    "print": "print",
    "item": "data-dependent branch",  # `if y.sum().item() > 0:` breaks at .item(), for the branch
    "skipped": "skipped C function",
    "generator": "generator next()",
    "numpy": "numpy",
    "graph_break": "explicit graph_break()",
}
COMPILER_TABLES = ("compiles", "compile_phases", "graph_breaks", "recompiles", "fusions", "compile_cache")
STRING_COLS = {"compile_id", "func", "file", "backend", "status", "fail_reason", "phase", "gb_id", "reason",
               "reason_class", "kernel", "cache", "result"}


def line_of(marker: str) -> int:
    for i, line in enumerate(EXAMPLE.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(f"{marker!r} not in {EXAMPLE}")


class FakeRecorder:
    """Our own Recorder protocol (neuron_prof.recording.api), kept in memory with real interning."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {"": 0}
        self.stacks: dict[tuple, int] = {(): 0}
        self.tables: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.failures: list[tuple[str, BaseException]] = []

    def intern(self, s: str) -> int:
        assert isinstance(s, str)
        return self.strings.setdefault(s, len(self.strings))

    def intern_stack(self, frames) -> int:
        key = tuple((str(f), str(fn), int(ln)) for f, fn, ln in frames)
        return self.stacks.setdefault(key, len(self.stacks))

    def append(self, table, columns) -> None:
        assert table in TABLES, table
        assert list(columns) == TABLES[table].names, (table, list(columns))
        lens = {len(v) for v in columns.values()}
        assert len(lens) == 1, f"ragged columns for {table}: {lens}"
        for k, v in columns.items():
            self.tables[table][k].extend(list(v))

    def dropped(self, table, n) -> None:
        pass

    def failure(self, collector, exc) -> None:
        self.failures.append((collector, exc))

    def frame(self, table: str) -> pd.DataFrame:
        t = self.tables.get(table)
        if not t:
            return pd.DataFrame(columns=TABLES[table].names)
        df = pd.DataFrame(dict(t))
        strs = {v: k for k, v in self.strings.items()}
        stacks = {v: k for k, v in self.stacks.items()}
        for c in df.columns:
            if c in STRING_COLS:
                df[c] = df[c].map(strs)
            elif c == "stack":
                df[c] = df[c].map(stacks)
            elif c == "nodes":
                df[c] = df[c].map(lambda ids: [strs[i] for i in ids])
        return df


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def capture(fn, fusions=True):
    """Install a collector, run ``fn``, flush (keep=False: compiler rows are kept anyway), uninstall."""
    rec = FakeRecorder()
    col = CompilerCollector(fusions=fusions)
    t0 = time.monotonic_ns()
    col.install(rec)
    assert not rec.failures, rec.failures
    try:
        out = fn()
    finally:
        col.flush(rec, False)
        col.uninstall()
    t1 = time.monotonic_ns()
    rec.t0, rec.t1, rec.out = t0, t1, out
    return rec


_RUNS: dict = {}


def example_run(backend):
    """One capture of examples/graph_breaks.run per backend, shared by the tests below."""
    key = backend if isinstance(backend, str) else backend.__name__
    if key not in _RUNS:
        torch._dynamo.reset()
        _RUNS[key] = capture(lambda: gb.run(backend))
        torch._dynamo.reset()
    return _RUNS[key]


def my_backend(gm: torch.fx.GraphModule, example_inputs):
    """A custom callable backend: runs the dynamo graph as is."""
    return gm.forward


def innermost(stack) -> tuple[str, int]:
    f, _, ln = stack[0]
    return os.path.abspath(f), ln


# ------------------------------------------------------------------ graph breaks
@pytest.mark.parametrize("backend", ["aot_eager", my_backend], ids=["aot_eager", "callable"])
def test_graph_breaks_classes_and_lines(backend):
    rec = example_run(backend)
    br = rec.frame("graph_breaks")
    assert len(br) > 0
    br["site"] = br["stack"].map(innermost)
    # every break's innermost frame is a line of the example, never torch
    assert all(f == str(EXAMPLE) for f, _ in br.site), br.site.tolist()
    sites = {line_of(f"# BREAK:{m}"): cls for m, cls in EXPECTED_CLASSES.items()}
    assert br.site.map(lambda s: s[1]).nunique() == 6
    by_line = br.groupby(br.site.map(lambda s: s[1]))["reason_class"].agg(set).to_dict()
    assert by_line == {ln: {cls} for ln, cls in sites.items()}
    # 3 compiles of each of the 6 breaking frames (f32 (8,4), f32 (16,4), f64 (16,4))
    assert len(br) == 18
    assert set(br.gb_id.str.match(r"^GB\d{4}$")) == {True}
    assert br.reason.str.len().min() > 20 and not br.reason.str.contains("Traceback").any()
    # break rows point at a compile of this capture
    assert set(br.compile_id) <= set(rec.frame("compiles").compile_id)
    assert ((br.ts >= rec.t0) & (br.ts <= rec.t1)).all()


def test_graph_break_stack_has_user_callers():
    br = example_run("aot_eager").frame("graph_breaks")
    stack = br["stack"].iloc[0]
    files = [os.path.abspath(f) for f, _, _ in stack]
    assert files[0] == str(EXAMPLE) and stack[1][1] == "run"  # break in step(), called from run()
    assert os.path.abspath(__file__) in files  # ... called from this test
    assert not any("/torch/" in f for f in files)


def test_no_breaks_gives_no_graph_break_rows():
    rec = capture(lambda: torch.compile(gb.no_breaks, backend="aot_eager")(torch.randn(8, 4)))
    assert len(rec.frame("graph_breaks")) == 0
    comp = rec.frame("compiles")
    assert len(comp) == 1
    row = comp.iloc[0]
    assert (row.func, row.status, row.backend) == ("no_breaks", "ok", "aot_eager")
    assert row.file == str(EXAMPLE) and row.line == line_of("def no_breaks")
    assert row.graph_ops >= 5 and row.guards > 0 and row.cache_size == 0
    assert len(rec.frame("recompiles")) == 0


def test_cross_check_with_dynamo_explain():
    x = torch.randn(8, 4)
    rec = capture(lambda: torch._dynamo.explain(gb.step)(x))
    explained = rec.out
    br = rec.frame("graph_breaks")
    assert explained.graph_break_count == len(explained.break_reasons) == len(br) == 6
    ours = sorted(zip(br["stack"].map(lambda s: s[0][2]), br.reason))
    theirs = sorted((r.user_stack[-1].lineno, r.reason.strip()) for r in explained.break_reasons)
    assert [ln for ln, _ in ours] == [ln for ln, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        assert a == b or a.startswith(b.splitlines()[0]), (a, b)
    assert len(rec.frame("compiles")) == explained.graph_count == 7


def test_reason_class_mapping_of_unknown_text():
    assert reason_class("Some brand new thing\n  Explanation: whatever") == "Some brand new thing"
    assert reason_class("Call to `torch._dynamo.graph_break()`\n  Explanation: x") == "explicit graph_break()"
    assert reason_class("Data-dependent branching\n  Explanation: x") == "data-dependent branch"
    item = "Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: x"
    assert reason_class(item, source_line="    n = int(x.sum().item())") == "Tensor.item()"
    assert reason_class(item, source_line="    if x.sum().item() > 0:") == "data-dependent branch"


# ------------------------------------------------------------------ recompiles and compiles
@pytest.mark.parametrize("backend", ["aot_eager", my_backend], ids=["aot_eager", "callable"])
def test_recompiles_name_the_failed_guards(backend):
    rec = example_run(backend)
    rc = rec.frame("recompiles")
    size = rc[rc.reason.str.contains("size mismatch at index 0. expected 8, actual 16")]
    dtype = rc[rc.reason.str.contains("dtype mismatch. expected Float, actual Double")]
    assert len(size) == 7 and len(dtype) == 14  # 7 frames; the f64 call fails both cached entries
    assert len(rc) == 21
    step = rc[rc.compile_id == "0/1"]
    assert step.func.tolist() == [f"step ({EXAMPLE}:{line_of('def step')})"]
    assert "tensor 'x' size mismatch" in step.reason.iloc[0]


@pytest.mark.parametrize("backend", ["aot_eager", my_backend], ids=["aot_eager", "callable"])
def test_compile_rows(backend):
    rec = example_run(backend)
    comp = rec.frame("compiles")
    name = backend if isinstance(backend, str) else backend.__name__
    assert len(comp) == 21 and comp.compile_id.is_unique
    assert set(comp.backend) == {name}
    assert set(comp.status) == {"ok"}
    assert set(comp.file) == {str(EXAMPLE)}
    assert set(comp.cache_size) == {0, 1, 2}
    assert (comp.dur > 0).all() and (comp.tid == threading.get_native_id()).all()
    assert ((comp.ts >= rec.t0) & (comp.ts + comp.dur <= rec.t1)).all()
    first = comp[comp.compile_id == "0/0"].iloc[0]
    assert (first.func, first.line) == ("step", line_of("def step"))
    # the user stack that called into the frame: run() in the example, innermost first
    assert first["stack"][0][1] == "run" and os.path.abspath(first["stack"][0][0]) == str(EXAMPLE)
    assert not any("/torch/" in f for f, _, _ in first["stack"])


def test_compile_phases_fit_in_their_compile():
    rec = example_run("aot_eager")
    comp = rec.frame("compiles").set_index("compile_id")
    ph = rec.frame("compile_phases")
    assert {"dynamo: bytecode tracing", "backend compile", "aot autograd", "guards"} <= set(ph.phase)
    assert set(ph.compile_id) == set(comp.index)
    for cid, g in ph.groupby("compile_id"):
        c = comp.loc[cid]
        top = g[g.depth == 0]
        assert top.dur.sum() <= c.dur, cid
        assert (g.ts >= c.ts).all() and (g.ts + g.dur <= c.ts + c.dur).all(), cid
        assert (g.tid == c.tid).all()
    assert ph.depth.max() >= 1  # aot autograd nests in backend compile


def _with_python_ctx(x):
    with _ctx():
        x = x + 1
        print("graph break in a user context manager: dynamo skips the frame")  # BREAK-IN-CTX
        return x * 2


@contextlib.contextmanager
def _ctx():
    yield


def test_compile_status_failed_skipped_no_graph():
    def exploding(gm, example_inputs):
        raise RuntimeError("backend exploded")

    def python_only(x):
        return [1, 2, 3]

    def strict(x):
        print("fullgraph=True makes this an error")
        return x + 1

    def run_all():
        with pytest.raises(Exception, match="backend exploded"):
            torch.compile(lambda x: x + 1, backend=exploding)(torch.randn(2))
        torch.compile(python_only, backend="eager")(torch.randn(2))
        torch.compile(_with_python_ctx, backend="eager")(torch.randn(2))
        with pytest.raises(Exception):
            torch.compile(strict, backend="eager", fullgraph=True)(torch.randn(2))

    rec = capture(run_all)
    comp = rec.frame("compiles").set_index("func")
    assert comp.loc["<lambda>", "status"] == "failed" and comp.loc["<lambda>", "backend"] == "exploding"
    assert "backend exploded" in comp.loc["<lambda>", "fail_reason"]
    assert comp.loc["python_only", "status"] == "no graph"
    assert comp.loc["_with_python_ctx", "status"] == "skipped"
    assert comp.loc["strict", "status"] == "failed" and "print" in comp.loc["strict", "fail_reason"]
    br = rec.frame("graph_breaks")
    assert br.reason_class.tolist() == ["print"]
    assert br["stack"].iloc[0][0][2] == _with_python_ctx.__code__.co_firstlineno + 3


# ------------------------------------------------------------------ Inductor: fusions and caches
def test_inductor_fusions_name_dynamo_graph_nodes():
    import torch._inductor.config as inductor_config

    before = inductor_config.trace.provenance_tracking_level
    graph_nodes: set[str] = set()
    levels = []

    def spy(gm, example_inputs):  # the graph dynamo hands the backend, then Inductor
        graph_nodes.update(n.name for n in gm.graph.nodes)
        levels.append(inductor_config.trace.provenance_tracking_level)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    x = torch.randn(8, 4)
    rec = capture(lambda: torch.compile(gb.no_breaks, backend=spy)(x))
    assert levels == [before] == [0]  # no setting that enters Inductor's cache key is touched
    fu = rec.frame("fusions")
    assert len(fu) >= 1, "no kernel seen"
    assert set(fu.backend) == {"inductor"} and set(fu.compile_id) == {"0/0"}
    assert fu.kernel.str.contains("fused").any()
    nodes = {n for ns in fu.nodes for n in ns}
    assert nodes <= graph_nodes, (nodes, graph_nodes)
    assert {"relu", "mul", "sigmoid", "cos"} <= nodes
    cache = rec.frame("compile_cache")
    assert set(cache.cache) >= {"fx_graph", "aot_autograd"}
    assert set(cache.result) <= {"hit", "miss", "bypass"}
    phases = set(rec.frame("compile_phases").phase)
    assert "backend compile" in phases
    # which phases run depends on what Inductor's caches already hold on this machine
    aot = set(cache[cache.cache == "aot_autograd"].result)
    fx = set(cache[cache.cache == "fx_graph"].result)
    if "miss" in aot:
        assert "inductor: compile_fx_inner" in phases
    else:
        assert "aot autograd cache: load" in phases
    if "miss" in fx:
        assert "inductor: codegen" in phases


def test_inductor_fx_graph_cache_hit_still_reports_fusions():
    """The second compile of the same graph loads it from Inductor's FX graph cache, which skips
    kernel codegen: the fusion record kept in the cache directory at the first compile (read by
    a new collector, as a later process would) must supply the rows."""
    x = torch.randn(8, 4)
    runs = []
    for _ in range(2):
        torch._dynamo.reset()
        runs.append(capture(lambda: torch.compile(gb.no_breaks)(x)))
    second = runs[1].frame("compile_cache")
    assert ["fx_graph", "hit"] in second[["cache", "result"]].values.tolist()
    first, again = (r.frame("fusions")[["kernel", "nodes"]].values.tolist() for r in runs)
    assert again == first and any("fused" in k for k, _ in again)


# ------------------------------------------------------------------ lifecycle and API
def _hook_points():
    """What the collector replaces, as torch has it right now."""
    import logging

    import torch._inductor.codecache as codecache
    import torch._inductor.codegen.cpp as cpp_codegen
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.debug as inductor_debug
    from torch._dynamo import convert_frame
    from torch._dynamo import utils as dynamo_utils
    from torch._logging._internal import log_registry, trace_log

    loggers = [logging.getLogger(q) for q in sorted(log_registry.artifact_log_qnames)]
    return {
        "timed": vars(dynamo_utils.ChromiumEventLogger)["_log_timed_event"],
        "metrics": dynamo_utils.log_compilation_event,
        "recompiles": convert_frame.get_and_maybe_log_recompilation_reasons,
        "kernels": inductor_debug.set_kernel_post_grad_provenance_tracing,
        "cpp kernels": cpp_codegen.set_kernel_post_grad_provenance_tracing,
        "graphs": compile_fx.fx_codegen_and_compile,
        "cache_hit": vars(codecache.FxGraphCache)["cache_hit_post_compile"],
        "trace_log": list(trace_log.handlers),
        "loggers": [(lg.name, lg.level, lg.propagate, list(lg.handlers)) for lg in loggers
                    if getattr(lg, "artifact_name", None) == "graph_breaks"],
    }


def test_install_replaces_hooks_and_uninstall_puts_them_back():
    before = _hook_points()
    assert len(before["loggers"]) >= 2
    col = CompilerCollector()
    col.install(FakeRecorder())
    during = _hook_points()
    for key in ("timed", "metrics", "recompiles", "kernels", "cpp kernels", "graphs", "cache_hit"):
        assert during[key] is not before[key], key
    # never a handler on torch's structured trace log: that is what makes torch build every record
    assert during["trace_log"] == before["trace_log"]
    for name, level, propagate, handlers in during["loggers"]:
        assert [type(h) for h in handlers] == [compiler_mod._BreakHandler] and level == 10 and not propagate, name
    col.uninstall()
    col.uninstall()  # twice is fine
    assert _hook_points() == before
    assert compiler_mod._ACTIVE is None


def test_graph_breaks_are_not_printed_unless_the_user_asked(capfd):
    def once():
        torch._dynamo.reset()
        return capture(lambda: torch.compile(gb.step, backend="eager")(torch.randn(8, 4)))

    rec = once()
    assert len(rec.frame("graph_breaks")) == 6
    assert "Graph break" not in capfd.readouterr().err
    torch._logging.set_logs(graph_breaks=True)  # TORCH_LOGS=graph_breaks
    try:
        before = _hook_points()["loggers"]
        rec = once()
        assert len(rec.frame("graph_breaks")) == 6
        assert capfd.readouterr().err.count("Graph break in user code at") == 6  # still theirs
        assert _hook_points()["loggers"] == before
    finally:
        torch._logging.set_logs()


@pytest.mark.parametrize("breakage", ["logger refuses handlers", "torch changed a signature"])
def test_install_failure_is_reported_not_raised(monkeypatch, breakage):
    import logging

    from torch._dynamo import utils as dynamo_utils

    before = _hook_points()
    if breakage == "logger refuses handlers":
        def boom(h):
            raise RuntimeError("no handlers today")

        monkeypatch.setattr(logging.getLogger(before["loggers"][-1][0]), "addHandler", boom)
        expected = "no handlers today"
    else:
        monkeypatch.setattr(dynamo_utils, "log_compilation_event", lambda metrics, extra: None)
        expected = "torch changed"
    rec = FakeRecorder()
    col = CompilerCollector()
    col.install(rec)
    assert [c for c, _ in rec.failures] == ["compiler"] and expected in str(rec.failures[0][1])
    monkeypatch.undo()
    assert _hook_points() == before  # the hooks installed before the failure are gone again
    torch.compile(gb.no_breaks, backend="eager")(torch.randn(2, 2))
    col.flush(rec, True)
    col.uninstall()
    assert not rec.tables


def test_steady_state_calls_record_nothing():
    rec = FakeRecorder()
    col = CompilerCollector()
    col.install(rec)
    try:
        f = torch.compile(gb.no_breaks, backend="eager")
        x = torch.randn(4, 4)
        f(x)
        col.flush(rec, True)
        n = {t: len(rec.frame(t)) for t in COMPILER_TABLES}
        assert n["compiles"] == 1
        for _ in range(50):
            f(x)
        assert not col._raw  # no structured record at all once compiled
        col.flush(rec, True)
        assert {t: len(rec.frame(t)) for t in COMPILER_TABLES} == n
    finally:
        col.uninstall()


def test_report_fusion_and_cache_from_a_custom_backend():
    report_fusion("neuron", "k0", ["a"])  # no collector installed: a no-op
    report_cache("neuron_neff", "hit")
    seen = []

    def neuron(gm, example_inputs):
        names = [n.name for n in gm.graph.nodes if n.op == "call_function"]
        seen.extend(names)
        report_fusion("neuron", "neuron_fused_0", names)
        report_cache("neuron_neff", "miss")
        return gm.forward

    rec = capture(lambda: torch.compile(gb.no_breaks, backend=neuron)(torch.randn(8, 4)))
    fu = rec.frame("fusions")
    assert fu[["compile_id", "backend", "kernel"]].values.tolist() == [["0/0", "neuron", "neuron_fused_0"]]
    assert fu.nodes.iloc[0] == seen and seen
    cache = rec.frame("compile_cache")
    assert cache[["compile_id", "cache", "result"]].values.tolist() == [["0/0", "neuron_neff", "miss"]]
    assert set(rec.frame("compiles").backend) == {"neuron"}
