"""What starting a capture costs a process (issue 9, defect 9): it imports neither Dynamo nor
Inductor (the compiler collector hooks them when the program imports them, and still records
every compile), and the native engine is built under a name keyed by its sources and loaded
without torch's extension builder once built. Real processes: each check runs in a fresh one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import cli, write_script
from neuron_prof.collectors import _engine

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

HEAVY = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension", "pandas")

# prints which heavy modules the process has, before and after neuron_prof starts a capture
START = """
import json, sys
import torch

heavy = {heavy!r}
def loaded():
    return sorted(h for h in heavy if h in sys.modules)
before = loaded()
import neuron_prof
prof = neuron_prof.profile(sys.argv[1], auto_step=True).start()
after = loaded()
model = torch.nn.Linear(4, 4)
model(torch.randn(2, 4)).sum().backward()
prof.stop()
print("LOADED " + json.dumps({{"before": before, "after": after}}))
"""

# a plain script (no neuron_prof in it) reporting whether torch._dynamo is loaded at its end
PLAIN = """
import sys
import torch
model = torch.nn.Linear(4, 4)
model(torch.randn(2, 4)).sum().backward()
print("DYNAMO", "torch._dynamo" in sys.modules)
"""

# under `record`: the program imports torch._dynamo itself, after capture began
COMPILES = """
import sys
import torch
assert "torch._dynamo" not in sys.modules  # capture started without it
from neuron_prof.examples import graph_breaks
graph_breaks.run("aot_eager")  # six breaks, two recompiles per frame
torch.compile(graph_breaks.no_breaks)(torch.randn(8, 4))  # Inductor: kernels and caches
"""


def run_python(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **(env or {})}, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_starting_a_capture_imports_neither_dynamo_nor_inductor(tmp_path):
    script = write_script(tmp_path / "start.py", START.format(heavy=HEAVY))
    out = run_python(script, tmp_path / "run").stdout
    loaded = json.loads(out.split("LOADED ", 1)[1])
    assert loaded == {"before": [], "after": []}, loaded
    # and under `record`, a script that never compiles never loads Dynamo, as without capture
    plain = write_script(tmp_path / "plain.py", PLAIN)
    assert "DYNAMO False" in run_python(plain).stdout
    res = cli("record", "-q", "-o", tmp_path / "rec", "--", sys.executable, plain, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "DYNAMO False" in res.stdout


def test_compiler_collector_records_everything_when_dynamo_comes_after_capture_start(tmp_path):
    script = write_script(tmp_path / "compiles.py", COMPILES)
    res = cli("record", "-q", "-o", tmp_path / "run", "--collectors", "compiler", "--", sys.executable, script,
              cwd=tmp_path, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert res.returncode == 0, res.stderr[-3000:]
    run = neuron_prof.load(tmp_path / "run")
    assert run.failures.empty, run.failures
    comp = run.compiles
    assert {"step", "no_breaks"} <= set(comp.func.astype(str)) and (comp.status == "ok").any()
    assert len(run.graph_breaks) >= 6
    assert set(run.graph_breaks.reason_class.astype(str)) >= {"print", "numpy", "explicit graph_break()"}
    assert len(run.recompiles) >= 2
    assert len(run.compile_phases) > 0
    fusions = run.fusions[run.fusions.backend == "inductor"]
    assert fusions.kernel.astype(str).str.contains("fused").any()
    assert {"fx_graph", "aot_autograd"} <= set(run.compile_cache.cache.astype(str))


# ------------------------------------------------------------------ the engine's build cache
def test_engine_build_name_is_keyed_by_its_sources(tmp_path):
    here = Path(_engine.__file__).parent
    for name in _engine._SOURCES + _engine._HEADERS:
        shutil.copy(here / name, tmp_path / name)
    name = _engine.extension_name()
    assert name.startswith("neuron_prof_engine_") and name.isidentifier()
    assert _engine.extension_name(str(tmp_path)) == name  # same bytes, same name: one shared build
    header = tmp_path / _engine._HEADERS[0]
    header.write_text(header.read_text() + "\n// another copy of neuron_prof\n")
    assert _engine.extension_name(str(tmp_path)) != name  # other sources: another build folder


def test_engine_is_built_under_its_keyed_name_and_loaded_without_the_builder(tmp_path):
    ext = _engine.load_engine().extension()
    name = _engine.extension_name()
    assert Path(ext.__file__).parent == Path(_engine.build_folder(name)), ext.__file__
    assert Path(ext.__file__).stem.split(".")[0] == name
    # a later process finds it built: no torch.utils.cpp_extension (and setuptools), no ninja
    code = ("import sys, torch; from neuron_prof.collectors._engine import load_engine; load_engine(); "
            "print('BUILDER', 'torch.utils.cpp_extension' in sys.modules)")
    assert "BUILDER False" in run_python("-c", code).stdout


def test_build_folder_is_where_torch_builds(tmp_path):
    """Our copy of torch's folder rule (without importing its builder) against torch's own."""
    code = ("import json, torch.utils.cpp_extension as c; from neuron_prof.collectors import _engine; "
            "print('FOLDERS ' + json.dumps([_engine.build_folder('x_1'), c._get_build_directory('x_1', False)]))")
    for env in ({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}, {"XDG_CACHE_HOME": str(tmp_path / "cache")}):
        full = {**os.environ, **env}
        if "TORCH_EXTENSIONS_DIR" not in env:
            full.pop("TORCH_EXTENSIONS_DIR", None)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=full)
        assert res.returncode == 0, res.stderr
        ours, torchs = json.loads(res.stdout.split("FOLDERS ", 1)[1])
        assert ours == torchs and ours.startswith(str(tmp_path)), (ours, torchs)


STOP_BEFORE_DYNAMO = """
import sys
import torch
import neuron_prof
finders = list(sys.meta_path)
prof = neuron_prof.profile(sys.argv[1], auto_step=True).start()
waiting = len(sys.meta_path) > len(finders)
prof.stop()
import torch._dynamo.utils, torch._dynamo.config
hook = torch._dynamo.utils.log_compilation_event.__code__.co_filename  # torch's own, not a wrapper
untouched = (sys.meta_path == finders and not torch._dynamo.config.ignore_logging_functions
             and hook.startswith(torch.__path__[0]))
print("WAITING", waiting, "UNTOUCHED", untouched)
"""


def test_a_capture_stopped_before_dynamo_leaves_nothing_waiting(tmp_path):
    script = write_script(tmp_path / "stop.py", STOP_BEFORE_DYNAMO)
    assert "WAITING True UNTOUCHED True" in run_python(script, tmp_path / "run").stdout
