"""``Run`` reads, ``RunAnalysis`` computes: the tables come from the schema's declarations, the
analyses from the facade, and each side stays small enough to read in one sitting."""
from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

import neuron_prof
from neuron_prof.analysis.run_analysis import OpCompile, RunAnalysis, analyze
from neuron_prof.analysis.steps import basis_steps
from neuron_prof.store.run import Run
from neuron_prof.store.schema import ATTRIBUTE_OF_TABLE, DESCRIPTIONS, INTERNED, TABLES

MOST_PUBLIC_MEMBERS = 25  # issue 23: a newcomer reads either class in one sitting


def _public(cls: type) -> list[str]:
    return [n for n, _ in inspect.getmembers(cls) if not n.startswith("_")]


def test_every_event_table_is_an_attribute_declared_by_the_schema(demo_run):
    run = neuron_prof.load(demo_run)
    assert set(ATTRIBUTE_OF_TABLE) == set(TABLES) - set(INTERNED) == set(DESCRIPTIONS)
    for table, attribute in ATTRIBUTE_OF_TABLE.items():
        df = getattr(run, attribute)
        assert isinstance(df, pd.DataFrame) and "rank" in df.columns, table
        assert run.table(table) is df  # built once, one object by either name
    assert run.collective_groups is run.table("groups")
    assert set(ATTRIBUTE_OF_TABLE.values()) <= set(dir(run))
    with pytest.raises(AttributeError):
        run.no_such_table  # noqa: B018 - the lookup is the test
    with pytest.raises(KeyError, match="no table 'strings'"):
        run.table("strings")  # interned: resolved into the others, never a table of its own
    # the step tags the reader adds: an op belongs to the step it started in
    ops, steps = run.ops, run.steps
    first = steps[steps["active"]].iloc[0]  # the schedule waits a step: the first captured one
    in_first = ops[(ops["ts"] >= first["ts"]) & (ops["ts"] < first["ts"] + first["dur"])]
    assert len(in_first) and (in_first["step"] == first["step"]).all()


def test_the_facade_owns_the_analyses_and_one_is_shared_per_run(demo_run):
    run = neuron_prof.load(demo_run)
    analysis = neuron_prof.analyze(run)
    assert analysis is analyze(run) and analysis.run is run  # report, viewer and exporters share its caches
    assert analyze(neuron_prof.load(demo_run)) is not analysis  # another read of the run: its own
    assert analysis.op_parent is analysis.op_parent  # cached, not recomputed
    compiled = analysis.op_compile
    assert isinstance(compiled, OpCompile) and len(compiled.inside) == len(compiled.compile_ns) == len(run.ops)
    # the op scope is the run-time ops of the basis steps, and nothing else
    basis = basis_steps(analysis.step_kinds, captured_only=True)
    assert analysis.op_basis.kind == basis.kind and analysis.op_basis.per_rank == basis.per_rank > 0
    scoped = analysis.scoped_ops()
    assert len(scoped) == int(analysis.op_scope.sum()) > 0
    assert set(run.ops.loc[scoped.index, "step"]) <= set(basis.steps["step"])
    assert not compiled.inside[analysis.op_scope].any()
    assert (scoped["dur"].to_numpy() >= 0).all() and np.isfinite(scoped["self_ns"].to_numpy()).all()


def test_neither_side_is_a_god_object():
    tables = _public(Run)
    analyses = _public(RunAnalysis)
    assert len(tables) <= MOST_PUBLIC_MEMBERS, tables
    assert len(analyses) <= MOST_PUBLIC_MEMBERS, analyses
    # the reader computes no analysis: no name of the facade is a member of Run
    assert not set(analyses) & set(tables) - {"run"}
