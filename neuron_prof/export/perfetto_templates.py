"""Which events of a process share their packet tail, and the tails' bytes.

Why: a trace of a training loop is the same few hundred ops step after step, so two packets of
one op differ in little but their timestamp. Every byte of a packet after its timestamp
(``trusted_packet_sequence_id``, the ``TrackEvent``, ``sequence_flags``: fields 10, 11, 13)
depends only on the event's kind, name, annotations, track, counter value and flow ids. A tail
that several objects (slices, instants, counters) share is a *template*, encoded once (per
process: the tail holds the sequence id); ``perfetto_events`` writes each of their events as its
head and the template's row. A tail only one object has (a step's name, a kernel's id, a counter
value seen once) is encoded with its event, a run of events at a time: a table of those would
be as big as the events, written and read once more. Encoding in groups of the same fields (the
op slices' six annotations, the steps' two, ...) keeps each row to its own fields, not a column
for every annotation key of the process.

Flow ids (fixed64, field 47) are an event's own: a template counts them, and each object that has
some gets its template's row copied with its ids after it where they fit (``INLINE_FLOWS`` more
than the widest tail without any), else in rows of their own after it, so the arrows of the
straggler's collective to every other rank do not widen the rows of every event near it.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from neuron_prof.export import perfetto_wire as wire
from neuron_prof.export.buffered_writer import ProcessData

__all__ = ["Templates", "annotation_columns"]

FLOW_BYTES = 10
"""One flow id: key ``0xF9 0x02`` (field 47, fixed64) and 8 bytes."""
FLAGS = b"\x68\x02"
"""``sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE``: on every event that uses interned ids."""
INLINE_FLOWS = 2
"""Flow ids a row holds beyond the widest tail without any: more go to rows of their own."""
SEGMENTS = {"begin": 0, "end": 1, "instant": 2, "counter": 3}
"""Event kinds; ``TrackEvent.Type`` is the kind + 1."""
_U64 = np.uint64


class _Field:
    """One template-defining field over the objects (slices, instants, counters), in parts that
    each cover the run of objects from ``start`` (a table's objects: most fields belong to one):
    ``code`` (>= -1; -1: absent) tells values apart, ``bits`` (int64: an interned id, an int, a
    double's bit pattern) holds them. ``distinct``: no two objects share a value."""
    __slots__ = ("parts", "distinct")

    def __init__(self, parts: list[tuple[int, np.ndarray, np.ndarray]], distinct: bool = False) -> None:
        self.parts, self.distinct = parts, distinct

    def at(self, objects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bits, present) at ``objects`` (ascending)."""
        bits, present = np.zeros(len(objects), np.int64), np.zeros(len(objects), bool)
        for start, code, b in self.parts:
            lo, hi = np.searchsorted(objects, [start, start + len(code)])
            i = objects[lo:hi] - start
            bits[lo:hi], present[lo:hi] = b[i], code[i] >= 0
        return bits, present


def _key(fields: list[_Field], n: int) -> np.ndarray:
    """Per object, a number for its combination of ``fields``' codes: mixed radix, a digit per
    field (code + 1), renumbered densely where it would overflow."""
    key = np.zeros(n, np.int64)
    radix = 1
    for f in fields:
        span = max((int(code.max(initial=-1)) for _, code, _ in f.parts), default=-1) + 2
        if radix * span >= 1 << 62:
            key[:], uniq = pd.factorize(key)
            radix = len(uniq)
        for start, code, _ in f.parts:
            digit = code.astype(np.int64)
            digit += 1
            digit *= radix
            key[start:start + len(code)] += digit
        radix *= span
    return key


def _first_seen(codes: np.ndarray) -> np.ndarray:
    """Where each code of a ``pd.factorize`` (numbered in order of first appearance) first appears."""
    if not len(codes):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.r_[True, codes[1:] > np.maximum.accumulate(codes)[:-1]])


def _value_codes(parts: list[tuple[int, np.ndarray, np.ndarray]]) -> _Field:
    """A field of parts of (start, present, bits): one numbering of the distinct values across
    them (by bit pattern: -0.0 and 0.0 encode differently)."""
    codes, uniq = pd.factorize(np.concatenate([b[p] for _, p, b in parts] or [np.empty(0, np.int64)]))
    out, used = [], 0
    for start, present, bits in parts:
        code = np.full(len(bits), -1, np.int64)
        k = int(present.sum())
        code[present] = codes[used:used + k]
        used += k
        out.append((start, code, bits))
    return _Field(out, distinct=len(uniq) == len(codes))


def annotation_columns(d: ProcessData) -> list[tuple[str, str]]:
    """(key, kind) of the process's annotation columns, slices' first: the order of
    ``debug_annotations`` in every event."""
    return list(dict.fromkeys([(k, c.kind) for k, c in d.slices.args.items()]
                              + [(k, c.kind) for k, c in d.instants.args.items()]))


def _annotation_field(d: ProcessData, key: str, kind: str) -> _Field:
    parts = []
    for start, table in ((0, d.slices), (len(d.slices), d.instants)):
        c = table.args.get(key)
        if c is None or c.kind != kind:
            continue
        if kind == "s":  # string ids, -1 where absent: code and value at once
            parts.append((start, c.values, c.values))
        else:
            parts.append((start, c.present, c.values.astype(np.float64).view(np.int64) if kind == "f"
                          else c.values.astype(np.int64)))
    return _Field(parts) if kind == "s" else _value_codes(parts)


def _key_tag(kiid: int, kind: str) -> bytes:
    """A debug annotation's name_iid field and its value's key: "s" string_value_iid, "i"
    int_value, "b" bool_value, "f" double_value."""
    return b"\x08" + wire.varint(kiid) + {"s": b"\x88\x01", "i": b"\x20", "b": b"\x10", "f": b"\x29"}[kind]


def _annotation(kiid: int, kind: str, bits: np.ndarray) -> list:
    """``TrackEvent.debug_annotations`` (field 4) with ``bits`` (a string id, an int, a double's
    bit pattern) as its value."""
    if kind == "f":
        inner = wire.fixed64(_key_tag(kiid, kind), bits)
    else:
        inner = wire.tagged(_key_tag(kiid, kind), bits.view(_U64) + _U64(kind == "s"))
    return wire.length_delimited(b"\x22", inner)


def _flow_groups(d: ProcessData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The objects that carry flow ids (ascending); the flow ids by (object, id), and the
    object's number among them of each."""
    pos = np.where(d.flow_kind == 0, d.flow_row, len(d.slices) + d.flow_row)
    o = np.lexsort((d.flow_fid, pos))
    pos, fid = pos[o], d.flow_fid[o]
    new = np.r_[True, pos[1:] != pos[:-1]] if len(pos) else np.zeros(0, bool)
    return pos[new], fid, np.cumsum(new) - 1


class Templates:
    """The templates of one process's events, and the tails of objects no other shares.

    ``object_tid`` (per slice, instant, counter; -1: its tail is its own, see ``build``) and
    ``end_tid`` (per slice) number the templates, each built once: row ``t`` of ``rows`` (its
    ``row_len`` bytes from column ``room``; ``tail_len[t]`` bytes in all), followed, where
    ``extra[t]``, by that many rows of flow ids from ``extra_at[t]`` (``flow_rows``: which rows
    those are). A template of an object with flow ids is that object's own: its shared tail's
    row copied, its ids after it."""

    def __init__(self, d: ProcessData, seq: int, uuid: np.ndarray, kiid: Mapping[str, int], room: int = 0) -> None:
        """``uuid``: track uuid by writer handle; ``kiid``: interned id of each annotation key;
        ``room``: columns left free before each row's bytes (where ``perfetto_events`` writes an
        event's head)."""
        S, I = d.slices, d.instants
        ns, ni, nc = len(S), len(I), len(d.counter_ts)
        m = ns + ni + nc
        self.seq, self.uuid, self.room = seq, uuid, room
        # ---- what makes an object's tail
        seg = np.repeat(np.array([SEGMENTS["begin"], SEGMENTS["instant"], SEGMENTS["counter"]], np.int8), [ns, ni, nc])
        names = np.concatenate([S.name, I.name, np.full(nc, -1, np.int32)])
        track = np.concatenate([S.track, I.track, d.counter_track])
        self._anns = [(kiid[key], kind, _annotation_field(d, key, kind)) for key, kind in annotation_columns(d)]
        c_bits = np.where(d.counter_int, d.counter_val.astype(np.int64), d.counter_val.view(np.int64))
        c_int = d.counter_int.view(np.int8)
        f_objects, fid, group = _flow_groups(d)
        n_ids = np.bincount(group, minlength=len(f_objects))
        flows = np.zeros(m if len(fid) else 0, np.int64)    # flow ids per object
        flows[f_objects] = n_ids
        self._fields = {"seg": _Field([(0, seg, seg)]), "name": _Field([(0, names, names)]),
                        "track": _Field([(0, track, track)]), "flows": _Field([(0, flows, flows)]),
                        "counter": _value_codes([(ns + ni, np.ones(nc, bool), c_bits)]),
                        "counter_int": _Field([(ns + ni, c_int, c_int)])}
        # ---- the distinct tails: an object with a distinct value (its key leaves it out) is its own
        key = _key([*self._fields.values(), *(f for _, _, f in self._anns if not f.distinct)], m)
        for f in (f for _, _, f in self._anns if f.distinct):
            for start, code, _ in f.parts:
                alone = start + np.flatnonzero(code >= 0)
                key[alone] = -1 - alone
        codes = pd.factorize(key)[0]
        first = _first_seen(codes)          # each distinct tail's first object, ascending
        shared = (np.bincount(codes, minlength=len(first)) > 1) | (flows[first] > 0 if len(fid) else False)
        tid = np.full(len(first), -1, np.int64)
        tid[shared] = np.arange(int(shared.sum()))
        self.object_tid = tid[codes]
        end_tid, end_tracks = pd.factorize(S.track)
        # ---- the templates: the shared tails, then a slice end per track; rows by group
        values = self._values(first[shared])
        ends = {"seg": (np.full(len(end_tracks), SEGMENTS["end"]), np.ones(len(end_tracks), bool)),
                "track": (np.asarray(end_tracks, np.int64), np.ones(len(end_tracks), bool))}
        values = {k: tuple(np.r_[a, ends[k][j] if k in ends else np.zeros(len(end_tracks), a.dtype)]
                           for j, a in enumerate(v)) for k, v in values.items()}
        T = len(values["group"][0])
        self.end_tid = int(shared.sum()) + end_tid
        o = np.argsort(values["group"][0], kind="stable")
        values = {k: tuple(a[o] for a in v) for k, v in values.items()}
        renumber = np.full(T + 1, -1, np.int64)     # the last: -1 stays -1
        renumber[o] = np.arange(T)
        self.object_tid, self.end_tid = renumber[self.object_tid], renumber[self.end_tid]
        groups, lens = self._parts(values)
        n_flows = values["flows"][0]
        # ---- the rows: the templates', each flow-carrying object's (its shared tail's row with
        # its ids after it, where they fit), then rows of flow ids
        widest = int(lens.max(initial=0))
        cap = widest + FLOW_BYTES * INLINE_FLOWS + len(FLAGS)
        per_row = (cap - len(FLAGS)) // FLOW_BYTES
        source = self.object_tid[f_objects]               # the template each copies
        inline = lens[source] + FLOW_BYTES * n_ids + len(FLAGS) <= cap
        nrows = np.where(inline, 0, (n_ids + per_row - 1) // per_row)
        own = T + np.arange(len(f_objects))
        first_row = T + len(f_objects) + np.cumsum(nrows) - nrows
        self.object_tid[f_objects] = own
        # each array ends in an empty entry, the last row is empty: what id -1 finds
        self.extra = np.r_[np.zeros(T, np.int64), nrows, 0]
        self.extra_at = np.r_[np.zeros(T, np.int64), first_row, 0]
        self.tail_len = np.r_[lens + np.where(n_flows > 0, FLOW_BYTES * n_flows + len(FLAGS), 0),
                              lens[source] + FLOW_BYTES * n_ids + len(FLAGS), 0]
        width = max([widest, self._widest(self.object_tid < 0)] + [cap] * bool(len(fid)))
        self.rows = np.zeros((T + len(f_objects) + int(nrows.sum()) + 1, room + width), np.uint8)
        for a, b, parts in groups:
            wire.left_aligned(parts, self.rows[a:b, room:room + int(lens[a:b].max())])
        self.rows[own] = self.rows[source]
        self.row_len = np.r_[lens, lens[source], np.full(int(nrows.sum()), FLOW_BYTES * per_row, np.int64), 0]
        self.flow_rows = np.r_[np.zeros(T + len(f_objects), bool), np.ones(int(nrows.sum()), bool), False]
        self._place_flows(fid, group, own[group], lens[source], inline, own, first_row, nrows, per_row)

    def _values(self, objects: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The fields of ``objects`` (ascending): name -> (values, present), the annotations'
        as ``ann0``, ``ann1``, ... in column order; ``group``: which fields each has, as one number."""
        v = {name: f.at(objects) for name, f in self._fields.items()}
        for j, (_, _, f) in enumerate(self._anns):
            v[f"ann{j}"] = f.at(objects)
        seg = v["seg"][0]
        has_counter, is_int = v["counter"][1], v["counter_int"][0].astype(bool)
        flags = ((seg == SEGMENTS["begin"]) | (seg == SEGMENTS["instant"])) & (v["flows"][0] == 0)
        v["flags"] = (flags.astype(np.int64), flags)
        v["is_int"] = (is_int.astype(np.int64), is_int)
        presence = [v["name"][1], has_counter & is_int, has_counter & ~is_int, flags]
        presence += [v[f"ann{j}"][1] for j in range(len(self._anns))]
        v["group"] = (_key([_Field([(0, h.view(np.int8), h)]) for h in presence], len(objects)),
                      np.ones(len(objects), bool))
        return v

    def _widest(self, objects: np.ndarray) -> int:
        """At most how wide the tail of an object where ``objects`` (bool) holds is, built by
        ``build`` (every varint at its longest): the rows are as wide, so those fit them."""
        fixed = 1 + len(wire.varint(self.seq)) + 1 + 10 + 2 + 11 + len(FLAGS)   # seq, length, type, track, flags
        widest = np.full(len(objects), fixed, np.int64)
        for f, w in [(self._fields["name"], 11), (self._fields["counter"], 12)] + [
                (f, 2 + len(_key_tag(k, kind)) + 10) for k, kind, f in self._anns]:
            for start, code, _ in f.parts:
                widest[start:start + len(code)] += w * (code >= 0)
        return int(widest[objects].max(initial=0))

    def _parts(self, v: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[list, np.ndarray]:
        """Per run of one group in ``v`` (rows sorted by group), its (start, end, parts); and each row's length."""
        g = v["group"][0]
        bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True]) if len(g) else np.zeros(1, np.int64)
        groups = []
        lens = np.zeros(len(g), np.int64)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            def at(name: str) -> np.ndarray:
                return v[name][0][a:b]
            body = [_annotation(k, kind, at(f"ann{j}")) for j, (k, kind, _) in enumerate(self._anns)
                    if v[f"ann{j}"][1][a]]
            kinds = np.empty((b - a, 2), np.uint8)
            kinds[:, 0], kinds[:, 1] = 0x48, at("seg") + 1    # type (9)
            body.append([(kinds, None, 2)])
            if v["name"][1][a]:
                body.append(wire.tagged(b"\x50", (at("name") + 1).astype(_U64)))    # name_iid (10)
            body.append(wire.tagged(b"\x58", self.uuid[at("track")].astype(_U64)))   # track_uuid (11)
            if v["counter"][1][a]:   # counter_value (30) or double_counter_value (44)
                body.append(wire.tagged(b"\xf0\x01", at("counter").view(_U64)) if v["is_int"][1][a]
                            else wire.fixed64(b"\xe1\x02", at("counter")))
            te_len = sum(np.broadcast_to(wire.length(p), (b - a,)) for p in body) + FLOW_BYTES * at("flows")
            parts = [wire.const(b"\x50" + wire.varint(self.seq), b - a), wire.tagged(b"\x5a", te_len.astype(_U64)),
                     *body, *([wire.const(FLAGS, b - a)] if v["flags"][1][a] else [])]
            lens[a:b] = sum(wire.length(p) for p in parts)
            groups.append((a, b, parts))
        return groups, lens

    def build(self, objects: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], np.ndarray]:
        """The tails of ``objects`` (those of ``object_tid`` -1), not left-aligned (their events'
        rows are compacted anyway): per group of the same fields, (which of ``objects``, their
        bytes, the bytes in use); and each one's length, in the order of ``objects``."""
        asc = np.argsort(objects, kind="stable")
        v = self._values(objects[asc])
        o = np.argsort(v["group"][0], kind="stable")
        groups, lens = self._parts({k: tuple(a[o] for a in x) for k, x in v.items()})
        which = asc[o]
        in_order = np.empty(len(which), np.int64)
        in_order[which] = lens
        return [(which[a:b], *wire.matrix(parts, b - a)[:2]) for a, b, parts in groups], in_order

    def _place_flows(self, fid: np.ndarray, group: np.ndarray, row_of: np.ndarray, tail: np.ndarray,
                     inline: np.ndarray, own: np.ndarray, first_row: np.ndarray, nrows: np.ndarray, per_row: int) -> None:
        """Write each flow id (of object ``group``, whose row is ``row_of``) after its object's tail
        (``tail`` bytes) where ``inline``, else ``per_row`` a row from ``first_row``; then the flags."""
        width = self.rows.shape[1]
        n_ids = np.bincount(group, minlength=len(tail))
        j = np.arange(len(fid)) - (np.cumsum(n_ids) - n_ids)[group]      # its index among its object's ids
        row = np.where(inline[group], row_of, first_row[group] + j // per_row)
        col = self.room + np.where(inline[group], tail[group] + FLOW_BYTES * j, FLOW_BYTES * (j % per_row))
        unit = np.empty((len(fid), FLOW_BYTES), np.uint8)
        unit[:, :2] = np.frombuffer(b"\xf9\x02", np.uint8)
        unit[:, 2:] = wire.le64(fid)
        self.rows.reshape(-1)[(row * width + col)[:, None] + np.arange(FLOW_BYTES)] = unit
        last = np.where(inline, own, first_row + nrows - 1)
        at = np.where(inline, tail + FLOW_BYTES * n_ids, FLOW_BYTES * (n_ids - (nrows - 1) * per_row))
        self.rows[last, self.room + at], self.rows[last, self.room + at + 1] = FLAGS[0], FLAGS[1]
        self.row_len[last] = at + len(FLAGS)
