"""Bad input gets one line naming the file and the fix, exit code 2, no traceback, nothing lost."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import check_trace, cli, one_line_error


def test_missing_run_dir(tmp_path):
    missing = tmp_path / "nope"
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, missing), str(missing), "neuron-prof record")


def test_empty_dir(tmp_path):
    one_line_error(cli("report", tmp_path), str(tmp_path), "not a neuron_prof run", "neuron-prof record")


def test_truncated_table_names_the_file_and_keeps_it(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    table = run / "rank-00000" / "ops.arrows"
    data = table.read_bytes()
    table.write_bytes(data[: len(data) // 2])
    res = cli("report", run)
    one_line_error(res, str(table), "truncated", "re-record")
    assert table.stat().st_size == len(data) // 2  # nothing deleted or rewritten


def test_corrupt_rank_metadata(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    (run / "rank-00000" / "rank.json").write_text("{not json")
    one_line_error(cli("report", run), "rank.json", "unreadable")


@pytest.mark.parametrize("cut", [3, 0.5])
def test_truncated_trace(demo_run, tmp_path, cut):
    trace = tmp_path / "t.perfetto-trace"
    assert cli("export", demo_run, "-o", trace).returncode == 0
    check_trace(trace)
    assert cli("inspect", trace).returncode == 0
    data = trace.read_bytes()
    trace.write_bytes(data[: cut if isinstance(cut, int) else int(len(data) * cut)])
    one_line_error(cli("inspect", trace), str(trace), "truncated", "neuron-prof export")


def test_unknown_flag_and_bad_schedule(demo_run, tmp_path):
    one_line_error(cli("report", demo_run, "--bogus"), "--bogus", "--help")
    one_line_error(cli("record", "--schedule", "1,x", "--", "true"), "invalid schedule")
    one_line_error(cli("export", demo_run, "--format", "svg"), "svg")
    one_line_error(cli("record"), "needs a command")
    one_line_error(cli("record", "--collectors", "nope", "--", "true"), "unknown collector")


KILLED = """
import os
import sys
import torch
import neuron_prof

model = torch.nn.Linear(8, 8)
prof = neuron_prof.profile(sys.argv[1]).start()
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    prof.step()
os._exit(0)  # like kill -9: no close, rows still in the journals
"""


def test_rows_in_the_journal_are_read_and_a_truncated_journal_is_named(tmp_path):
    import subprocess
    import sys

    import neuron_prof
    from conftest import write_script
    script = write_script(tmp_path / "killed.py", KILLED)
    run = tmp_path / "run"
    subprocess.run([sys.executable, str(script), str(run)], check=True)
    journal = run / "rank-00000" / "ops.journal"
    assert journal.stat().st_size > 0 and not (run / "rank-00000" / "ops.arrows").exists()
    loaded = neuron_prof.load(run)
    assert int(loaded.steps["complete"].sum()) == 3 and set(loaded.ops["step"]) == {0, 1, 2}
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 3])
    one_line_error(cli("report", run), str(journal), "truncated", "re-record")


# ----------------------------------------------------------------------------- no permission
# Tests run as root, which the OS lets read anything: the CLI and load run as the unprivileged
# user `nobody` (65534), for real, on a copy of the run in a folder of /tmp that user can enter.

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
LOAD = """
import sys
import neuron_prof
from neuron_prof.errors import NeuronProfError
try:
    neuron_prof.load(sys.argv[1])
except NeuronProfError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


def _unprivileged() -> list[str]:
    """The prefix that runs a command as a user the OS checks permissions for."""
    if os.geteuid() != 0:
        return []  # not root: the OS already checks this user's permissions
    if shutil.which("setpriv"):
        prefix = NOBODY
    elif shutil.which("runuser"):
        prefix = ["runuser", "-u", "nobody", "--"]
    else:
        pytest.skip("running as root and neither setpriv nor runuser is here to drop privileges")
    ok = subprocess.run([*prefix, sys.executable, "-c", "import neuron_prof"], capture_output=True, text=True,
                        cwd="/tmp", timeout=600)
    if ok.returncode:
        pytest.skip(f"the unprivileged user cannot import neuron_prof with {sys.executable} (its files or folders "
                    f"are not readable by others): {ok.stderr.strip()[-300:]}")
    return prefix


@pytest.fixture
def open_run(demo_run):
    """A copy of the demo run that every user may read, in a folder every user may enter."""
    root = Path(tempfile.mkdtemp(prefix="neuron_prof-perm-"))
    os.chmod(root, 0o755)
    run = root / "run"
    shutil.copytree(demo_run, run)
    for folder, dirs, files in os.walk(run):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    yield run
    for folder, dirs, files in os.walk(root):
        os.chmod(folder, 0o755)
    shutil.rmtree(root)


def test_a_run_or_file_this_user_may_not_read_is_one_line(open_run):
    prefix = _unprivileged()

    def as_user(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, sys.executable, *map(str, args)], capture_output=True, text=True,
                              cwd="/", timeout=600)

    # the folder that holds the run (the run named, it cannot be looked at), the run directory
    # (cannot be listed), one table in it (cannot be opened): each is named, with what to do
    table = open_run / "rank-00000" / "ops.arrows"
    for locked, named in ((open_run.parent, open_run), (open_run, open_run), (table, table)):
        os.chmod(locked, 0o000)
        try:
            for cmd in ("report", "export"):
                one_line_error(as_user("-m", "neuron_prof", cmd, open_run), f"{named}: cannot read it",
                               "Permission denied", "give this user read access")
            res = as_user("-c", LOAD, open_run)  # the library raises the same error, not PermissionError
            assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
            assert res.stderr.startswith(f"{named}: cannot read it (Permission denied)"), res.stderr
        finally:
            os.chmod(locked, 0o755 if locked.is_dir() else 0o644)
    # a run it may read but not write into: export's default output there is refused in one line
    os.chmod(open_run, 0o555)
    try:
        one_line_error(as_user("-m", "neuron_prof", "export", open_run), f"{open_run / 'trace.perfetto-trace'}: "
                       "cannot write it (Permission denied)", "choose another -o")
    finally:
        os.chmod(open_run, 0o755)
    assert as_user("-m", "neuron_prof", "report", open_run).returncode == 0  # readable again: it reads
