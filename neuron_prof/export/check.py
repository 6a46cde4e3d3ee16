"""neuron_prof's strict reader of Perfetto TrackEvent traces: every packet decoded, every invariant
trace_processor relies on checked, and the slices, counters and flows it would build rebuilt.

Why our own: ui.perfetto.dev does not reject a broken trace, it silently drops what it cannot place
(events before their interned names, a sequence whose incremental state was never cleared) or
shows a wrong picture (slices closed out of order, ``dur = -1`` for a slice that never ended). The
tests and ``neuron-prof inspect`` need to know before a user does. Checked:

* framing: a stream of ``Trace.packet`` fields, each a whole, decodable ``TracePacket``;
* interning per sequence: interned data only on a sequence (id != 0) after
  ``SEQ_INCREMENTAL_STATE_CLEARED``, no iid 0, no iid redefined with another value, every
  ``*_iid`` an event uses defined on its sequence, ``SEQ_NEEDS_INCREMENTAL_STATE`` only after a
  clear;
* tracks: descriptors with a uuid, not re-described differently, parents that exist, no cycles;
  every event on a described track, counters only on counter tracks and slices never on them;
* events: a timestamp, non-decreasing per sequence; every ``SLICE_END`` closes an open slice (of
  its name, if it has one) and every slice ends;
* flows: ids linked in time order as trace_processor links them, each on a slice or instant (never
  a counter or a slice's end); in a trace neuron_prof wrote every flow id has both ends (an arrow
  with one end is dropped by the UI without a word, so a cross-rank link would silently vanish);
* end of trace: a trace whose first packet says neuron_prof wrote it must end with neuron_prof's
  end-of-trace packet, so a file cut at a packet boundary is caught (framing alone cannot tell).

Rebuilt slices follow trace_processor: per track, in time order (file order within a sequence),
depth = open slices; an instant is a zero-length slice at the current depth.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, TypedDict

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import InternedData, TracePacket, TrackDescriptor, TrackEvent

from neuron_prof.export.perfetto import is_end_of_trace, writer_of

MAX_MESSAGES = 50
"""Errors and warnings kept as text (all are counted in ``stats``)."""


class Slice(NamedTuple):
    track: int        # track uuid
    ts: int
    dur: int          # 0 for an instant, -1 for a slice that never ended (as trace_processor)
    depth: int
    name: str | None


class CounterValue(NamedTuple):
    track: int
    ts: int
    value: float


class FlowEnd(NamedTuple):
    track: int
    ts: int
    name: str | None


class Flow(NamedTuple):
    id: int
    src: FlowEnd      # the earlier end
    dst: FlowEnd


class TrackInfo(TypedDict):
    kind: str         # process | thread | counter | custom
    name: str
    parent: int       # parent uuid, 0 for none


@dataclass
class TraceReport:
    """What a trace holds and what is wrong with it."""
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    slices: list[Slice] = field(default_factory=list)          # begins and instants, in file order
    counters: list[CounterValue] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    tracks: dict[int, TrackInfo] = field(default_factory=dict)
    names: Counter[str] = field(default_factory=Counter)       # slice and instant names
    writer: str | None = None   # "neuron_prof X.Y.Z" when its first packet says so

    @property
    def ok(self) -> bool:
        return self.stats["errors"] == 0

    def process_of(self, track: int) -> int | None:
        """The uuid of the process track ``track`` belongs to (itself for a process track), None if
        it hangs under no described process: which process (rank) a slice or a flow end is on."""
        seen: set[int] = set()
        while track in self.tracks and track not in seen:
            if self.tracks[track]["kind"] == "process":
                return track
            seen.add(track)
            track = self.tracks[track]["parent"]
        return None

    def error(self, msg: str) -> None:
        self.stats["errors"] += 1
        if len(self.errors) < MAX_MESSAGES:
            self.errors.append(msg)

    def warn(self, msg: str) -> None:
        self.stats["warnings"] += 1
        if len(self.warnings) < MAX_MESSAGES:
            self.warnings.append(msg)


class TraceDamaged(ValueError):
    """The byte stream is not a whole sequence of packets."""


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
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def iter_packets(data: bytes) -> Iterator[tuple[int, TracePacket]]:
    """(byte offset, TracePacket) for each packet of an uncompressed trace; raises TraceDamaged."""
    mv = memoryview(data)
    pos, n = 0, len(data)
    while pos < n:
        start = pos
        try:
            tag, pos = _varint(data, pos)
            length, pos = _varint(data, pos)
        except IndexError:
            raise TraceDamaged(f"truncated at byte {start} of {n} (inside a packet header)") from None
        except ValueError as exc:
            raise TraceDamaged(f"corrupt packet header at byte {start} ({exc})") from None
        if tag != 0x0A:
            raise TraceDamaged(f"not a Perfetto trace (unexpected field tag {tag:#x} at byte {start})")
        if pos + length > n:
            raise TraceDamaged(f"truncated at byte {start} of {n} (packet of {length} bytes, {n - pos} left)")
        try:
            packet = TracePacket.FromString(mv[pos:pos + length])
        except Exception as exc:  # protobuf's DecodeError
            raise TraceDamaged(f"corrupt packet at byte {start} ({exc})") from None
        pos += length
        yield start, packet


_SLICE_BEGIN, _SLICE_END = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END
_INSTANT, _COUNTER, _UNSPECIFIED = TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER, TrackEvent.TYPE_UNSPECIFIED
_SEQ_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_SEQ_NEEDS = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_INTERNED = {"event_names": "name", "event_categories": "name", "debug_annotation_names": "name",
             "debug_annotation_string_values": "str"}


class _Sequence:
    """Incremental state of one packet sequence, as trace_processor keeps it."""
    __slots__ = ("cleared", "interned", "last_ts", "default_track")

    def __init__(self) -> None:
        self.cleared = False
        self.interned: dict[str, dict[int, Any]] = {k: {} for k in _INTERNED}
        self.last_ts: int | None = None
        self.default_track = 0

    def clear(self) -> None:
        self.cleared = True
        self.interned = {k: {} for k in _INTERNED}
        self.default_track = 0


class _Track:
    """A track's events as they stream by: open slices and which sequences fed it."""
    __slots__ = ("stack", "seq", "kind_used", "first_use", "last_ts")

    def __init__(self, seq: int, kind_used: str, first_use: int) -> None:
        self.stack: list[tuple[int, str | None, int]] = []   # (ts, name, row in report.slices or -1)
        self.seq = seq
        self.kind_used = kind_used     # "counter" or "slice": what its first event was
        self.first_use = first_use     # packet index
        self.last_ts = 0


