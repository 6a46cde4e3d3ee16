"""The trace formats by name (``neuron-prof export --format perfetto|chrome``): the one module that
imports the writers, so that they and their shared base never import back."""
from __future__ import annotations

from neuron_prof.export.buffered_writer import BufferedTraceWriter
from neuron_prof.export.chrome import ChromeTraceWriter
from neuron_prof.export.perfetto import PerfettoTraceWriter

__all__ = ["WRITERS", "open_writer"]

WRITERS: dict[str, type[BufferedTraceWriter]] = {"perfetto": PerfettoTraceWriter, "chrome": ChromeTraceWriter}


def open_writer(path, fmt: str = "perfetto", **kw) -> BufferedTraceWriter:
    """A writer of ``fmt`` ("perfetto" or "chrome") to ``path``; ``kw`` goes to its constructor."""
    writer = WRITERS.get(fmt)
    if writer is None:
        raise ValueError(f"unknown trace format {fmt!r} (perfetto or chrome)")
    return writer(path, **kw)
