"""Trace writers: native Perfetto protobuf (checked by neuron_prof's strict reader, what
`neuron-prof inspect` runs) and Chrome JSON, behind one interface."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from neuron_prof.export.chrome import ChromeTraceWriter
from neuron_prof.export.perfetto import PerfettoTraceWriter, is_end_of_trace, varint_block, writer_of, _varint
from neuron_prof.export.nesting import nest_repair
from neuron_prof.export.formats import open_writer
from neuron_prof.export.writer import TraceWriter
from neuron_prof.export.check import check_bytes, iter_packets

T0 = 1_700_000_000_000_000_000  # realistic ns timestamps (9-byte varints)


# ----------------------------------------------------------------------------- helpers

def ok_report(data: bytes):
    rep = check_bytes(data)
    assert rep.ok, rep.errors
    assert not rep.warnings, rep.warnings
    assert rep.stats.get("unterminated_slices", 0) == 0
    assert rep.writer and rep.writer.startswith("neuron_prof ")
    return rep


def expected_slices(track, ts, dur, names):
    """Reference nesting: per track, pre-order (ts asc, end desc), depth = open ancestors."""
    out = []
    by_track = defaultdict(list)
    for i, (t, s, d, n) in enumerate(zip(track, ts, dur, names)):
        by_track[t].append((s, -(s + d), i, d, n))
    for t, rows in by_track.items():
        stack = []  # (start, end) of open slices; zero-length ones stay open for later begins at that time
        for s, negend, i, d, n in sorted(rows):
            while stack and (stack[-1][1] < s or (stack[-1][1] == s and stack[-1][0] < s)):
                stack.pop()
            out.append((t, s, d, len(stack), n))
            stack.append((s, s + d))
    return sorted(out)


def decoded_events(data: bytes):
    """(TracePacket, resolved name, {annotation name: value}) for every track event."""
    names, keys, vals = {}, {}, {}
    out = []
    for _, p in iter_packets(data):
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names[seq], keys[seq], vals[seq] = {}, {}, {}
        if p.HasField("interned_data"):
            names[seq].update({e.iid: e.name for e in p.interned_data.event_names})
            keys[seq].update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
            vals[seq].update({e.iid: e.str.decode() for e in p.interned_data.debug_annotation_string_values})
        if p.HasField("track_event"):
            e = p.track_event
            ann = {}
            for a in e.debug_annotations:
                k = keys[seq][a.name_iid]
                which = a.WhichOneof("value")
                if which == "string_value_iid":
                    ann[k] = vals[seq][a.string_value_iid]
                else:
                    ann[k] = getattr(a, which)
            out.append((p, names[seq].get(e.name_iid) if e.HasField("name_iid") else None, ann))
    return out


def build(writer, with_flows=True):
    """Two processes, several threads, nested slices, instants, counters, annotations."""
    w = writer
    p0 = w.process(100, "rank 0 (host-a)")
    p1 = w.process(200, "rank 1 (host-b)")
    h = {
        "t0": w.thread_track(p0, 101, "python"),
        "t1": w.thread_track(p0, 102, "autograd"),
        "steps0": w.track(p0, "Steps"),
        "sync0": w.track(p0, "Sync points"),
        "mem0": w.counter_track(p0, "allocated", "bytes"),
        "t2": w.thread_track(p1, 201, "python"),
        "steps1": w.track(p1, "Steps"),
        "util1": w.counter_track(p1, "util", "%"),
    }
    assert w.thread_track(p0, 101, "python") == h["t0"]  # idempotent
    # rank 0 python thread: nested, equal starts, equal ends, back-to-back, zero-length
    ts = T0 + np.array([0, 0, 10, 10, 40, 60, 60, 90, 100, 100, 130])
    dur = np.array([100, 50, 20, 20, 10, 40, 0, 10, 50, 0, 20])
    names = pd.Categorical(["step", "fwd", "linear", "addmm", "relu", "bwd", "mark", "mm", "opt", "z", "sgd"])
    shapes = np.array(["[[4, 8]]", "", "[[4, 8], [8, 8]]", "[[4, 8], [8, 8]]", "", "", "", "[[8, 8]]", "", "",
                       "[[8]]"], dtype=object)
    dtypes = pd.Categorical(["", "", "float32", "float32", "bfloat16", "", "", "float32", "", "", "float32"])
    seqn = np.arange(11, dtype=np.int64) * 1000
    ids0 = w.slices(h["t0"], ts, dur, names, {"shapes": shapes, "dtypes": dtypes, "seq": seqn})
    # rank 0 autograd thread, per-row track array, object names
    ids1 = w.slices(np.array([h["t1"]] * 3), T0 + np.array([65, 70, 70]), np.array([30, 10, 5]),
                    np.array(["AddmmBackward", "mm", "mm"], dtype=object),
                    {"module": np.array(["model.fc", "", None], dtype=object)})
    w.slices(h["steps0"], T0 + np.array([0, 150]), np.array([150, 50]), np.array(["step 0", "step 1"], dtype=object),
             {"captured": np.array(["yes", "no"], dtype=object)})
    w.instants(h["sync0"], T0 + np.array([95, 140]), np.array([".item()", "cuda sync"], dtype=object),
               {"why": np.array(["host read", ""], dtype=object)})
    w.instants(h["t0"], T0 + np.array([15]), "marker")
    w.counters(h["mem0"], T0 + np.array([0, 10, 20, 120]), np.array([0, 4096, 8192, 1024]))
    # rank 1
    ids2 = w.slices(h["t2"], T0 + np.array([5, 8, 9, 50]), np.array([40, 30, 1, 5]),
                    pd.Categorical(["step", "fwd", "linear", "opt"]),
                    {"shapes": pd.Categorical(["", "[[4, 8]]", "", ""])})
    w.slices(h["steps1"], T0 + np.array([5]), np.array([45]), np.array(["step 0"], dtype=object))
    w.counters(h["util1"], T0 + np.array([5, 25]), np.array([0.5, 0.75]))
    if with_flows:
        w.flows(ids0[[3]], ids2[[2]])   # rank0 addmm@10 -> rank1 linear@9 (earlier): arrow still drawn
        w.flows(ids0[[7]], ids1[[1]])   # same process, different threads
    return h, (ids0, ids1, ids2)


EXPECTED_SLICES = {  # handle name -> [(ts - T0, dur, depth, name)]
    "t0": [(0, 100, 0, "step"), (0, 50, 1, "fwd"), (10, 20, 2, "linear"), (10, 20, 3, "addmm"),
           (15, 0, 4, "marker"), (40, 10, 2, "relu"), (60, 40, 1, "bwd"), (60, 0, 2, "mark"), (90, 10, 2, "mm"),
           (100, 50, 0, "opt"), (100, 0, 1, "z"), (130, 20, 1, "sgd")],
    "t1": [(65, 30, 0, "AddmmBackward"), (70, 10, 1, "mm"), (70, 5, 2, "mm")],
    "steps0": [(0, 150, 0, "step 0"), (150, 50, 0, "step 1")],
    "sync0": [(95, 0, 0, ".item()"), (140, 0, 0, "cuda sync")],
    "t2": [(5, 40, 0, "step"), (8, 30, 1, "fwd"), (9, 1, 2, "linear"), (50, 5, 0, "opt")],
    "steps1": [(5, 45, 0, "step 0")],
}


def by_track(rep, w, h):
    uuid = {name: w._uuid(hd) for name, hd in h.items()}
    got = defaultdict(list)
    for u, ts, dur, depth, name in rep.slices:
        got[u].append((ts - T0, dur, depth, name))
    return {name: sorted(got[uuid[name]]) for name in h if uuid[name] in got}


# ----------------------------------------------------------------------------- perfetto

def test_perfetto_two_processes_strict(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    assert isinstance(w, TraceWriter)
    h, _ = build(w)
    w.close()
    data = path.read_bytes()
    rep = ok_report(data)
    assert by_track(rep, w, h) == {k: sorted(v) for k, v in EXPECTED_SLICES.items()}
    assert rep.stats["slices"] == 11 + 3 + 2 + 4 + 1
    assert rep.stats["instants"] == 3
    assert rep.stats["sequences"] == 2
    assert w.stats["repaired_slices"] == 0
    # track descriptors: names and parents
    tr = rep.tracks
    procs = {u: t for u, t in tr.items() if t["kind"] == "process"}
    assert sorted(t["name"] for t in procs.values()) == ["rank 0 (host-a)", "rank 1 (host-b)"]
    names = {hn: tr[w._uuid(hd)] for hn, hd in h.items()}
    assert names["t0"]["kind"] == "thread" and names["t0"]["name"] == "python"
    assert names["t1"]["name"] == "autograd"
    assert names["steps0"]["kind"] == "custom" and names["steps0"]["name"] == "Steps"
    assert names["sync0"]["name"] == "Sync points"
    assert names["mem0"]["kind"] == "counter" and names["mem0"]["name"] == "allocated"
    assert tr[w._uuid(h["t2"])]["parent"] != tr[w._uuid(h["t0"])]["parent"]
    assert tr[w._uuid(h["t0"])]["parent"] == tr[w._uuid(h["steps0"])]["parent"] in procs
    # counters: exact values, integer kept as counter_value, float as double_counter_value
    cnt = sorted((u, ts - T0, v) for u, ts, v in rep.counters)
    assert cnt == sorted([(w._uuid(h["mem0"]), t, v) for t, v in [(0, 0), (10, 4096), (20, 8192), (120, 1024)]]
                         + [(w._uuid(h["util1"]), 5, 0.5), (w._uuid(h["util1"]), 25, 0.75)])
    ev = decoded_events(data)
    kinds = {(p.track_event.track_uuid, p.track_event.type) for p, _, _ in ev}
    assert (w._uuid(h["mem0"]), pb.TrackEvent.TYPE_COUNTER) in kinds
    mem = [p.track_event for p, _, _ in ev if p.track_event.track_uuid == w._uuid(h["mem0"])]
    assert all(e.HasField("counter_value") for e in mem)
    util = [p.track_event for p, _, _ in ev if p.track_event.track_uuid == w._uuid(h["util1"])]
    assert all(e.HasField("double_counter_value") for e in util)
    # descriptors: thread pid/tid, counter unit
    descs = {p.track_descriptor.uuid: p.track_descriptor for _, p in iter_packets(data) if p.HasField("track_descriptor")}
    d = descs[w._uuid(h["t2"])]
    assert (d.thread.pid, d.thread.tid) == (200, 201)
    assert descs[w._uuid(h["mem0"])].counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    assert descs[w._uuid(h["util1"])].counter.unit_name == "%"


def test_perfetto_sequences_and_interning_flags(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    build(w)
    w.close()
    first = {}
    packets = [p for _, p in iter_packets(path.read_bytes())]
    # the start and end-of-trace packets belong to no sequence; every other packet does
    assert writer_of(packets[0]) and is_end_of_trace(packets[-1])
    assert packets[0].trusted_packet_sequence_id == packets[-1].trusted_packet_sequence_id == 0
    for p in packets[1:-1]:
        seq = p.trusted_packet_sequence_id
        assert seq != 0
        if seq not in first:
            first[seq] = p
            assert p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        if p.HasField("track_event"):
            e = p.track_event
            assert e.type != pb.TrackEvent.TYPE_UNSPECIFIED
            uses_iid = e.HasField("name_iid") or any(a.HasField("name_iid") for a in e.debug_annotations)
            if uses_iid:
                assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            assert not e.HasField("name")  # names always interned
    assert len(first) == 2


def test_debug_annotations_decode(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    h, _ = build(w)
    w.close()
    ev = decoded_events(path.read_bytes())
    begins = [(p.timestamp - T0, p.track_event.track_uuid, name, ann) for p, name, ann in ev
              if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    t0 = {(ts, n): a for ts, u, n, a in begins if u == w._uuid(h["t0"])}
    assert t0[(0, "step")] == {"shapes": "[[4, 8]]", "seq": 0}
    assert t0[(10, "linear")] == {"shapes": "[[4, 8], [8, 8]]", "dtypes": "float32", "seq": 2000}
    assert t0[(40, "relu")] == {"dtypes": "bfloat16", "seq": 4000}   # empty shapes omitted
    assert t0[(0, "fwd")] == {"seq": 1000}
    t1 = sorted((ts, n, sorted(a.items())) for ts, u, n, a in begins if u == w._uuid(h["t1"]))
    assert t1 == [(65, "AddmmBackward", [("module", "model.fc")]), (70, "mm", []), (70, "mm", [])]  # ""/None omitted
    t2 = {(ts, n): a for ts, u, n, a in begins if u == w._uuid(h["t2"])}
    assert t2[(8, "fwd")] == {"shapes": "[[4, 8]]"} and t2[(5, "step")] == {}
    inst = {(p.timestamp - T0, name): ann for p, name, ann in ev
            if p.track_event.type == pb.TrackEvent.TYPE_INSTANT}
    assert inst == {(95, ".item()"): {"why": "host read"}, (140, "cuda sync"): {}, (15, "marker"): {}}
    ends = [p for p, _, _ in ev if p.track_event.type == pb.TrackEvent.TYPE_SLICE_END]
    assert ends and all(not p.track_event.debug_annotations for p in ends)


def test_packets_byte_identical_to_protobuf(tmp_path):
    """Hand-encoded event packets are canonical: re-serializing the parsed message gives the same bytes."""
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    build(w)
    w.counters(w.counter_track(0, "neg"), T0 + np.array([1, 2]), np.array([-5, 3]))
    w.instants(w.track(0, "early"), np.array([0, 127, 128, 2 ** 40]), "edge")   # small/varied varint lengths
    w.close()
    data = path.read_bytes()
    ok_report(data)
    pos, n = 0, 0
    while pos < len(data):
        assert data[pos] == 0x0A
        ln, p2 = 0, pos + 1
        shift = 0
        while True:
            b = data[p2]
            p2 += 1
            ln |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        raw = data[p2:p2 + ln]
        pkt = pb.TracePacket.FromString(raw)
        if pkt.HasField("track_event"):
            assert pkt.SerializeToString() == raw
            n += 1
        pos = p2 + ln
    assert n > 40


def test_partial_overlap_is_repaired(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    p = w.process(1, "r")
    t = w.thread_track(p, 1, "main")
    u = w.thread_track(p, 2, "ok")
    # A [0,100) B [50,150) partial; C [120,130) inside B after A ends; D [60, 200) overlaps all; E negative
    w.slices(t, T0 + np.array([0, 50, 120, 60, 300]), np.array([100, 100, 10, 140, -5]),
             np.array(list("ABCDE"), dtype=object))
    w.slices(u, T0 + np.array([0, 10]), np.array([50, 10]), np.array(["x", "y"], dtype=object))
    w.close()
    rep = ok_report(path.read_bytes())
    got = by_track(rep, w, {"t": t, "u": u})
    # pre-order: A(0) B(50) D(60) C(120)... B clipped to A's end (100), D clipped to B's (100);
    # C starts after both ended: top level. E gets dur 0.
    assert got["t"] == sorted([(0, 100, 0, "A"), (50, 50, 1, "B"), (60, 40, 2, "D"), (120, 10, 0, "C"),
                               (300, 0, 0, "E")])
    assert got["u"] == [(0, 50, 0, "x"), (10, 10, 1, "y")]
    assert w.stats["repaired_slices"] == 3


def test_random_nesting_with_ties_matches_reference(tmp_path):
    """Coarse timestamps (many ties), duplicates, zero lengths, shuffled input, several tracks."""
    rng = np.random.default_rng(7)
    tracks, ts, dur = [], [], []
    for trk in range(3):
        def gen(lo, hi, depth):
            t = lo
            while t < hi and depth < 6:
                s = int(rng.integers(t, hi + 1))
                e = int(rng.integers(s, hi + 1))
                tracks.append(trk), ts.append(s), dur.append(e - s)
                if rng.random() < 0.3:  # exact duplicate
                    tracks.append(trk), ts.append(s), dur.append(e - s)
                if e > s:
                    gen(s, e, depth + 1)
                t = e if rng.random() < 0.5 else e + 1
        gen(0, 60, 0)
    n = len(ts)
    perm = rng.permutation(n)
    tracks, ts, dur = np.array(tracks)[perm], np.array(ts, np.int64)[perm], np.array(dur, np.int64)[perm]
    names = np.array([f"n{i}" for i in range(n)], dtype=object)
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path, chunk_events=64, threads=2)
    p = w.process(1, "r")
    hs = np.array([w.thread_track(p, 10 + i, f"t{i}") for i in range(3)])
    w.slices(hs[tracks], T0 + ts, dur, names)
    w.close()
    rep = ok_report(path.read_bytes())
    assert w.stats["repaired_slices"] == 0
    uuid2trk = {w._uuid(int(hs[i])): i for i in range(3)}
    got = sorted((uuid2trk[u], s - T0, d, dep, nm) for u, s, d, dep, nm in rep.slices)
    # depth is ambiguous only among exact duplicates / equal zero-length slices: compare per (track, ts, dur)
    exp = expected_slices(tracks.tolist(), ts.tolist(), dur.tolist(), names.tolist())
    key = lambda r: (r[0], r[1], r[2], r[3])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, exp))
    assert sorted(r[4] for r in got) == sorted(names.tolist())


def test_chunking_and_threads_do_not_change_bytes(tmp_path):
    outs = []
    for kw in ({"threads": 1}, {"threads": 2, "chunk_events": 7}, {"threads": 1, "chunk_events": 1}):
        path = tmp_path / f"t{len(outs)}.perfetto-trace"
        w = PerfettoTraceWriter(path, **kw)
        build(w)
        w.close()
        outs.append(path.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_flows(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    h, _ = build(w)
    w.close()
    rep = ok_report(path.read_bytes())
    assert w.stats["flows"] == 2
    fl = sorted((a[0], a[1] - T0, a[2], b[0], b[1] - T0, b[2]) for _, a, b in rep.flows)
    u = lambda k: w._uuid(h[k])  # noqa: E731
    # arrows run from the earlier event to the later one
    assert fl == sorted([(u("t2"), 9, "linear", u("t0"), 10, "addmm"), (u("t1"), 70, "mm", u("t0"), 90, "mm")])
    # the reader tells which process (rank) each end is on: one arrow joins ranks, one stays in rank 0
    rank0, rank1 = w._uuid(_proc(w, 100)), w._uuid(_proc(w, 200))
    assert sorted((rep.process_of(a.track), rep.process_of(b.track)) for _, a, b in rep.flows) == sorted(
        [(rank1, rank0), (rank0, rank0)])
    assert rep.stats["flows_across_processes"] == 1


def _proc(w, pid: int) -> int:
    """The handle of the process with ``pid``."""
    return next(t.handle for t in w.tracks if t.kind == "process" and t.pid == pid)


def _flow_packets(data: bytes) -> tuple[list, list[int]]:
    """The trace's packets and the indices of those whose event carries a flow id."""
    pkts = [p for _, p in iter_packets(data)]
    return pkts, [i for i, p in enumerate(pkts) if p.HasField("track_event") and len(p.track_event.flow_ids)]


