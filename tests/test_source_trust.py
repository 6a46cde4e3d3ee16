"""Source is shown only if it is the file that ran (issue 41, case 2).

Capture records each source file's size and SHA-256 once; the viewer shows a file's lines only if
the path, links resolved first, is a regular .py file outside the run whose bytes have that size
and hash. Before, a recorded path that was a ``.py``-named link to a secret showed the secret, and a
file edited since the run showed lines that never ran.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import neuron_prof
from neuron_prof.store.source_files import SourceDigest, digest_of

from conftest import line_of, shown, viewer_page, write_script
from test_security import BREAKING_SCRIPT  # the same graph-break job its Compile-page tests capture

SECRET_LINE = "TOKEN = 'hunter2'  # not part of any run\n"


def test_capture_records_each_source_file_once_with_its_size_and_sha256(tmp_path):
    ghost = "/nonexistent/ghost.py"  # a frame whose file cannot be read: recorded as such, training goes on
    model = torch.nn.Linear(8, 8)
    code = compile("def ghost_step(m, x):\n    return m(x).sum()\n", ghost, "exec")
    names: dict = {}
    exec(code, names)
    with neuron_prof.profile(tmp_path / "run") as prof:
        for _ in range(3):
            names["ghost_step"](model, torch.randn(4, 8)).backward()
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    files = neuron_prof.load(tmp_path / "run").source_files
    assert files["file"].astype(str).is_unique  # once per file, however many frames and steps name it
    by_file = {str(r.file): r for r in files.itertuples()}
    me = by_file[__file__]
    data = Path(__file__).read_bytes()
    assert (me.size, me.sha256, me.error) == (len(data), hashlib.sha256(data).hexdigest(), "")
    assert (by_file[ghost].size, by_file[ghost].sha256) == (-1, "")
    assert ghost in by_file[ghost].error and "No such file" in by_file[ghost].error


@pytest.mark.multiprocess
def test_compile_page_shows_only_the_file_that_ran(tmp_path, monkeypatch):
    script = write_script(tmp_path / "train.py", BREAKING_SCRIPT)
    ran = script.read_text()
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    line = line_of(script, "BREAK:here")

    def page() -> tuple[list[str], str]:
        at = viewer_page(monkeypatch, run_dir, "compile", "Graph breaks / Compile")
        return [c.value for c in at.code if c.value.startswith(("  ", ">>"))], shown(" ".join(c.value for c in at.caption))

    code, captions = page()  # the file that ran: shown, its line marked
    marked = re.compile(rf"^>> +{line} \| .*BREAK:here", re.M)
    assert any(marked.search(c) for c in code), (code, captions)

    script.write_text(ran.replace("x * 2", "x * 3"))  # the same size, other bytes: edited since the run
    code, captions = page()
    assert not code and f"source of {script} is not shown: changed since the run" in captions

    secret = tmp_path / "elsewhere" / "secret.py"  # a .py file outside the run, not the one that ran
    secret.parent.mkdir()
    secret.write_text(SECRET_LINE * 20)
    script.unlink()
    script.symlink_to(secret)
    code, captions = page()
    assert not [c for c in code if "hunter2" in c]
    assert f"source of {script} is not shown: not the recorded file" in captions

    passwd = tmp_path / "elsewhere" / "passwd"  # the case: a .py-named link to a file that is not .py
    passwd.write_text(SECRET_LINE * 20)
    script.unlink()
    script.symlink_to(passwd)
    code, captions = page()
    assert not [c for c in code if "hunter2" in c]
    assert f"source of {script} is not shown: not the recorded file (it resolves to a file that is not .py" in captions

    script.unlink()
    script.write_text(ran)  # put back as it ran: shown again
    code, _ = page()
    assert any(marked.search(c) for c in code)


def test_a_link_is_judged_by_the_file_it_resolves_to(tmp_path):
    """Against a run whose maker recorded the hash of the very file the link points to (so the
    hash check alone would pass): a resolved path that is not .py, or lies in the run, is refused;
    a run with no hash (recorded before capture hashed files) shows nothing."""
    from neuron_prof.viewer.source import SourceWindow, source_window
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    passwd = tmp_path / "passwd"
    passwd.write_text(SECRET_LINE * 20)
    link = tmp_path / "train.py"
    link.symlink_to(passwd)
    forged = [digest_of(passwd.read_bytes())]
    why = source_window(str(link), 3, {str(link)}, None, run_dir, forged)
    assert why == "not the recorded file (it resolves to a file that is not .py source)"
    inside = run_dir / "train.py"
    inside.write_text(SECRET_LINE * 20)
    outside = tmp_path / "real.py"
    outside.symlink_to(inside)  # outside as recorded, inside the run once resolved
    why = source_window(str(outside), 3, {str(outside)}, None, run_dir, [digest_of(inside.read_bytes())])
    assert why.startswith("not the recorded file (it lies inside the run directory")
    real = tmp_path / "ok.py"
    real.write_text("a = 1\nb = 2\nc = 3\n")
    assert "cannot be verified" in source_window(str(real), 2, {str(real)}, None, run_dir, [])
    why = source_window(str(real), 2, {str(real)}, None, run_dir, [SourceDigest(-1, "", "ok.py: Permission denied")])
    assert "capture could not read it" in why and "Permission denied" in why
    crafted = f"{real}\0.py"  # no file has this name; the OS calls would raise on it
    assert source_window(crafted, 2, {crafted}, None, run_dir, [digest_of(real.read_bytes())]).startswith(
        "not the recorded file")
    window = source_window(str(real), 2, {str(real)}, None, run_dir, [digest_of(real.read_bytes())])
    assert window == SourceWindow(str(real), [(1, "a = 1"), (2, "b = 2"), (3, "c = 3")])
