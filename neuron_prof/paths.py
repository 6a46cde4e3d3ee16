"""How source files read wherever a line is shown (report, findings, viewer): one rule.

Absolute paths into virtualenvs made tables 200 characters wide and got cut before the file name,
so a path is shown as the part that tells files apart: the user's files relative to the run's
working directory, installed packages from the package on (``transformers/loss/loss_utils.py``,
the path after ``site-packages``/``dist-packages``), the standard library as its module path
(``json/decoder.py``); anything else as it is. Exported traces and ``Run.stack`` keep full paths.
"""
from __future__ import annotations

import os
import re

_INSTALLED = re.compile(r"[\\/](?:site|dist)-packages[\\/]")
_STDLIB = re.compile(r"[\\/](?:lib(?:64)?[\\/]python\d+\.\d+t?|Lib)[\\/]")
_FROZEN = "<frozen "
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.+):(?P<line>\d+)\)$")


def is_user_file(path: str) -> bool:
    """The user's own code: not an installed package, not the standard library (nor a frozen
    module). ``<string>``, notebook cells and files anywhere else count as the user's."""
    return not (_INSTALLED.search(path) or _STDLIB.search(path) or path.startswith(_FROZEN))


def display_path(path: str, cwd: str | None) -> str:
    """``path`` as neuron_prof shows it (the module docstring gives the rule). An installed
    package wins over ``cwd``: a virtualenv inside the project still reads as packages."""
    parts = _INSTALLED.split(path)
    if len(parts) > 1:
        return parts[-1]
    parts = _STDLIB.split(path, maxsplit=1)
    if len(parts) > 1:
        return parts[-1]
    if cwd and path.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(path, cwd)
    return path


def display_frame(text: str, cwd: str | None) -> str:
    """A frame named ``func (file:line)`` (how recompiles name the frame that recompiled) with its
    file as :func:`display_path` shows it; other text unchanged."""
    m = _FRAME.match(text)
    return f"{m['func']} ({display_path(m['file'], cwd)}:{m['line']})" if m else text
