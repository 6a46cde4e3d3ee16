"""The Perfetto writer's event packets (built by numpy from shared templates: perfetto_templates,
perfetto_events) against a reference that builds every event as a protobuf ``TracePacket`` of
its own: byte for byte, on real captured runs and on the corner cases templates have to get right
(flow ids past a row's room, doubles that compare equal but encode apart, distinct values)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import neuron_prof
from neuron_prof.export.buffered_writer import ProcessData
from neuron_prof.export.perfetto import PerfettoTraceWriter, _varint
from neuron_prof.export.perfetto_events import event_order
from neuron_prof.export.layout import write_run
from neuron_prof.export.check import check_bytes, iter_packets

T0 = 1_700_000_000_000_000_000


class _Keeping(PerfettoTraceWriter):
    """Keeps what it wrote from, for the reference."""

    def _write(self, procs: list[ProcessData]) -> None:
        self.procs = procs
        super()._write(procs)


def _reference(w: PerfettoTraceWriter, d: ProcessData, seq: int) -> list[bytes]:
    """The process's event packets, framed, one protobuf message per event, in the writer's order."""
    S, I = d.slices, d.instants
    ns, ni = len(S), len(I)
    columns = list(dict.fromkeys([(k, c.kind) for k, c in S.args.items()] + [(k, c.kind) for k, c in I.args.items()]))
    flows: dict[int, list[int]] = {}
    for kind, row, fid in zip(d.flow_kind.tolist(), d.flow_row.tolist(), d.flow_fid.tolist()):
        flows.setdefault(row if kind == 0 else ns + row, []).append(fid)
    out = []
    for e in event_order(d).tolist():
        p = pb.TracePacket()
        te = p.track_event
        if e < ns or 2 * ns <= e < 2 * ns + ni:   # a slice's begin, or an instant
            table, row, obj = (S, e, e) if e < ns else (I, e - 2 * ns, e - ns)
            p.timestamp = int(table.ts[row])
            for key, kind in columns:
                c = table.args.get(key)
                if c is None or c.kind != kind or not c.present[row]:
                    continue
                a = te.debug_annotations.add()
                a.name_iid = w.arg_keys.index[key] + 1
                v = c.values[row]
                if kind == "s":
                    a.string_value_iid = int(v) + 1
                elif kind == "i":
                    a.int_value = int(v)
                elif kind == "b":
                    a.bool_value = bool(v)
                else:
                    a.double_value = float(v)
            te.type = pb.TrackEvent.TYPE_SLICE_BEGIN if e < ns else pb.TrackEvent.TYPE_INSTANT
            te.name_iid = int(table.name[row]) + 1
            te.track_uuid = w._uuid(int(table.track[row]))
            te.flow_ids.extend(sorted(flows.get(obj, [])))
            p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        elif e < 2 * ns:
            row = 2 * ns - 1 - e
            p.timestamp = int(S.ts[row] + S.dur[row])
            te.type = pb.TrackEvent.TYPE_SLICE_END
            te.track_uuid = w._uuid(int(S.track[row]))
        else:
            row = e - 2 * ns - ni
            p.timestamp = int(d.counter_ts[row])
            te.type = pb.TrackEvent.TYPE_COUNTER
            te.track_uuid = w._uuid(int(d.counter_track[row]))
            if d.counter_int[row]:
                te.counter_value = int(d.counter_val[row])
            else:
                te.double_counter_value = float(d.counter_val[row])
        p.trusted_packet_sequence_id = seq
        body = p.SerializeToString()
        out.append(b"\x0a" + _varint(len(body)) + body)
    return out


def _written(data: bytes) -> dict[int, list[bytes]]:
    """The trace's event packets, framed as in the file, by sequence."""
    offsets = [(off, p) for off, p in iter_packets(data)]
    out: dict[int, list[bytes]] = {}
    for (off, p), nxt in zip(offsets, [o for o, _ in offsets[1:]] + [len(data)]):
        if p.HasField("track_event"):
            out.setdefault(p.trusted_packet_sequence_id, []).append(data[off:nxt])
    return out


