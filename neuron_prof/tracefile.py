"""Reading a Perfetto protobuf trace back: framing checks and a per-process summary.

Used by ``neuron-prof inspect`` to tell whether a trace file (ours or anyone's) is whole before
it is shared or uploaded; a truncated or corrupt file is a NeuronProfError naming the offset.
"""
from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path
from typing import Any

from neuron_prof.errors import NeuronProfError

REEXPORT = "re-export it with `neuron-prof export RUN -o TRACE`"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise IndexError
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def summarize_trace(path: Path) -> dict[str, Any]:
    """Packets, processes and thread/track names, slice counts by name; raises on damage."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: no such trace file; write one with `neuron-prof export RUN -o {path}`") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise NeuronProfError(f"{path}: damaged gzip ({exc}); {REEXPORT}") from None
    if data.lstrip()[:1] in (b"{", b"["):
        raise NeuronProfError(f"{path}: a JSON trace, not a Perfetto protobuf trace; inspect reads "
                              "*.perfetto-trace files (open JSON in ui.perfetto.dev)")
    pos, packets = 0, 0
    tracks: dict[int, str] = {}
    processes: dict[int, str] = {}
    names: Counter[str] = Counter()
    interned: dict[tuple[int, int], str] = {}
    while pos < len(data):
        start = pos
        try:
            tag, pos = _varint(data, pos)
            length, pos = _varint(data, pos)
        except IndexError:
            raise NeuronProfError(f"{path}: truncated at byte {start} of {len(data)}; {REEXPORT}") from None
        if tag != 0x0A:
            raise NeuronProfError(f"{path}: not a Perfetto trace (unexpected field tag {tag:#x} at byte {start}); "
                                  f"{REEXPORT}")
        if pos + length > len(data):
            raise NeuronProfError(f"{path}: truncated at byte {start} (packet of {length} bytes, "
                                  f"{len(data) - pos} left); {REEXPORT}")
        try:
            p = pb.TracePacket.FromString(data[pos:pos + length])
        except Exception as exc:  # protobuf's DecodeError
            raise NeuronProfError(f"{path}: corrupt packet at byte {start} ({exc}); {REEXPORT}") from None
        pos += length
        packets += 1
        seq = p.trusted_packet_sequence_id
        for ent in p.interned_data.event_names:
            interned[(seq, ent.iid)] = ent.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("process"):
                processes[d.uuid] = d.process.process_name or f"pid {d.process.pid}"
            tracks[d.uuid] = d.name or d.thread.thread_name or d.process.process_name
        if p.HasField("track_event") and p.track_event.type in (pb.TrackEvent.TYPE_SLICE_BEGIN,
                                                               pb.TrackEvent.TYPE_INSTANT):
            e = p.track_event
            names[e.name if e.HasField("name") else interned.get((seq, e.name_iid), "?")] += 1
    return {"path": str(path), "packets": packets, "processes": sorted(processes.values()),
            "tracks": len(tracks), "slices": sum(names.values()), "top_names": names.most_common(10)}
