"""The seeded fuzzer (benchmarks/fuzz_runs.py) over a real captured run and its exported traces, a
bounded number of cases: every reader answers correctly or fails with one line naming a file
(exit 2); never a traceback, a signal, a hang or exhausted memory, and never a silently changed
number where the manifest commits the bytes. The benchmark script runs thousands of cases."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import REPO, cli

sys.path.insert(0, str(REPO / "benchmarks"))
import fuzz_runs  # noqa: E402  (a benchmark script, not a package)

SEED = 10
RUN_CASES = 21      # 3 per run mutation kind: 4 readers of ~0.7 s each per case, 2 at a time
TRACE_CASES = 18    # 2 per trace damage kind


@pytest.fixture(scope="module")
def traces(demo_run, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("fuzz-traces")
    out = [root / "t.perfetto-trace", root / "t.perfetto-trace.gz"]
    for path in out:
        assert cli("export", demo_run, "-o", path).returncode == 0
    return out


def _fuzz(tmp_path: Path, bases: list[Path], traces: list[Path], cases: int) -> list[fuzz_runs.CaseResult]:
    results = fuzz_runs.fuzz(bases, traces, SEED, range(cases), jobs=2, work=tmp_path)
    table = fuzz_runs.summary_table(results)
    print(table)
    assert not any(r.failures for r in results), table
    return results


def test_damaged_runs_fail_cleanly(demo_run, tmp_path):
    results = _fuzz(tmp_path, [demo_run], [], RUN_CASES)
    assert {r.case.kind for r in results} == set(fuzz_runs.RUN_MUTATIONS)
    damaged = {r.case.kind for r in results if "error" in r.verdicts.values()}
    assert {"truncate", "special file"} <= damaged   # the mutations do reach the readers


def test_damaged_traces_are_named(traces, tmp_path):
    results = _fuzz(tmp_path, [], traces, TRACE_CASES)
    assert all(r.verdicts == {"inspect": "error"} for r in results if r.case.expect == "error")
    assert sum(r.case.expect == "error" for r in results) > TRACE_CASES // 2


RESIGNED_CASES = 16  # 2 per kind; the readers forked from one process that imported neuron_prof (~25 s)


def test_runs_forged_with_recomputed_checksums_fail_cleanly(demo_run, tmp_path):
    """Every mutation with the checksums recomputed after it (``--resign``), so the damage gets
    past them to the parsers: a flipped schema byte used to be a UnicodeDecodeError (issue 41)."""
    results = fuzz_runs.fuzz([demo_run], [], SEED, range(RESIGNED_CASES), jobs=2, work=tmp_path, resigned=True,
                             fork=True)
    table = fuzz_runs.summary_table(results)
    print(table)
    assert not any(r.failures for r in results), table
    assert {r.case.kind for r in results} == set(fuzz_runs.RESIGNED_MUTATIONS)
    assert all(r.case.resigned and r.case.expect == "any" for r in results)
    schema = [r for r in results if r.case.kind == "schema flip"]
    assert any(set(r.verdicts.values()) == {"error"} for r in schema), table  # named damage, past the checksums
