"""Run contents are text on every page of the viewer (issue 41, case 3), in a real browser.

A run's names are its maker's words: a bare URL in a file name became a live ``target="_blank"``
link in a caption (GFM autolinks survive backslash escapes), and any name that reached Markdown
unescaped would render as HTML, emphasis or a link. The run here is captured from a script whose
thread, module, mark, scalar and command carry such text, and whose own path goes through folders
named like a web address, an e-mail address, emphasis and a tag; Chromium then opens every page.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_script
from neuron_prof.reports.markdown import WORD_JOINER
from test_viewer_browser import PAGES, browser, check_clean, main_text, page, page_url, serve, wait_rendered  # noqa: F401

pytestmark = pytest.mark.browser

URL = "https://evil.example/x"
HOSTILE = f"{URL} <b>x</b> **bold** [l](https://evil.example/l)"
FOLDERS = ("www.evil.example", "a@evil.example", "**bold**", "<b>x<b>")
"""The script's path: no ``/`` may be in a folder's name, so the ``https://`` form is in the names."""

SCRIPT = """
import sys
import threading

import torch
import neuron_prof

HOSTILE = sys.argv[2]
threading.current_thread().name = HOSTILE
model = torch.nn.Sequential()
model.add_module("<b>x</b>**bold**[l](https:", torch.nn.Linear(64, 64))  # a module's name has no dot


def step(x):
    y = model(x)
    print("break")  # a graph break: the Compile page shows this file
    return y.sum()


compiled = torch.compile(step, backend="eager")
with neuron_prof.profile(sys.argv[1], command=["python", HOSTILE]) as prof:
    for _ in range(4):
        with neuron_prof.mark(HOSTILE):
            compiled(torch.randn(8, 64)).backward()
        neuron_prof.log(HOSTILE, 1.0)
        prof.step()
"""


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    script = root.joinpath(*FOLDERS, "train.py")
    script.parent.mkdir(parents=True)
    write_script(script, SCRIPT)
    run_dir = root / "run"
    done = subprocess.run([sys.executable, str(script), str(run_dir), HOSTILE], capture_output=True, text=True,
                          cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


SHOWN = {  # what each page shows of the run's text, literally (a page shows what its data holds)
    "overview": (HOSTILE, "/".join(FOLDERS)),  # the command; a finding's source line
    "timeline": (HOSTILE,),  # the thread's name
    "compile": ("/".join(FOLDERS),),  # the break site, and the caption over its source
    "memory": ("/".join(FOLDERS),),  # the peak's source line
    "device": (), "collectives": (), "ops": (),  # a CPU run without collectives; the Ops page's names are in its plots
}
OTHER = "www.evil.example <b>x<b> **bold** [l](a@evil.example)"  # a folder's name: no "/"
_LIVE_JS = """() => [...document.querySelectorAll('a, img, b, strong, em, i, iframe')]
    .filter(e => /evil|bold|^x$/.test((e.getAttribute('href') || '') + ' ' + (e.getAttribute('src') || '') + ' ' + e.textContent))
    .map(e => e.outerHTML.slice(0, 200))"""
"""Elements the run's text would make if it were rendered: a link or image to evil.example, a bold
or emphasised word of it."""


def test_every_page_shows_run_text_as_text(hostile_run, page, tmp_path):
    other = tmp_path / OTHER
    shutil.copytree(hostile_run, other)  # the Compare page's second run
    shown = {**SHOWN, "compare": (str(other),)}  # the second run's folder
    with serve(hostile_run, other, tmp_path) as viewer:
        for name, _ in PAGES:
            page.goto(page_url(viewer, name), wait_until="domcontentloaded")
            wait_rendered(page)
            check_clean(page, f"/{name}")
            live = page.evaluate(_LIVE_JS)
            assert not live, f"/{name}: the run's text was rendered: {live}"
            text = main_text(page).replace(WORD_JOINER, "")  # invisible: it only breaks a would-be link
            for literal in shown[name]:
                assert literal in text, f"/{name}: {literal!r} not shown as typed:\n{text}"
