"""The source lines around a recorded line, for the pages that show where something happened
(a graph break on the Compile page, a host wait on the Device page).

A run is input from anyone (docs/viewer.md, "Security"), so a page opens a file only where the rule says
it may: the file must be named by the event's recorded stacks, end in .py, lie outside the run
directory both as written and once links are resolved (a run carries no source, so a file in it
is the run's maker speaking, e.g. a link to a secret), and be a regular file opened without
following a final link, of at most ``MAX_SOURCE_BYTES``.
"""
from __future__ import annotations

import io
import os
from itertools import islice
from pathlib import Path

import streamlit as st

from neuron_prof.errors import NeuronProfError
from neuron_prof.safefile import open_regular
from neuron_prof.viewer.text import md

CONTEXT_LINES = 6  # lines shown on each side of the recorded one
MAX_SOURCE_BYTES = 8 * 2**20  # don't open anything larger as "source"
MAX_LINE_CHARS = 300


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def source_window(file: str, line: int, allowed: set[str], cwd: str | None,
                  run_dir: Path) -> tuple[str, list[tuple[int, str]]] | None:
    """Up to ``CONTEXT_LINES`` lines either side of ``line`` of a recorded file, as (the path
    shown, [(number, text)]), or None when the rule above says no or the file no longer has the
    line (it changed since the capture). ``allowed``: the files the event's stacks name."""
    if file not in allowed or not file.endswith(".py") or line < 1:
        return None
    p = Path(file)
    if not p.is_absolute() and cwd:
        p = Path(cwd) / p
    real = os.path.realpath(p)
    if any(_inside(x, d) for x in (os.path.abspath(p), real)
           for d in (os.path.abspath(run_dir), os.path.realpath(run_dir))):
        return None
    first = max(line - CONTEXT_LINES, 1)
    try:
        with open_regular(real) as raw:  # the resolved path: a link swapped in now is refused, not followed
            if os.fstat(raw.fileno()).st_size > MAX_SOURCE_BYTES:
                return None
            lines = list(islice(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"), first - 1,
                                line + CONTEXT_LINES))
    except (OSError, NeuronProfError):
        return None
    if len(lines) < line - first + 1:
        return None
    return str(p), [(first + i, text.rstrip("\n")[:MAX_LINE_CHARS]) for i, text in enumerate(lines)]


def show_source(file: str, line: int, allowed: set[str], cwd: str | None, run_dir: Path) -> None:
    """The lines around ``line`` with it marked ``>>``, or a caption saying why they cannot be shown."""
    window = source_window(file, line, allowed, cwd, run_dir)
    if window is None:
        st.caption(f"source of {md(file)} is not readable here (moved, changed, not a regular .py file, or inside the "
                   "run directory)")
        return
    shown, lines = window
    st.caption(f"{md(shown)}, line {line} (marked `>>`)")
    width = len(str(lines[-1][0]))
    st.code("\n".join(f"{'>>' if n == line else '  '} {n:>{width}} | {text}" for n, text in lines), language=None)
