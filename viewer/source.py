"""The source lines around a recorded line, for the pages that show where something happened
(a graph break on the Compile page, a host wait on the Device page).

A run is input from anyone (docs/viewer.md, "Security"), and a path is only a name: the file at it
may have changed since the run, or be a link the run's maker planted to a secret. So a page shows a
file only if it is the file that ran: named by the event's recorded stacks; its path, links resolved
before any check, ends in .py and lies outside the run directory (a run carries no source, so a file
in it is the run's maker speaking); and the bytes read now (a regular file, opened without following
a link, at most ``MAX_SOURCE_BYTES``) have the size and SHA-256 capture recorded for that name on
that rank (``neuron_prof.store.source_files``). A run recorded before capture hashed its files cannot be
verified, and shows none.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import NotRegularFile
from neuron_prof.store.source_files import SourceDigest, digest_of, read_source
from neuron_prof.viewer.text import md

CONTEXT_LINES = 6  # lines shown on each side of the recorded one
MAX_LINE_CHARS = 300
NOT_RECORDED = "not the recorded file"
CHANGED = "changed since the run"


@dataclass(frozen=True)
class SourceWindow:
    """Lines ``lines`` ((number, text)) of the file shown as ``path``."""
    path: str
    lines: list[tuple[int, str]]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def recorded_digests(run: Run, rank: int, file: str) -> list[SourceDigest]:
    """What capture recorded of ``file`` on ``rank`` (none: a run from before capture hashed files)."""
    t = run.source_files
    rows = t[(t["rank"] == rank) & (t["file"].astype(str) == file)]
    return [SourceDigest(int(r.size), str(r.sha256), str(r.error)) for r in rows.itertuples(index=False)]


def source_window(file: str, line: int, allowed: set[str], cwd: str | None, run_dir: Path,
                  recorded: list[SourceDigest]) -> SourceWindow | str:
    """Up to ``CONTEXT_LINES`` lines either side of ``line`` of a recorded file, or why they are not
    shown (the words a caption ends with). ``allowed``: the files the event's stacks name;
    ``recorded``: :func:`recorded_digests` of ``file``."""
    if "\0" in file:  # a crafted run's: no path has one (and the OS calls below would raise)
        return f"{NOT_RECORDED} (no file can have this name)"
    if file not in allowed or line < 1:
        return f"{NOT_RECORDED} (the event's recorded stacks do not name line {line} of it)"
    hashed = [d for d in recorded if not d.error]
    if not hashed:
        if recorded:
            return f"capture could not read it, so it cannot be verified as the file that ran ({recorded[0].error})"
        return ("the run recorded no size and SHA-256 of it (recorded before neuron_prof did), so it cannot be "
                "verified as the file that ran")
    p = Path(file)
    if not p.is_absolute() and cwd:
        p = Path(cwd) / p
    real = os.path.realpath(p)  # every check below is on the file the path resolves to
    if not real.endswith(".py"):
        return f"{NOT_RECORDED} (it resolves to a file that is not .py source)"
    if any(_inside(x, d) for x in (os.path.abspath(p), real)
           for d in (os.path.abspath(run_dir), os.path.realpath(run_dir))):
        return f"{NOT_RECORDED} (it lies inside the run directory, which carries no source)"
    try:
        data = read_source(real)  # a link swapped in after resolving is refused, not followed
    except FileNotFoundError:
        return "it is not here any more (moved or deleted since the run)"
    except NotRegularFile as exc:
        return f"{NOT_RECORDED} (it resolves to {exc.what})"
    except (OSError, ValueError, NeuronProfError) as exc:
        return f"it cannot be read here ({exc})"
    if digest_of(data) not in hashed:
        if real != os.path.abspath(p):
            return f"{NOT_RECORDED} (it is a link to a file whose size or SHA-256 differs from the recorded ones)"
        return f"{CHANGED} (its size or SHA-256 differs from the recorded ones)"
    # line ends as Python counts them (\n, \r\n, \r), not every break str.splitlines knows
    lines = [t.rstrip("\r\n") for t in io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace")]
    if line > len(lines):
        return f"{NOT_RECORDED} (it has no line {line})"
    first = max(line - CONTEXT_LINES, 1)
    return SourceWindow(str(p), [(n, lines[n - 1][:MAX_LINE_CHARS])
                                 for n in range(first, min(line + CONTEXT_LINES, len(lines)) + 1)])


def show_source(run: Run, rank: int, file: str, line: int, allowed: set[str]) -> None:
    """The lines around ``line`` with it marked ``>>``, or a caption saying why they are not shown."""
    window = source_window(file, line, allowed, run.meta.get("cwd"), run.path, recorded_digests(run, rank, file))
    if isinstance(window, str):
        st.caption(f"source of {md(file)} is not shown: {md(window)}")
        return
    st.caption(f"{md(window.path)}, line {line} (marked `>>`), as the run recorded it")
    width = len(str(window.lines[-1][0]))
    st.code("\n".join(f"{'>>' if n == line else '  '} {n:>{width}} | {text}" for n, text in window.lines),
            language=None)
