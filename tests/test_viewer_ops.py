"""The viewer's Ops page on a real run (op table = ``op_stats``, module treemap = ``module_tree``),
and direct tests of the pure functions it lays out."""
from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from conftest import viewer_page
from neuron_prof.analysis.ops import MODULE_ROOT, filter_tree, module_tree, op_stats, run_time_ops, run_time_rows, self_time
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.steps import basis_steps
from neuron_prof.reports.summary.build import summarize

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


def _page(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "ops", title="Ops")


def _arr(v) -> list:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _treemap(at: AppTest) -> dict:
    maps = [t for p in at.get("plotly_chart") for t in json.loads(p.proto.spec)["data"] if t["type"] == "treemap"]
    assert len(maps) == 1
    return maps[0]


def _op_table(at: AppTest) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if "name" in d.value.columns)


def _tree_table(at: AppTest) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if "depth" in d.value.columns)


# --- the page on a real run -------------------------------------------------------------------

def _scope(run):
    """What the report's op table is over: the steady captured steps, compiling left out."""
    basis = basis_steps(analyze(run).step_kinds, captured_only=True)
    cols = ("rank", "step", "tid", "depth", "name", "module", "shapes", "bwd")
    keep = run_time_rows(run.ops, analyze(run).op_compile.inside, basis.steps)
    return run_time_ops(run.ops, keep, analyze(run).op_compile.compile_ns, analyze(run).op_compile.run_self_ns, cols), basis.per_rank