class _Checker:
    """One pass over the packets (``packet``), then the whole-trace checks (``finish``)."""

    def __init__(self, keep_events: bool) -> None:
        self.keep = keep_events
        self.r = TraceReport()
        self.seqs: dict[int, _Sequence] = {}
        self.descs: dict[int, tuple[str, bytes, int, int]] = {}   # uuid -> (kind, bytes, parent, pid)
        self.tracks: dict[int, _Track] = {}
        self.flow_hits: dict[int, list[tuple[int, int, FlowEnd, bool]]] = {}
        self.end_at: int | None = None     # packet index of neuron_prof's (first) end-of-trace packet
        self.last = -1
        self.off = 0                       # byte offset of the packet being read

    @property
    def where(self) -> str:
        """The packet being read, for messages (built only when there is one to write)."""
        return f"packet {self.last} at byte {self.off}"

    # ------------------------------------------------------------------ per packet
    def packet(self, i: int, off: int, p: TracePacket) -> None:
        r = self.r
        r.stats["packets"] += 1
        self.last, self.off = i, off
        if i == 0:
            r.writer = writer_of(p)
        seq_id = p.trusted_packet_sequence_id
        s = self.seqs.get(seq_id)
        if s is None:
            s = self.seqs[seq_id] = _Sequence()
        flags = p.sequence_flags
        if p.incremental_state_cleared or flags & _SEQ_CLEARED:
            s.clear()
        if flags & _SEQ_NEEDS and not s.cleared:
            r.error(f"{self.where}: SEQ_NEEDS_INCREMENTAL_STATE on sequence {seq_id} before any "
                    "SEQ_INCREMENTAL_STATE_CLEARED (trace_processor drops the packet)")
        if p.HasField("interned_data"):  # before the packet's own event, which may use it
            self._interned(seq_id, s, p.interned_data)
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            if d.HasField("track_event_defaults") and d.track_event_defaults.track_uuid:
                s.default_track = d.track_event_defaults.track_uuid
        if p.HasField("track_event"):
            self._event(i, seq_id, s, p)
        elif p.HasField("track_descriptor"):
            self._descriptor(p.track_descriptor)
        elif r.writer and self.end_at is None and is_end_of_trace(p):
            self.end_at = i

    def _interned(self, seq_id: int, s: _Sequence, data: InternedData) -> None:
        r = self.r
        if seq_id == 0:
            r.error(f"{self.where}: interned data on a packet without trusted_packet_sequence_id")
        if not s.cleared:
            r.error(f"{self.where}: interned data on sequence {seq_id} before SEQ_INCREMENTAL_STATE_CLEARED")
        for kind, attr in _INTERNED.items():
            table = s.interned[kind]
            for ent in getattr(data, kind):
                value = getattr(ent, attr)
                if ent.iid == 0:
                    r.error(f"{self.where}: {kind} uses iid 0 (reserved: 'no value')")
                old = table.get(ent.iid)
                if old is not None and old != value:
                    r.error(f"{self.where}: {kind} iid {ent.iid} redefined {old!r} -> {value!r} "
                            f"on sequence {seq_id}")
                table[ent.iid] = value

    def _descriptor(self, d: TrackDescriptor) -> None:
        r = self.r
        r.stats["track_descriptors"] += 1
        if d.uuid == 0:
            r.error(f"{self.where}: track descriptor with uuid 0")
        kind = ("process" if d.HasField("process") else "thread" if d.HasField("thread")
                else "counter" if d.HasField("counter") else "custom")
        blob = d.SerializeToString(deterministic=True)
        if d.uuid in self.descs:
            if self.descs[d.uuid][1] != blob:
                r.error(f"{self.where}: track {d.uuid} described again with different content")
            return
        pid = d.process.pid if kind == "process" else d.thread.pid
        self.descs[d.uuid] = (kind, blob, d.parent_uuid, pid)
        name = d.name or d.static_name
        if not name and kind == "process":
            name = d.process.process_name or f"pid {d.process.pid}"
        elif not name and kind == "thread":
            name = d.thread.thread_name or f"tid {d.thread.tid}"
        r.tracks[d.uuid] = TrackInfo(kind=kind, name=name, parent=d.parent_uuid)
        t = self.tracks.get(d.uuid)
        if t is not None:
            r.warn(f"{self.where}: descriptor of track {d.uuid} comes after its first event (packet {t.first_use})")
            self._kind_matches(d.uuid, kind, t.kind_used)

    def _kind_matches(self, uuid: int, kind: str, used: str) -> None:
        if used == "counter" and kind != "counter":
            self.r.error(f"{self.where}: counter event on {kind} track {uuid}")
        elif used == "slice" and kind == "counter":
            self.r.error(f"{self.where}: slice or instant on counter track {uuid}")

    def _resolve(self, interned: dict[str, dict[int, Any]], seq_id: int, kind: str, iid: int, what: str) -> Any:
        """The interned value (a str, or bytes for string values), None (and an error) if undefined."""
        value = interned[kind].get(iid)
        if value is None:
            self.r.error(f"{self.where}: {what} {iid} not interned on sequence {seq_id}")
        return value

    def _event(self, i: int, seq_id: int, s: _Sequence, p: TracePacket) -> None:
        # hot path (one call per event): an iid or uuid of 0 means "not set", as in trace_processor
        r = self.r
        e = p.track_event
        r.stats["track_events"] += 1
        if seq_id == 0:
            r.error(f"{self.where}: track event without trusted_packet_sequence_id")
        if not p.HasField("timestamp"):
            r.error(f"{self.where}: track event without timestamp")
        ts = p.timestamp
        if s.last_ts is not None and ts < s.last_ts:
            r.error(f"{self.where}: timestamp {ts} < previous {s.last_ts} on sequence {seq_id} (non-monotonic)")
        s.last_ts = ts
        uuid = e.track_uuid or s.default_track
        if not uuid:
            r.error(f"{self.where}: track event without track_uuid and no sequence default "
                    "(it would land on an implicit thread track)")
            return
        interned = s.interned
        name: str | None = None
        used_iid = False
        iid = e.name_iid
        if iid:
            used_iid = True
            name = self._resolve(interned, seq_id, "event_names", iid, "name_iid")
        elif e.HasField("name"):
            name = e.name
        for iid in e.category_iids:
            used_iid = True
            self._resolve(interned, seq_id, "event_categories", iid, "category_iid")
        for a in e.debug_annotations:
            iid = a.name_iid
            if iid:
                used_iid = True
                self._resolve(interned, seq_id, "debug_annotation_names", iid, "debug annotation name_iid")
            elif not a.name:
                r.error(f"{self.where}: debug annotation without a name")
            iid = a.string_value_iid
            if iid:
                used_iid = True
                self._resolve(interned, seq_id, "debug_annotation_string_values", iid,
                              "debug annotation string_value_iid")
            elif a.WhichOneof("value") is None and not a.dict_entries and not a.array_values:
                r.warn(f"{self.where}: debug annotation without a value")
        if used_iid and not p.sequence_flags & _SEQ_NEEDS:
            r.warn(f"{self.where}: uses interned ids without SEQ_NEEDS_INCREMENTAL_STATE")
        typ = e.type
        if typ == _UNSPECIFIED:
            r.warn(f"{self.where}: legacy (TYPE_UNSPECIFIED) event: not checked")
            return
        t = self._track(i, seq_id, uuid, ts, "counter" if typ == _COUNTER else "slice")
        if typ == _COUNTER:
            self._counter(uuid, ts, e)
            if len(e.flow_ids) or len(e.terminating_flow_ids):
                r.error(f"{self.where}: flow ids on a counter event (an arrow needs a slice or an instant)")
        elif typ == _SLICE_END:
            if not t.stack:
                r.error(f"{self.where}: SLICE_END on track {uuid} at {ts} with no open slice")
                return
            begin, bname, row = t.stack.pop()
            if name is not None and name != bname:
                r.error(f"{self.where}: SLICE_END named {name!r} closes {bname!r} on track {uuid} (overlap)")
            if row >= 0:
                r.slices[row] = r.slices[row]._replace(dur=ts - begin)
            if len(e.flow_ids) or len(e.terminating_flow_ids):
                r.warn(f"{self.where}: flow ids on a SLICE_END")
        elif typ == _SLICE_BEGIN or typ == _INSTANT:
            begin_ = typ == _SLICE_BEGIN
            if begin_ and not name:
                r.warn(f"{self.where}: SLICE_BEGIN without a name")
            r.names[name if name is not None else "?"] += 1
            row = -1
            if self.keep:
                row = len(r.slices)
                r.slices.append(Slice(uuid, ts, -1 if begin_ else 0, len(t.stack), name))
            if begin_:
                t.stack.append((ts, name, row))
                r.stats["slices"] += 1
            else:
                r.stats["instants"] += 1
            flows, ends = e.flow_ids, e.terminating_flow_ids
            if len(flows) or len(ends):
                end = FlowEnd(uuid, ts, name)
                for fid in flows:
                    self.flow_hits.setdefault(fid, []).append((ts, i, end, False))
                for fid in ends:
                    self.flow_hits.setdefault(fid, []).append((ts, i, end, True))

    def _track(self, i: int, seq_id: int, uuid: int, ts: int, kind_used: str) -> _Track:
        """The track an event lands on, checked against its descriptor (or its first event)."""
        t = self.tracks.get(uuid)
        if t is None:
            t = self.tracks[uuid] = _Track(seq_id, kind_used, i)
        elif t.seq != seq_id and t.seq >= 0:
            self.r.warn(f"track {uuid}: events from several sequences (equal timestamps have no defined order)")
            t.seq = -1
        if t.seq < 0 and ts < t.last_ts:
            self.r.warn(f"{self.where}: track {uuid} goes back in time across sequences; its depths are file order")
        t.last_ts = ts
        desc = self.descs.get(uuid)
        if desc is not None:
            self._kind_matches(uuid, desc[0], kind_used)
        elif kind_used != t.kind_used:
            self.r.error(f"{self.where}: counter events and slices on one track {uuid}")
        return t

    def _counter(self, uuid: int, ts: int, e: TrackEvent) -> None:
        if e.HasField("counter_value"):
            value: float = e.counter_value
        elif e.HasField("double_counter_value"):
            value = e.double_counter_value
        else:
            self.r.error(f"{self.where}: COUNTER event without counter_value or double_counter_value")
            return
        self.r.stats["counters"] += 1
        if self.keep:
            self.r.counters.append(CounterValue(uuid, ts, value))

    # ------------------------------------------------------------------ whole trace
    def finish(self) -> TraceReport:
        r = self.r
        if r.stats["packets"] == 0:
            r.error("empty: no packets")
        if r.writer and self.end_at is None:
            r.error(f"truncated after packet {self.last}: written by {r.writer}, but its end-of-trace "
                    "packet is missing (cut at a packet boundary)")
        elif r.writer and self.end_at != self.last:
            r.error(f"{self.last - self.end_at} packets after the end-of-trace packet (packet {self.end_at}): "
                    "two traces in one file?")
        for uuid, (kind, _, parent, pid) in self.descs.items():
            if parent and parent not in self.descs:
                r.error(f"track {uuid} ({kind}): parent_uuid {parent} has no descriptor")
            seen, cur = set(), uuid
            while cur and cur in self.descs:
                if cur in seen:
                    r.error(f"track {uuid}: parent cycle")
                    break
                seen.add(cur)
                cur = self.descs[cur][2]
            if kind == "thread" and parent in self.descs and self.descs[parent][0] == "process" \
                    and self.descs[parent][3] != pid:
                r.warn(f"thread track {uuid}: pid {pid} != its parent process's pid {self.descs[parent][3]}")
        for uuid, t in self.tracks.items():
            if uuid not in self.descs:
                r.error(f"track {uuid}: events but no track descriptor")
            for ts, name, _ in t.stack:
                r.error(f"track {uuid}: slice {name!r} at {ts} never ended (trace_processor shows dur -1)")
                r.stats["unterminated_slices"] += 1
        for fid, hits in self.flow_hits.items():
            hits.sort(key=lambda h: (h[0], h[1]))
            chain: FlowEnd | None = None
            for _, _, end, term in hits:
                if chain is not None:
                    r.flows.append(Flow(fid, chain, end))
                chain = None if term else end
            if len(hits) == 1:
                # another tool's trace may be a window cut from a longer one; ours never is
                (r.error if r.writer else r.warn)(f"flow {fid}: only one event carries it (an arrow to nowhere)")
        r.stats["flows"] = len(r.flows)
        r.stats["flows_across_processes"] = sum(self._across(f) for f in r.flows)
        r.stats["tracks"] = len(self.descs)
        r.stats["sequences"] = len([s for s in self.seqs if s])
        return r


    def _across(self, flow: Flow) -> bool:
        """Whether the arrow joins two processes (ranks): tracks of different process ancestry."""
        return self.r.process_of(flow.src.track) != self.r.process_of(flow.dst.track)


def check_bytes(data: bytes, keep_events: bool = True) -> TraceReport:
    """Check an uncompressed trace. ``keep_events=False`` keeps counts only (inspect on a big trace)."""
    c = _Checker(keep_events)
    try:
        for i, (off, p) in enumerate(iter_packets(data)):
            c.packet(i, off, p)
    except TraceDamaged as exc:
        c.r.error(str(exc))
    return c.finish()
