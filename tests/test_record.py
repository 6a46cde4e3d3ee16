"""`neuron-prof record -- python script.py` on scripts that know nothing of neuron_prof."""
from __future__ import annotations

import sys

import pytest

import neuron_prof
from conftest import cli, line_of, write_script

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

PLAIN = """
import sys
import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.Adam(model.parameters())
for step in range(5):
    loss = model(torch.randn(4, 8)).square().sum()  # FORWARD
    loss.backward()
    opt.step()
    opt.zero_grad()
print("script output", sys.argv[1:])
sys.exit(int(sys.argv[1]))
"""

CRASH = """
import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    if step == 2:
        raise RuntimeError("boom at step 2")
"""


def test_record_captures_steps_and_keeps_exit_code_and_output(tmp_path):
    script = write_script(tmp_path / "plain.py", PLAIN)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, "3", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "script output ['3']" in res.stdout
    run = neuron_prof.load(run_dir)
    done = run.steps[run.steps["complete"]]
    assert len(done) == 5  # one step per optimizer.step()
    assert run.meta["command"] == [sys.executable, str(script), "3"]
    fwd = run.ops[run.ops["name"] == "aten::linear"]
    assert len(fwd) == 5
    assert set(fwd["source"].astype(str)) == {f"plain.py:{line_of(script, 'FORWARD')}"}
    # model construction is start-up (step -1: before step 0, which begins at the first forward);
    # ops after the last optimizer.step() (the final zero_grad) belong to the partial step 5
    assert set(run.ops["step"]) == {-1, 0, 1, 2, 3, 4, 5}
    assert list(fwd["step"]) == [0, 1, 2, 3, 4]
    assert not run.steps.set_index("step").loc[5, "complete"]


def test_record_of_a_crashing_script_keeps_its_steps_and_exit_code(tmp_path):
    script = write_script(tmp_path / "crash.py", CRASH)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--", sys.executable, script, cwd=tmp_path)
    assert res.returncode == 1
    assert "RuntimeError: boom at step 2" in res.stderr
    run = neuron_prof.load(run_dir)
    assert int(run.steps["complete"].sum()) == 3
    assert run.health["closed"].all()


def test_record_with_schedule_captures_only_active_steps(tmp_path):
    script = write_script(tmp_path / "plain.py", PLAIN)
    run_dir = tmp_path / "run"
    res = cli("record", "-o", run_dir, "--schedule", "1,1,2", "--", sys.executable, script, "0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = neuron_prof.load(run_dir)
    assert sorted(run.ops["step"].unique()) == [2, 3]


def test_record_of_a_missing_command_is_a_one_line_error(tmp_path):
    res = cli("record", "-o", tmp_path / "r", "--", "no-such-program-xyz")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "no-such-program-xyz" in res.stderr and "Traceback" not in res.stderr


def test_record_of_a_script_that_profiles_itself_keeps_one_capture(tmp_path):
    script = write_script(tmp_path / "self_profiling.py", """
        import sys
        import torch
        import neuron_prof

        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with neuron_prof.profile(sys.argv[1]) as prof:
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                prof.step()
        print("finished")
        """)
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    res = cli("record", "-o", outer, "--", sys.executable, script, inner, cwd=tmp_path)
    assert res.returncode == 0 and "finished" in res.stdout, res.stderr
    assert "already recording to" in res.stderr and not inner.exists()
    run = neuron_prof.load(outer)
    assert int(run.steps["complete"].sum()) == 3  # optimizer steps; the inner prof.step() is ignored
