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
notes that time (metadata ``tracing_disabled_ns``), and a reader (``neuron_prof.tracecheck``) knows a
trace that claims to be ours but lacks it was cut, even at a packet boundary, where framing cannot tell.

Descriptor/interning packets go through the generated protobuf classes; the millions of event
packets are built as bytes by numpy: per-name / per-track / per-annotation-value byte fragments
are precomputed once, every packet is laid out in a fixed-width row of a uint8 matrix (each field
padded to its widest encoding, with a parallel mask of the bytes actually used), and a single
boolean compress turns the matrix into the concatenated canonical packets. Field order follows
field numbers, so packets are byte-identical to ``TracePacket.SerializeToString()``.
"""
from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING

import numpy as np

from neuron_prof.export.tracewriter import ArgColumn, BufferedTraceWriter, ProcessData, emission_order

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

__all__ = ["PerfettoTraceWriter", "PerfettoWriter", "writer_of", "is_end_of_trace"]

_U64 = np.uint64
_UNITS = {"ns": 1, "time_ns": 1, "count": 2, "bytes": 3, "b": 3, "size_bytes": 3}  # CounterDescriptor.Unit


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    return pb


WRITER_KEY = "writer"
WRITER = "neuron_prof"


def _start_packet() -> "TracePacket":
    from neuron_prof import __version__
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


def _varint(x: int) -> bytes:
    x &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_THRESH = [1 << (7 * k) for k in range(1, 10)]


def _vlen(x: int) -> int:
    return 1 + sum(x >= t for t in _THRESH)


def varint_block(v: np.ndarray, w: int | None = None):
    """Varints of uint64 values as a (n, w) uint8 block, its byte mask (None: all bytes used)
    and lengths (an int when all values have the same length)."""
    v = np.asarray(v).astype(_U64, copy=False)
    n = len(v)
    if n:
        lo, hi = _vlen(int(v.min())), _vlen(int(v.max()))
    else:
        lo = hi = 1
    if w is None:
        w = hi
    blk = np.empty((n, w), np.uint8)
    if lo == hi and w == hi:  # uniform length: continuation bits are per column constants
        x = v.copy()
        for k in range(w):
            col = x.astype(np.uint8)
            col &= 0x7F
            if k < w - 1:
                col |= 0x80
            blk[:, k] = col
            if k < w - 1:
                x >>= _U64(7)
        return blk, None, hi
    lens = np.ones(n, np.int64)
    for t in _THRESH[:max(hi, 1) - 1]:
        lens += v >= _U64(t)
    msk = np.empty((n, w), bool)
    x = v.copy()
    for k in range(w):
        col = x.astype(np.uint8)
        col &= 0x7F
        col |= (lens > k + 1).view(np.uint8) << 7
        blk[:, k] = col
        msk[:, k] = lens > k
        x >>= _U64(7)
    return blk, msk, lens


class _Table:
    """Byte fragments indexed by code; the extra last row is empty, so code -1 means 'absent'."""
    __slots__ = ("blk", "msk", "lens", "w")

    def __init__(self, blk, msk, lens):
        n, w = blk.shape
        self.blk = np.zeros((n + 1, w), np.uint8)
        self.blk[:n] = blk
        self.msk = np.zeros((n + 1, w), bool)
        self.msk[:n] = True if msk is None else msk
        self.lens = np.zeros(n + 1, np.int64)
        self.lens[:n] = lens
        self.w = w

    def take(self, codes):
        return (np.take(self.blk, codes, axis=0, mode="wrap"), np.take(self.msk, codes, axis=0, mode="wrap"),
                np.take(self.lens, codes, mode="wrap"))

    @classmethod
    def from_rows(cls, rows: list[bytes]):
        w = max((len(r) for r in rows), default=0)
        blk = np.zeros((len(rows), w), np.uint8)
        msk = np.zeros((len(rows), w), bool)
        lens = np.array([len(r) for r in rows], np.int64)
        for i, r in enumerate(rows):
            blk[i, :len(r)] = np.frombuffer(r, np.uint8)
            msk[i, :len(r)] = True
        return cls(blk, msk, lens)

    @classmethod
    def prefixed(cls, prefix: bytes, blk, msk, lens, annotation: bool = False):
        """prefix + variable block; with annotation=True wrap as DebugAnnotation field (0x22, len)."""
        n = blk.shape[0]
        lens = np.broadcast_to(np.asarray(lens, np.int64), (n,))
        head = np.frombuffer(prefix, np.uint8)
        if annotation:
            inner = len(prefix) + lens
            assert int(inner.max(initial=0)) < 128
            cols = [np.full((n, 1), 0x22, np.uint8), inner.astype(np.uint8)[:, None],
                    np.broadcast_to(head, (n, len(head)))]
            plen = 2 + len(head)
        else:
            cols = [np.broadcast_to(head, (n, len(head)))]
            plen = len(head)
        b = np.concatenate(cols + [blk], axis=1)
        m = np.concatenate([np.ones((n, plen), bool), np.ones(blk.shape, bool) if msk is None else msk], axis=1)
        return cls(b, m, plen + lens)


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

    def _arg_table(self, key: str, col):
        """(table, per-row codes) for one annotation column."""
        kiid = self.arg_keys.id(key) + 1
        if col.kind == "s":
            nv = len(self.arg_values)
            blk, msk, lens = varint_block(np.arange(1, nv + 1, dtype=_U64))
            tab = _Table.prefixed(b"\x08" + _varint(kiid) + b"\x88\x01", blk, msk, lens, annotation=True)
            return tab, col.values
        codes = np.full(len(col.values), -1, np.int64)
        u, inv = np.unique(col.values[col.present], return_inverse=True)
        codes[col.present] = inv
        if col.kind == "f":
            blk = np.ascontiguousarray(u.astype("<f8")).view(np.uint8).reshape(-1, 8)
            tab = _Table.prefixed(b"\x08" + _varint(kiid) + b"\x29", blk, np.ones(blk.shape, bool),
                                  np.full(len(u), 8, np.int64), annotation=True)
        else:
            tag = b"\x10" if col.kind == "b" else b"\x20"
            blk, msk, lens = varint_block(u.astype(np.int64).view(_U64) if col.kind == "i" else u.astype(_U64))
            tab = _Table.prefixed(b"\x08" + _varint(kiid) + tag, blk, msk, lens, annotation=True)
        return tab, codes

    # ------------------------------------------------------------------ writing
    def _write(self, procs: list[ProcessData]) -> None:
        ntracks = len(self.tracks)
        blk, msk, lens = varint_block(np.array([self._uuid(h) for h in range(ntracks)], _U64))
        self._track_tab = _Table.prefixed(b"\x58", blk, msk, lens)
        blk, msk, lens = varint_block(np.arange(1, len(self.names) + 1, dtype=_U64))
        self._name_tab = _Table.prefixed(b"\x50", blk, msk, lens)
        # event segments: 0 slice begin, 1 slice end, 2 instant, 3 counter
        self._type_tab = _Table.from_rows([b"\x48\x01", b"\x48\x02", b"\x48\x03", b"\x48\x04"])
        self._flags_tab = _Table.from_rows([b"\x68\x02", b"", b"\x68\x02", b""])
        with self._output(self.compresslevel) as f:
            f.write(self._frame(_start_packet()))
            for j, d in enumerate(procs):
                self._write_process(f, d, j + 1)
            f.write(self._frame(_end_packet(_last_ts(procs))))

    def _write_process(self, f, d: ProcessData, seq: int) -> None:
        S, I = d.slices, d.instants
        ns, ni, nc = len(S), len(I), len(d.counter_ts)
        # Objects: [slices, instants, counters]; events: [begins, ends (reversed), instants, counters].
        # Per-event fields are derived chunk by chunk from the object arrays.
        end = S.ts + S.dur
        cat = (lambda a, b, c: a if not (len(b) or len(c)) else np.concatenate([a, b, c]))  # noqa: E731
        e = _Ev()
        e.ns, e.ni, e.end = ns, ni, end
        e.ts = cat(S.ts, I.ts, d.counter_ts)
        e.track = cat(S.track, I.track, d.counter_track)
        e.name = cat(S.name, I.name, np.full(nc, -1, np.int32))
        e.cval, e.cint = d.counter_val, d.counter_int
        if ns and S.order is not None:
            order = S.order  # computed while nest-repairing; same [begins, reversed ends] layout
        else:
            from neuron_prof.export.tracewriter import slice_event_order
            order = slice_event_order(S.ts, end)
        if ni + nc:  # merge instants/counters in: they sort after slice events of equal time
            ot = np.concatenate([I.ts, d.counter_ts])
            other = emission_order(ot, np.repeat(np.array([3, 4], np.int8), [ni, nc]), np.zeros(ni + nc, np.int64))
            rev = order >= ns
            slice_t = np.where(rev, end[np.where(rev, 2 * ns - 1 - order, 0)], S.ts[np.where(rev, 0, order)]) \
                if ns else np.empty(0, np.int64)
            order = np.insert(order, np.searchsorted(slice_t, ot[other], side="right"), other + 2 * ns)

        # ---- annotations: one table per key, code per object
        e.ann = []
        keys = list(dict.fromkeys(list(S.args) + list(I.args)))
        used_vals = []
        for key in keys:
            cols = [c for c in (S.args.get(key), I.args.get(key)) if c is not None]
            kind_ = cols[0].kind
            if kind_ == "s":
                codes = cat(S.args[key].values if key in S.args else np.full(ns, -1, np.int32),
                            I.args[key].values if key in I.args else np.full(ni, -1, np.int32),
                            np.full(nc, -1, np.int32))
                tab, _ = self._arg_table(key, cols[0])
                used_vals.append(codes[codes >= 0])
            else:
                vals = np.concatenate([
                    S.args[key].values if key in S.args else np.zeros(ns, cols[0].values.dtype),
                    I.args[key].values if key in I.args else np.zeros(ni, cols[0].values.dtype)])
                pres = np.concatenate([
                    S.args[key].present if key in S.args else np.zeros(ns, bool),
                    I.args[key].present if key in I.args else np.zeros(ni, bool)])
                tab, c2 = self._arg_table(key, ArgColumn(kind_, vals, pres))
                codes = np.concatenate([c2, np.full(nc, -1, np.int64)])
            e.ann.append((tab, codes))

        # ---- flows: fixed64 flow_ids (field 47) on the begin (or instant) at each end of each arrow
        e.flow_tab = e.flow_code = None
        if len(d.flow_fid):
            pos = np.where(d.flow_kind == 0, d.flow_row, ns + d.flow_row)
            o = np.lexsort((d.flow_fid, pos))
            rows: list[bytes] = []
            e.flow_code = np.full(ns + ni + nc, -1, np.int64)
            last = None
            for p_, fid in zip(pos[o].tolist(), d.flow_fid[o].tolist()):
                if p_ != last:
                    e.flow_code[p_] = len(rows)
                    rows.append(b"")
                    last = p_
                rows[-1] += b"\xf9\x02" + struct.pack("<Q", fid)
            e.flow_tab = _Table.from_rows(rows)

        # ---- header packets
        nm = e.name
        used_names = np.flatnonzero(np.bincount(nm[nm >= 0], minlength=len(self.names)))
        used_keys = sorted(self.arg_keys.id(k) for k in keys)
        used_vals = np.flatnonzero(np.bincount(np.concatenate(used_vals), minlength=len(self.arg_values))) \
            if used_vals else []
        for b in self._header(d, seq, used_names, used_keys, used_vals):
            f.write(b)

        e.seq_b = np.frombuffer(b"\x50" + _varint(seq), np.uint8)
        CH = self.chunk_events
        enc = lambda c0: self._encode_chunk(order[c0:c0 + CH], e)  # noqa: E731
        starts = range(0, len(order), CH)
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

    def _encode_chunk(self, sel, e: "_Ev"):
        n = len(sel)
        ns, ni = e.ns, e.ni
        # event segment: 0 slice begin, 1 slice end, 2 instant, 3 counter; row: object index
        seg = (sel >= ns).view(np.uint8) + (sel >= 2 * ns).view(np.uint8) + (sel >= 2 * ns + ni).view(np.uint8)
        row = sel - np.where(seg >= 2, ns, 0)
        isE = np.flatnonzero(seg == 1)
        rowE = 2 * ns - 1 - sel[isE]
        row[isE] = rowE
        t = e.ts[row]
        t[isE] = e.end[rowE]

        def obj(codes):
            c = codes[row]
            c[isE] = -1  # slice ends carry no name / annotations / flows
            return c

        body = []   # (blk, msk, lens) in field-number order of TrackEvent
        for tab, codes in e.ann:
            body.append(tab.take(obj(codes)))
        body.append(self._type_tab.take(seg))
        body.append(self._name_tab.take(obj(e.name)))
        body.append(self._track_tab.take(e.track[row]))
        isc = np.flatnonzero(seg == 3)
        if len(isc):
            r = row[isc] - ns - ni
            body.append(self._counter_block(n, isc, e.cval[r], e.cint[r]))
        if e.flow_tab is not None:
            body.append(e.flow_tab.take(obj(e.flow_code)))
        te_len = body[0][2].copy()
        for b in body[1:]:
            te_len += b[2]
        ts_b, ts_m, ts_l = varint_block(t.view(_U64))
        tl_b, tl_m, tl_l = varint_block(te_len.astype(_U64))
        fl = self._flags_tab.take(seg)
        seq_b = e.seq_b
        plen = (2 + len(seq_b) + ts_l) + tl_l + te_len + fl[2]
        pl_b, pl_m, _ = varint_block(plen.astype(_U64))
        parts = [(None, 0x0A), (pl_b, pl_m), (None, 0x40), (ts_b, ts_m)]
        parts += [(None, int(x)) for x in seq_b]
        parts += [(None, 0x5A), (tl_b, tl_m)]
        parts += [(b[0], b[1]) for b in body]
        parts.append((fl[0], fl[1]))
        W = sum(1 if b is None else b.shape[1] for b, _ in parts)
        M = np.empty((n, W), np.uint8)
        K = np.empty((n, W), bool)
        off = 0
        for b, m in parts:
            if b is None:
                M[:, off] = m
                K[:, off] = True
                off += 1
            else:
                w = b.shape[1]
                M[:, off:off + w] = b
                K[:, off:off + w] = True if m is None else m
                off += w
        return np.compress(K.ravel(), M.ravel())

    @staticmethod
    def _counter_block(n, rows, v, isint):
        blk = np.zeros((n, 12), np.uint8)
        msk = np.zeros((n, 12), bool)
        lens = np.zeros(n, np.int64)
        ri = rows[isint]
        if len(ri):  # counter_value (30): int64 varint
            vb, vm, vl = varint_block(v[isint].astype(np.int64).view(_U64), 10)
            blk[ri, 0], blk[ri, 1] = 0xF0, 0x01
            blk[ri, 2:] = vb
            msk[ri, :2] = True
            msk[ri, 2:] = True if vm is None else vm
            lens[ri] = 2 + vl
        rd = rows[~isint]
        if len(rd):  # double_counter_value (44): fixed64
            blk[rd, 0], blk[rd, 1] = 0xE1, 0x02
            blk[rd, 2:10] = np.ascontiguousarray(v[~isint].astype("<f8")).view(np.uint8).reshape(-1, 8)
            msk[rd, :10] = True
            lens[rd] = 10
        return blk, msk, lens


def _last_ts(procs: list[ProcessData]) -> int:
    """Time of the last event written (0 without events)."""
    last = [int(a.max()) for d in procs
            for a in (d.slices.ts + d.slices.dur, d.instants.ts, d.counter_ts) if len(a)]
    return max(last, default=0)


class _Ev:
    """Per-process object arrays the chunk encoder derives event fields from."""
    ns = ni = 0
    end = ts = track = name = cval = cint = seq_b = None
    ann: list = []
    flow_tab = flow_code = None


PerfettoWriter = PerfettoTraceWriter
