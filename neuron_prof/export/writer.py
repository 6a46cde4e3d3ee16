"""One interface for trace writers (native Perfetto protobuf, Chrome JSON).

A mapping layer decides which run data becomes which track; a writer only turns columns into a file:

    w = open_writer("run.perfetto-trace", "perfetto")  # or "chrome" (neuron_prof.export.formats)
    p = w.process(pid, "rank 0")                       # one packet sequence per process
    t = w.thread_track(p, tid, "python")               # thread track (pid/tid)
    s = w.track(p, "Steps")                            # named custom track under the process
    c = w.counter_track(p, "allocated", "bytes")
    ids = w.slices(t, ts, dur, names, {"shapes": shapes})   # int64 ns; names/args: object arrays or Categorical
    w.instants(s, ts, names)
    w.counters(c, ts, values)
    w.flows(ids[:1], other_ids[:1])                    # an arrow between two slices/instants
    w.close()                                          # everything is buffered until here

Both formats share one buffered implementation (``neuron_prof.export.buffered_writer``): everything is
kept column-wise, strings interned once (``neuron_prof.export.string_table``), slices made to nest
per track (``neuron_prof.export.nesting``), and the file written in ``close()``. String args are
debug annotations; an empty string (or None/NaN) omits the annotation on that row. Numeric args
(int, float, bool) are numeric annotations (NaN omits).

The mapping layer depends on this protocol only, never on a format: the formats import their base,
and only ``formats`` imports the formats.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

__all__ = ["TraceWriter"]


@runtime_checkable
class TraceWriter(Protocol):
    """What every trace writer implements. Handles are plain ints; times are int64 ns."""

    def process(self, pid: int, name: str) -> int: ...

    def thread_track(self, proc: int, tid: int, name: str) -> int: ...

    def track(self, proc: int, name: str) -> int: ...

    def counter_track(self, proc: int, name: str, unit: str = "") -> int: ...

    def slices(self, track, ts, dur, names, args: Mapping[str, Any] | None = None) -> np.ndarray: ...

    def instants(self, track, ts, names, args: Mapping[str, Any] | None = None) -> np.ndarray: ...

    def counters(self, track: int, ts, values) -> None: ...

    def flows(self, src, dst) -> int: ...

    def close(self) -> None: ...
