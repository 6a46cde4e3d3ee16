"""The run's Perfetto trace behind the Timeline page's "Open in Perfetto" and "Download".

The trace is ``RUN/trace.perfetto-trace`` (what ``neuron-prof export RUN`` writes), written again
when the run changed since. A run directory is someone else's data: whatever sits at that name is
read only if it is a regular file, checked on the opened descriptor (``neuron_prof.store.safefile``), so
a link to ``/etc/shadow`` is never embedded or served; a link or special file there is not
replaced either (that needs ``neuron-prof export RUN --force``) and the page says so. A run folder
the viewer may not write to gets its trace in a private temporary folder of this server.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import kind, open_regular

TRACE_NAME = "trace.perfetto-trace"  # what `neuron-prof export RUN` writes by default


def advice(run_dir: Path) -> str:
    """What to do about a trace the viewer will not read."""
    return (f"the viewer neither shows nor replaces it: remove it, or write a regular trace there with "
            f"neuron-prof export {run_dir} --force")


def blocked(run_dir: Path) -> str | None:
    """Why the run's trace cannot be shown (it is a link or a special file), or None."""
    path = run_dir / TRACE_NAME
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"{path} is {kind(mode)}, not a regular file; {advice(run_dir)}."


def trace_file(run_dir: Path, stamp: float, load: Callable[[], Run], spare: Path) -> Path:
    """Where the run's current trace is: ``RUN/trace.perfetto-trace`` if it is a regular file at
    least as new as ``stamp``; else written there (if it may be replaced) or in ``spare`` (a
    folder of this server's own). Read it with :func:`open_trace`."""
    from neuron_prof.export.output import check_destination
    from neuron_prof.export.layout import write_run
    from neuron_prof.export.formats import open_writer
    outs = (run_dir / TRACE_NAME, spare / TRACE_NAME)
    for out in outs:
        try:
            st = os.lstat(out)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mtime >= stamp:
            return out
    for out in outs:
        try:
            check_destination(out, "perfetto", force=False)
            write_run(load(), open_writer(out, "perfetto"))
            return out
        except (OSError, NeuronProfError):  # a read-only run folder, or a file not ours: the spare
            if out == outs[-1]:
                raise
    raise AssertionError("unreachable")


def open_trace(path: Path) -> BinaryIO:
    """The trace opened for reading: a regular file only, never through a link."""
    return open_regular(path, advice(path.parent))