def _same_as_reference(w: _Keeping, data: bytes) -> int:
    """Assert the events match the reference packet for packet; returns how many there were."""
    rep = check_bytes(data, keep_events=False)
    assert rep.ok and not rep.warnings, (rep.errors, rep.warnings)
    written = _written(data)
    n = 0
    for j, d in enumerate(w.procs):
        ref = _reference(w, d, j + 1)
        got = written.get(j + 1, [])
        assert len(got) == len(ref)
        bad = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
        assert bad is None, (j, bad, got[bad], ref[bad])
        n += len(ref)
    return n


@pytest.mark.parametrize("fixture", ["demo_run", "device_run"])
def test_real_runs_encode_as_the_reference(fixture, request, tmp_path):
    """A captured transformer run (ops with their annotations, steps, marks, memory counters and
    events) and an emulated-device run (kernels with distinct ids, a flow from every op that
    queued work, queue-depth counters), with the export's own mapping."""
    run = neuron_prof.load(request.getfixturevalue(fixture))
    path = tmp_path / "t.perfetto-trace"
    w = _Keeping(path, chunk_events=4096, threads=2)   # several chunks, encoded in parallel
    write_run(run, w)
    data = path.read_bytes()
    assert _same_as_reference(w, data) > 1000
    if fixture == "device_run":
        assert w.stats["flows"] > 100


def test_corner_cases_encode_as_the_reference(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    w = _Keeping(path, chunk_events=5, threads=2)
    p0, p1 = w.process(10, "rank 0"), w.process(20, "rank 1")
    w.process(30, "idle")                      # a process with no events
    lone = w.process(40, "lone")               # one with no slice, its events' tails all their own
    w.instants(w.track(lone, "x"), np.array([T0]), "once", {"n": np.array([7])})
    w.counters(w.counter_track(lone, "c"), np.array([T0 + 1]), np.array([2.5]))
    t0, t1 = w.thread_track(p0, 1, "main"), w.thread_track(p0, 2, "side")
    u = w.thread_track(p1, 3, "main")
    n = 12
    ts = T0 + np.arange(n, dtype=np.int64) * 100
    ids = w.slices(np.where(np.arange(n) % 2, t0, t1), ts, np.full(n, 50), np.array(["op"] * n, dtype=object), {
        "d": np.array([0.0, -0.0, 0.0, math.inf, -1.5, np.nan] * 2),          # -0.0 apart from 0.0; NaN omitted
        "i": np.array([-1, 2 ** 62, 0, -(2 ** 63), 5, 5] * 2),             # negative: 10-byte varints
        "b": np.array([True, False] * 6),
        "uniq": np.arange(n) * 1000,                                       # distinct: every slice its own
        "s": np.array(["x", "", "y", None, "x", "z"] * 2, dtype=object)})   # "" and None omitted
    other = w.slices(u, T0 + np.arange(3) * 1000, np.array([900, 10, 10]), np.array(["a", "b", "c"], dtype=object))
    marks = w.instants(w.track(p1, "marks"), np.array([0, 127, 128, 2 ** 40]), "edge", {"s": np.array(["m"] * 4)})
    w.counters(w.counter_track(p0, "bytes", "bytes"), T0 + np.array([1, 2, 3]), np.array([-5, 0, 2 ** 40]))
    w.counters(w.counter_track(p0, "ratio"), T0 + np.array([1, 2, 3]), np.array([0.0, -0.0, 0.5]))
    w.flows(np.full(40, ids[0]), other[[0, 1]].repeat(20))    # 40 arrows from one slice: past its row's room
    w.flows(ids[1:4], marks[:3])                               # to instants; across processes
    w.close()
    assert _same_as_reference(w, path.read_bytes()) == 2 * n + 4 + 6 + 6 + 2