def _framed(pkts) -> bytes:
    return b"".join(b"\x0a" + _varint(len(b)) + b for b in (p.SerializeToString() for p in pkts))


def test_a_flow_with_one_end_or_on_a_counter_is_an_error(tmp_path):
    """An arrow the UI would drop without a word (one end missing) or cannot draw (on a counter)."""
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path)
    build(w)
    w.close()
    pkts, carriers = _flow_packets(path.read_bytes())
    assert len(carriers) == 4  # two arrows, two ends each
    fid = pkts[carriers[0]].track_event.flow_ids[0]
    del pkts[carriers[0]].track_event.flow_ids[:]
    rep = check_bytes(_framed(pkts))
    assert not rep.ok and any(f"flow {fid}: only one event carries it" in e for e in rep.errors)
    # another tool's trace (no neuron_prof start packet) may be a window of a longer one: a warning
    rep = check_bytes(_framed(pkts[1:-1]))
    assert rep.ok and any(f"flow {fid}" in m for m in rep.warnings)

    pkts, carriers = _flow_packets(path.read_bytes())
    counter = next(p for p in pkts if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_COUNTER)
    counter.track_event.flow_ids.append(pkts[carriers[0]].track_event.flow_ids[0])
    rep = check_bytes(_framed(pkts))
    assert any("flow ids on a counter event" in e for e in rep.errors)


