"""Native Perfetto TrackEvent protobuf writer, encoded with numpy.

Layout of the file (a ``perfetto.protos.Trace``, i.e. a stream of ``packet`` fields): first a
``trace_attributes`` packet ``writer = "neuron_prof X.Y.Z"`` (the UI lists it in the trace's Overview as
``trace_attribute.writer``), then per process:

* one packet with ``SEQ_INCREMENTAL_STATE_CLEARED`` carrying the process's interned data
  (event names, debug annotation names, debug annotation string values);
* one packet per track descriptor: the process track, then thread / custom / counter tracks
  parented to it (uuid = handle + 1 + ``uuid_base``);
* the events, sorted by time with nesting-preserving tie-breaks (see ``emission_order``):
  ``TYPE_SLICE_BEGIN`` / ``TYPE_SLICE_END`` pairs, ``TYPE_INSTANT``, ``TYPE_COUNTER``; events that
  use interned ids carry ``SEQ_NEEDS_INCREMENTAL_STATE``.

Each process is one packet sequence (``trusted_packet_sequence_id`` = process index + 1). The last
packet is a ``service_event`` with ``tracing_disabled`` at the last event's time: trace_processor only
notes that time (metadata ``tracing_disabled_ns``), and a reader (``neuron_prof.export.check``) knows a
trace that claims to be ours but lacks it was cut, even at a packet boundary, where framing cannot tell.

Descriptor/interning packets go through the generated protobuf classes; the millions of event
packets are built as bytes by numpy: each distinct packet tail encoded once
(``perfetto_templates``), then every event's head and tail row in one matrix (``perfetto_events``);
byte-identical to ``TracePacket.SerializeToString()``.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from neuron_prof.export.buffered_writer import BufferedTraceWriter, ProcessData
from neuron_prof.export.perfetto_events import EventPackets, event_order
from neuron_prof.export.perfetto_templates import annotation_columns
from neuron_prof.export.perfetto_wire import varint as _varint, varint_block
from neuron_prof.version import __version__

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

__all__ = ["PerfettoTraceWriter", "PerfettoWriter", "writer_of", "is_end_of_trace", "varint_block"]

_UNITS = {"ns": 1, "time_ns": 1, "count": 2, "bytes": 3, "b": 3, "size_bytes": 3}  # CounterDescriptor.Unit


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    return pb


WRITER_KEY = "writer"
WRITER = "neuron_prof"


def _start_packet() -> "TracePacket":
    p = _pb().TracePacket()
    p.trace_attributes.attribute.add(key=WRITER_KEY, string_value=f"{WRITER} {__version__}")
    return p


def _end_packet(ts: int) -> "TracePacket":
    p = _pb().TracePacket()
    p.timestamp = ts   # trace_processor requires one on a service event
    p.service_event.tracing_disabled = True
    return p


def writer_of(packet: "TracePacket") -> str | None:
    """The writer ("neuron_prof X.Y.Z") if ``packet`` is the start packet of a trace we wrote, else None."""
    for a in packet.trace_attributes.attribute:
        if a.key == WRITER_KEY and a.string_value.split(" ")[0] == WRITER:
            return a.string_value
    return None


def is_end_of_trace(packet: "TracePacket") -> bool:
    """A standard packet, not a private one, so every trace_processor reads our traces as before: the
    tracing service writes the same event when a session stops."""
    return packet.service_event.tracing_disabled


class PerfettoTraceWriter(BufferedTraceWriter):
    """Writes a native Perfetto TrackEvent protobuf trace to ``path`` (gzip if it ends in .gz)."""

    def __init__(self, path, *, uuid_base: int = 0, chunk_events: int = 1 << 17, compresslevel: int = 1,
                 threads: int | None = None):
        super().__init__(path)
        self.threads = min(4, os.cpu_count() or 1) if threads is None else max(1, int(threads))
        self.uuid_base = int(uuid_base)
        self.chunk_events = int(chunk_events)
        self.compresslevel = compresslevel

    # ------------------------------------------------------------------ helpers
    def _uuid(self, handle: int) -> int:
        return self.uuid_base + handle + 1

    @staticmethod
    def _frame(pkt) -> bytes:
        body = pkt.SerializeToString()
        return b"\x0a" + _varint(len(body)) + body

    def _header(self, d: ProcessData, seq: int, used_names, used_keys, used_vals) -> list[bytes]:
        pb = _pb()
        out = []
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = seq
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.first_packet_on_sequence = True
        idata = p.interned_data
        names = self.names.strings
        for i in used_names:
            e = idata.event_names.add()
            e.iid, e.name = int(i) + 1, names[i]
        keys = self.arg_keys.strings
        for i in used_keys:
            e = idata.debug_annotation_names.add()
            e.iid, e.name = int(i) + 1, keys[i]
        vals = self.arg_values.strings
        for i in used_vals:
            e = idata.debug_annotation_string_values.add()
            e.iid, e.str = int(i) + 1, vals[i].encode("utf-8", "surrogatepass")
        out.append(self._frame(p))
        for rank, t in enumerate([d.proc] + d.tracks):
            p = pb.TracePacket()
            p.trusted_packet_sequence_id = seq
            td = p.track_descriptor
            td.uuid = self._uuid(t.handle)
            if t.kind == "process":
                td.process.pid = t.pid
                td.process.process_name = t.name
                td.child_ordering = pb.TrackDescriptor.EXPLICIT
            else:
                td.parent_uuid = self._uuid(t.proc)
                td.sibling_order_rank = rank
                if t.kind == "thread":
                    td.thread.pid = t.pid
                    td.thread.tid = t.tid
                    td.thread.thread_name = t.name
                else:
                    td.name = t.name
                    if t.kind == "counter":
                        unit = _UNITS.get(t.unit.lower())
                        if unit:
                            td.counter.unit = unit
                        elif t.unit:
                            td.counter.unit_name = t.unit
                        else:
                            td.counter.SetInParent()
            out.append(self._frame(p))
        return out

    # ------------------------------------------------------------------ writing
    def _write(self, procs: list[ProcessData]) -> None:
        uuid = np.array([self._uuid(h) for h in range(len(self.tracks))], np.int64)
        kiid = {k: i + 1 for k, i in self.arg_keys.index.items()}
        with self._output(self.compresslevel) as f:
            f.write(self._frame(_start_packet()))
            for j, d in enumerate(procs):
                self._write_process(f, d, j + 1, uuid, kiid)
            f.write(self._frame(_end_packet(_last_ts(procs))))

    def _write_process(self, f, d: ProcessData, seq: int, uuid: np.ndarray, kiid: dict[str, int]) -> None:
        S, I = d.slices, d.instants
        order = event_order(d)
        packets = EventPackets(d, seq, uuid, kiid)
        # ---- header packets: the interned strings the events use
        used_names = _used_ids([S.name, I.name], len(self.names))
        used_keys = sorted({kiid[k] - 1 for k, _ in annotation_columns(d)})
        used_vals = _used_ids([c.values for t in (S, I) for c in t.args.values() if c.kind == "s"],
                              len(self.arg_values))
        for b in self._header(d, seq, used_names, used_keys, used_vals):
            f.write(b)
        CH = self.chunk_events
        starts = range(0, len(order), CH)
        enc = lambda c0: packets.encode(order[c0:c0 + CH])  # noqa: E731
        if self.threads > 1 and len(starts) > 1:  # numpy releases the GIL: encode chunks in parallel
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(self.threads) as ex:
                pending = []
                for c0 in starts:
                    pending.append(ex.submit(enc, c0))
                    if len(pending) > self.threads:
                        f.write(pending.pop(0).result())
                for p in pending:
                    f.write(p.result())
        else:
            for c0 in starts:
                f.write(enc(c0))


def _used_ids(columns: list[np.ndarray], n: int) -> np.ndarray:
    """The ids (below ``n``; -1: none) that occur in ``columns``, ascending: marked in place, not
    concatenated and counted (a copy of millions of ids, then another as int64, cost more than the
    marking)."""
    seen = np.zeros(n + 1, bool)   # the last: where -1 marks
    for ids in columns:
        seen[ids] = True
    return np.flatnonzero(seen[:-1])


def _last_ts(procs: list[ProcessData]) -> int:
    """Time of the last event written (0 without events)."""
    last = [int(a.max()) for d in procs
            for a in (d.slices.ts + d.slices.dur, d.instants.ts, d.counter_ts) if len(a)]
    return max(last, default=0)


PerfettoWriter = PerfettoTraceWriter
