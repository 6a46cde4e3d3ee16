"""Shared test helpers: the CLI as a real subprocess, and the shared Perfetto checker."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TOOLS = REPO.parent / "shared" / "tools"
sys.path.insert(0, str(SHARED_TOOLS))


def cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """Run ``neuron-prof ARGS`` as a user would, in a fresh process."""
    return subprocess.run([sys.executable, "-m", "neuron_prof", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the line containing ``marker`` (tests never hard-code line numbers)."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(f"{marker!r} not in {path}")


def check_trace(path: Path):
    """Validate a Perfetto trace with ../shared/tools/perfetto_check.py in strict mode."""
    from perfetto_check import check
    report = check(path.read_bytes(), strict=True)
    assert report.ok, report.errors
    assert not report.stats.get("unterminated_slices"), report.warnings
    return report


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One captured transformer run (5 captured steps) shared by the read-only tests."""
    import neuron_prof
    from neuron_prof.examples.train_transformer import train
    run_dir = tmp_path_factory.mktemp("runs") / "transformer"
    with neuron_prof.profile(run_dir, schedule=neuron_prof.schedule(wait=1, warmup=1, active=3)) as prof:
        train(6, prof)
    return run_dir


MEMORY_STEPS = 8


@pytest.fixture(scope="session")
def memory_runs(tmp_path_factory):
    """``memory_runs(mode)``: a captured run of examples/memory_leak.py (``leak``, ``clean`` or
    ``spike``; eager + memory collectors, every step captured), made once per session."""
    import neuron_prof
    from neuron_prof.examples import memory_leak
    root = tmp_path_factory.mktemp("memory_runs")
    made: dict[str, Path] = {}

    def get(mode: str) -> Path:
        if mode not in made:
            with neuron_prof.profile(root / mode, collectors=["eager", "memory"]) as prof:
                memory_leak.train(MEMORY_STEPS, mode, prof)
            made[mode] = root / mode
        return made[mode]

    return get