def test_gzip_and_empty(tmp_path):
    path = tmp_path / "t.perfetto-trace.gz"
    w = PerfettoTraceWriter(path)
    h, _ = build(w)
    w.close()
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    rep = ok_report(gzip.decompress(raw))
    assert rep.stats["slices"] == 21
    # a writer with a process and no events still writes a valid trace
    path = tmp_path / "empty.perfetto-trace"
    with PerfettoTraceWriter(path) as w:
        w.thread_track(w.process(5, "idle"), 5, "main")
    rep = ok_report(path.read_bytes())
    assert rep.stats["track_descriptors"] == 2


def test_varint_block_matches_reference():
    vals = np.array([0, 1, 127, 128, 300, 16383, 16384, 2 ** 35, 2 ** 56 - 1, 2 ** 63 - 1, 2 ** 64 - 1], np.uint64)
    blk, msk, lens = varint_block(vals)
    for i, v in enumerate(vals.tolist()):
        assert blk[i][msk[i]].tobytes() == _varint(v)
    blk, msk, lens = varint_block(np.full(5, T0, np.uint64))
    assert msk is None and lens == 9 and blk[0].tobytes() == _varint(T0)


def test_nest_repair_unit():
    track = np.zeros(3, np.int32)
    dur, reps, order = nest_repair(track, np.array([0, 5, 5], np.int64), np.array([10, 10, 3], np.int64))
    assert dur.tolist() == [10, 5, 3] and reps == 1 and len(order) == 6