def test_op_table_is_op_stats_over_the_captured_steps(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    run = neuron_prof.load(demo_run)
    ops, n = _scope(run)
    assert n == 3
    want = op_stats(ops)
    got = _op_table(at)
    assert len(got) == len(want)
    top, wtop = got.iloc[0], want.iloc[0]
    shown = str(wtop["module"]) or "-"  # the page spells "no module" as the report does
    assert (top["name"], top["module"], top["calls"]) == (wtop["name"], shown, wtop["calls"])
    assert top["self_ms"] == pytest.approx(wtop["self_ms"]) and top["total_ms"] == pytest.approx(wtop["total_ms"])
    assert top["self_ms_per_step"] == pytest.approx(wtop["self_ms"] / n)
    assert got["self_ms"].tolist() == pytest.approx(want["self_ms"].tolist())
    # and the report's top row is the same op with the same numbers
    rep = summarize(run).to_json()["ops"]["top_by_self_time"][0]
    assert (rep["name"], rep["module"] or "-", rep["calls"]) == (top["name"], top["module"], top["calls"])
    assert rep["self_ms_per_step"] == pytest.approx(top["self_ms_per_step"])
    assert "shapes" not in got.columns


def test_shapes_toggle_groups_by_name_module_and_shapes(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    at.toggle(key="ops_shapes").set_value(True).run()
    assert not at.exception
    run = neuron_prof.load(demo_run)
    ops, _ = _scope(run)
    want = op_stats(ops, ("name", "module", "shapes"))
    got = _op_table(at)
    assert "shapes" in got.columns and len(got) == len(want) > len(op_stats(ops))
    w = want.iloc[0]
    assert tuple(got.iloc[0][["name", "module", "shapes", "calls"]]) == \
        (w["name"], str(w["module"]) or "-", w["shapes"], w["calls"])  # "-": no module, as the report says
    assert got["self_ms"].sum() == pytest.approx(want["self_ms"].sum())


def test_module_treemap_totals_are_the_self_time_of_all_ops(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    run = neuron_prof.load(demo_run)
    ops, _ = _scope(run)
    all_self_ms = ops["self_ns"].sum() / 1e6
    tm = _treemap(at)
    ids, parents, values = _arr(tm["ids"]), _arr(tm["parents"]), _arr(tm["values"])
    assert tm["branchvalues"] == "total"
    tree = dict(zip(ids, values))
    assert tree[MODULE_ROOT] == pytest.approx(all_self_ms)
    want = module_tree(ops, ops["self_ns"].to_numpy())
    assert set(ids) == set(want["id"])
    # every node holds at least its children (a valid "total" treemap), and a module's value is the
    # self time of the ops in it and below it
    for node, value in tree.items():
        kids = [v for i, p, v in zip(ids, parents, values) if p == node]
        assert value >= sum(kids) - 1e-9
    mods = ops["module"].astype(str)
    sa = "layers.0.self_attn"
    below = mods.eq(sa) | mods.str.startswith(sa + ".")
    self_ns = ops["self_ns"].to_numpy()
    assert tree[sa] == pytest.approx(self_ns[below.to_numpy()].sum() / 1e6)
    assert tree["layers"] == pytest.approx(self_ns[mods.str.startswith("layers.").to_numpy()].sum() / 1e6)


def test_module_filter_keeps_matches_their_ancestors_and_submodules(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    at.text_input(key="ops_module_filter").input("self_attn").run()
    assert not at.exception
    ids = _arr(_treemap(at)["ids"])
    assert MODULE_ROOT in ids and "layers" in ids and "layers.0" in ids
    assert "layers.0.self_attn" in ids and "layers.0.self_attn.qkv" in ids
    assert "head" not in ids and "layers.0.mlp" not in ids
    assert set(_tree_table(at)["module"]) == set(ids)
    at.text_input(key="ops_module_filter").input("no-such-module").run()
    assert not at.exception and "no module path contains" in at.info[0].value


# --- the pure functions -----------------------------------------------------------------------

def _ops(rows: list[tuple[int, int, int, str]]) -> pd.DataFrame:
    """(ts, dur, depth, module) on one thread."""
    ts, dur, depth, module = zip(*rows)
    n = len(rows)
    return pd.DataFrame({"rank": np.zeros(n, np.int32), "tid": np.ones(n, np.int64), "ts": np.array(ts, np.int64),
                         "dur": np.array(dur, np.int64), "depth": np.array(depth, np.int16),
                         "module": pd.Categorical(module)})


def test_module_tree_aggregates_self_time_along_the_path():
    ops = _ops([(0, 100, 0, "a"),          # self 100 - 30 = 70
                (10, 30, 1, "a.b"),        # self 30
                (200, 50, 0, "a.b.c"),     # self 50
                (300, 20, 0, "x"),         # self 20
                (400, 5, 0, "")])          # outside any module: the root's own
    t = module_tree(ops).set_index("id")
    assert set(t.index) == {MODULE_ROOT, "a", "a.b", "a.b.c", "x"}
    assert t.loc[MODULE_ROOT, "parent"] == "" and t.loc["a", "parent"] == MODULE_ROOT
    assert t.loc["a.b.c", "parent"] == "a.b" and t.loc["a.b.c", "label"] == "c" and t.loc["a.b.c", "depth"] == 3
    ms = 1e-6
    assert t.loc["a", "self_ms"] == pytest.approx(70 * ms) and t.loc["a", "total_ms"] == pytest.approx(150 * ms)
    assert t.loc["a.b", "self_ms"] == pytest.approx(30 * ms) and t.loc["a.b", "total_ms"] == pytest.approx(80 * ms)
    assert t.loc[MODULE_ROOT, "self_ms"] == pytest.approx(5 * ms)
    assert t.loc[MODULE_ROOT, "total_ms"] == pytest.approx(self_time(ops).sum() * ms) == pytest.approx(175 * ms)
    assert t.loc["a", "calls"] == 1 and t.loc[MODULE_ROOT, "calls"] == 1
    assert module_tree(ops.iloc[0:0]).empty


def test_module_tree_is_a_groupby_over_millions_of_ops():
    n = 2_000_000
    rng = np.random.default_rng(0)
    mods = [""] + [f"layers.{i}.{m}" for i in range(32) for m in ("attn", "attn.qkv", "mlp.0", "mlp.2")]
    ops = pd.DataFrame({"rank": np.zeros(n, np.int32), "tid": np.ones(n, np.int64),
                        "ts": np.arange(n, dtype=np.int64) * 10, "dur": np.full(n, 5, np.int64),
                        "depth": np.zeros(n, np.int16),
                        "module": pd.Categorical.from_codes(rng.integers(0, len(mods), n), categories=mods)})
    self_ns = self_time(ops)
    t = module_tree(ops, self_ns)  # a few tens of ms (a groupby); pytest-timeout catches a loop per op
    assert t.iloc[0]["id"] == MODULE_ROOT and t.iloc[0]["total_ms"] == pytest.approx(n * 5 / 1e6)
    assert t["calls"].sum() == n


def test_filter_tree():
    ops = _ops([(0, 10, 0, "enc.attn.q"), (20, 10, 0, "enc.mlp"), (40, 10, 0, "dec.attn")])
    t = module_tree(ops)
    assert filter_tree(t, "") is t
    got = set(filter_tree(t, "ATTN")["id"])
    assert got == {MODULE_ROOT, "enc", "enc.attn", "enc.attn.q", "dec", "dec.attn"}
    assert set(filter_tree(t, "enc")["id"]) == {MODULE_ROOT, "enc", "enc.attn", "enc.attn.q", "enc.mlp"}
    assert filter_tree(t, "nothing").empty
    kept = filter_tree(t, "mlp").set_index("id")
    assert kept.loc["enc", "total_ms"] == t.set_index("id").loc["enc", "total_ms"]  # values unchanged


def test_the_op_scope_is_the_reports_scope(demo_run):
    run = neuron_prof.load(demo_run)
    ops, n = _scope(run)
    captured = run.steps[run.steps["active"] & run.steps["complete"]]
    assert n == len(captured) == 3  # steps 2-4: captured, none of them warm-up
    assert set(ops["step"]) == set(captured["step"]) and len(ops) <= len(run.ops)
    s = summarize(run).to_json()["ops"]
    assert s["captured_steps"] == n
    assert [r["name"] for r in s["top_by_self_time"]] == list(op_stats(ops).head(len(s["top_by_self_time"]))["name"])
    none_captured = analyze(run).step_kinds.assign(active=False)
    assert basis_steps(none_captured, captured_only=True).per_rank == 0