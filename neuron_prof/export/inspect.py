"""Reading a Perfetto protobuf trace file: the strict check (``neuron_prof.export.check``) of a file,
and the summary ``neuron-prof inspect`` prints.

A trace is shared, uploaded and opened far from the run that made it; ui.perfetto.dev shows a damaged
one without complaint. So inspect, and every test that writes a trace, read it strictly: a damaged
file is a NeuronProfError naming the file and the first problem.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import open_regular
from neuron_prof.export.check import TraceReport, check_bytes

REEXPORT = "re-export it with `neuron-prof export RUN -o TRACE`"
FOREIGN = "get a fresh copy from the tool that wrote it"


GZIP_MAX_RATIO = 100
"""A gzip trace may expand this many times over (Perfetto traces compress 3-10x) or to 1 GiB,
whichever is more; more is refused unread rather than decompressed into all of memory."""


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, if it is a regular file: a FIFO would block inspect forever and a
    device (``/dev/zero``) would be read until memory runs out."""
    try:
        with open_regular(path, "pass a .perfetto-trace file", follow_links=True) as f:
            data = f.read()
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: no such trace file; write one with "
                              f"`neuron-prof export RUN -o {path}`") from None
    except OSError as exc:
        raise NeuronProfError(f"{path}: cannot read the trace ({exc.strerror}); check the file") from None
    if data[:2] == b"\x1f\x8b":
        limit = max(GZIP_MAX_RATIO * len(data), 1 << 30)
        try:
            unzip = zlib.decompressobj(wbits=31)
            out = unzip.decompress(data, limit)
            if unzip.unconsumed_tail:
                raise NeuronProfError(f"{path}: decompresses to more than {limit} bytes ({GZIP_MAX_RATIO}x its size); "
                                      "not a trace neuron_prof wrote (a gzip bomb?): decompress it yourself first")
            if not unzip.eof:
                raise NeuronProfError(f"{path}: truncated: the gzip stream ends early; {REEXPORT}")
            if unzip.unused_data:  # export writes one gzip member, ending the file
                raise NeuronProfError(f"{path}: {len(unzip.unused_data)} bytes after the end of the gzip stream; "
                                      f"{REEXPORT}")
            data = out
        except zlib.error as exc:
            raise NeuronProfError(f"{path}: damaged gzip ({exc}); {REEXPORT}") from None
    if data[:64].lstrip()[:1] in (b"{", b"["):
        raise NeuronProfError(f"{path}: a JSON trace, not a Perfetto protobuf trace; inspect reads "
                              "*.perfetto-trace files (open JSON in ui.perfetto.dev)")
    return data


def read_trace(path: Path, keep_events: bool = True) -> TraceReport:
    """The strict check of a trace file (gzip or not); raises only if it cannot be read at all."""
    return check_bytes(_read_bytes(path), keep_events)


def summarize_trace(path: Path) -> dict[str, Any]:
    """Who wrote the trace, its packets, processes, tracks, counts and top slice names; a trace
    with any problem is a NeuronProfError naming the first."""
    r = read_trace(path, keep_events=False)
    if not r.ok:
        more = f" (first of {r.stats['errors']} problems)" if r.stats["errors"] > 1 else ""
        fix = REEXPORT if r.writer or not r.stats["packets"] else FOREIGN
        raise NeuronProfError(f"{path}: {r.errors[0]}{more}; {fix}")
    return {"path": str(path), "writer": r.writer, "packets": r.stats["packets"],
            "processes": sorted(t["name"] for t in r.tracks.values() if t["kind"] == "process"),
            "tracks": r.stats["tracks"], "slices": r.stats["slices"] + r.stats["instants"],
            "counters": r.stats["counters"], "flows": r.stats["flows"],
            "flows_across_processes": r.stats["flows_across_processes"], "warnings": r.warnings,
            "top_names": r.names.most_common(10)}