def test_open_writer(tmp_path):
    assert isinstance(open_writer(tmp_path / "a", "perfetto"), PerfettoTraceWriter)
    assert isinstance(open_writer(tmp_path / "b", "chrome"), ChromeTraceWriter)
    with pytest.raises(ValueError):
        open_writer(tmp_path / "c", "svg")


# ----------------------------------------------------------------------------- chrome

def test_chrome_json(tmp_path):
    path = tmp_path / "t.json"
    w = ChromeTraceWriter(path)
    assert isinstance(w, TraceWriter)
    h, _ = build(w)
    w.close()
    doc = json.loads(path.read_text(), parse_float=Decimal)  # exact: ts are ~1.7e15 us with ns decimals
    ev = doc["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    pnames = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert pnames == {100: "rank 0 (host-a)", 200: "rank 1 (host-b)"}
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert tnames[(100, 101)] == "python" and tnames[(100, 102)] == "autograd" and tnames[(200, 201)] == "python"
    steps_tid = [k for k, v in tnames.items() if v == "Steps" and k[0] == 100]
    assert len(steps_tid) == 1 and steps_tid[0][1] not in (101, 102)
    X = [e for e in ev if e["ph"] == "X"]
    assert len(X) == 11 + 3 + 2 + 4 + 1
    t0 = sorted((round(e["ts"] * 1000) - T0, round(e["dur"] * 1000), e["name"]) for e in X
                if (e["pid"], e["tid"]) == (100, 101))
    assert t0 == sorted((ts, d, n) for ts, d, _, n in EXPECTED_SLICES["t0"] if n != "marker")
    lin = next(e for e in X if e["name"] == "linear" and e["pid"] == 100)
    assert lin["args"] == {"shapes": "[[4, 8], [8, 8]]", "dtypes": "float32", "seq": 2000}
    relu = next(e for e in X if e["name"] == "relu")
    assert relu["args"] == {"dtypes": "bfloat16", "seq": 4000}
    fwd1 = next(e for e in X if e["name"] == "fwd" and e["pid"] == 200)
    assert fwd1["args"] == {"shapes": "[[4, 8]]"}
    assert "args" not in next(e for e in X if e["name"] == "step" and e["pid"] == 200)
    I = sorted((e["name"], round(e["ts"] * 1000) - T0, e.get("args")) for e in ev if e["ph"] == "i")
    assert I == [(".item()", 95, {"why": "host read"}), ("cuda sync", 140, None), ("marker", 15, None)]
    C = sorted((e["pid"], e["name"], round(e["ts"] * 1000) - T0, e["args"]["value"]) for e in ev if e["ph"] == "C")
    assert C == [(100, "allocated", 0, 0), (100, "allocated", 10, 4096), (100, "allocated", 20, 8192),
                 (100, "allocated", 120, 1024), (200, "util", 5, Decimal("0.5")), (200, "util", 25, Decimal("0.75"))]
    s = [e for e in ev if e["ph"] == "s"]
    f = [e for e in ev if e["ph"] == "f"]
    assert len(s) == len(f) == 2 and all(e["bp"] == "e" for e in f)
    assert {e["id"] for e in s} == {e["id"] for e in f}


def test_chrome_exact_microseconds_and_repair(tmp_path):
    path = tmp_path / "t.json.gz"
    w = ChromeTraceWriter(path)
    t = w.thread_track(w.process(1, 'we"ird\nname'), 1, "main")
    w.slices(t, np.array([1_234_567, 1_300_000]), np.array([1_000_001, 1_000_000]),
             np.array(["a\u00e9", 'q"'], dtype=object))
    w.close()
    doc = json.loads(gzip.decompress(path.read_bytes()))
    X = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in X] == [("a\u00e9", 1234.567, 1000.001), ('q"', 1300.0, 934.568)]
    assert w.stats["repaired_slices"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_arbitrary_overlaps_always_check_ok(tmp_path, seed):
    """Random intervals (partial overlaps, ties, zero lengths) + instants + counters on two processes:
    output always passes strict checking and matches a reference clip-repair."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "t.perfetto-trace"
    w = PerfettoTraceWriter(path, chunk_events=int(rng.integers(1, 50)), threads=int(rng.integers(1, 3)))
    ref = []
    for pi in range(2):
        p = w.process(10 + pi, f"p{pi}")
        hs = np.array([w.thread_track(p, 100 + i, f"t{i}") for i in range(3)] + [w.track(p, "custom")])
        n = int(rng.integers(1, 300))
        trk = rng.integers(0, len(hs), n)
        ts = rng.integers(0, 40, n).astype(np.int64)
        dur = rng.integers(-2, 25, n).astype(np.int64) * (rng.random(n) < 0.9)
        names = np.array([f"s{pi}_{i}" for i in range(n)], dtype=object)
        w.slices(hs[trk], T0 + ts, dur, pd.Categorical(names))
        w.instants(hs[rng.integers(0, len(hs), 20)], T0 + rng.integers(0, 40, 20), "i")
        w.counters(w.counter_track(p, "c"), T0 + rng.integers(0, 40, 10), rng.random(10))
        # reference repair: pre-order, clip to the enclosing slice's end
        end = ts + np.maximum(dur, 0)
        for k in range(len(hs)):
            rows = sorted((int(ts[i]), -int(end[i]), i) for i in np.flatnonzero(trk == k))
            stack = []
            for s, ne, i in rows:
                e = -ne
                while stack and stack[-1] <= s:
                    stack.pop()
                if stack and e > stack[-1]:
                    e = stack[-1]
                stack.append(e)
                ref.append((w._uuid(int(hs[k])), s, e - s, names[i]))
    w.close()
    rep = ok_report(path.read_bytes())
    got = sorted((u, s - T0, d, nm) for u, s, d, _, nm in rep.slices if nm != "i")
    assert got == sorted(ref)
    assert rep.stats["instants"] == 40 and len(rep.counters) == 20
