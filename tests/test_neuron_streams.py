"""Streams and events on the emulated `neuron` device (tests/neuron_streams_script.py, in a process
of its own: enabling the device renames PrivateUse1 for a whole process): training with inputs
prefetched on a side stream, PyTorch's generic stream and event classes, memory a side stream
still reads, pinned memory, and what a capture records of streams, events and host waits (hook
API version 2). Timing facts come from the recorded timestamps; where one compares spans, the
script makes the effect tens of times its noise (2 ms kernels that sleep on the device, 50 of
them in a long stream) and the test says so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import neuron_prof
from conftest import check_trace, line_of, script_facts
from neuron_prof.export.run_export import export_run
from neuron_prof.export.check import TraceReport

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]  # a training in a process of its own

SCRIPT = Path(__file__).with_name("neuron_streams_script.py")


@pytest.fixture(scope="module")
def streams_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run, Path]:
    root = tmp_path_factory.mktemp("streams")
    return script_facts(SCRIPT, root / "run"), neuron_prof.load(root / "run"), root


def at_line(df, marker: str):
    """Rows of ``df`` whose user line is the script's line holding ``marker``."""
    return df[df["user_source"].astype(str).str.endswith(f"neuron_streams_script.py:{line_of(SCRIPT, marker)}")]


def ends(df):
    return df["ts"] + df["dur"]


def completion(run, event: int) -> int:
    done = run.event_completions
    (ts,) = done.loc[done["event"] == event, "ts"]
    return int(ts)


def test_training_with_inputs_prefetched_on_a_side_stream_is_bitwise_the_cpu(streams_run):
    facts, _, _ = streams_run
    assert facts["prefetched"] == facts["cpu"] == facts["captured"]


def test_pytorchs_generic_streams_events_and_accelerator_work_on_the_device(streams_run):
    g = streams_run[0]["generic"]
    assert g["new_stream_id"] > 0 and g["default_id"] == 0 == g["default_stream"]
    assert g["set"] and g["in_context"] and g["after"] and g["result"] and g["queries"] == [True, True]
    assert g["neuron_stream_is_torch_stream"] and g["neuron_event_is_torch_event"] and g["pinned"]


def test_memory_a_side_stream_still_reads_is_not_freed_under_it(streams_run):
    # the host dropped the tensor at once; the side stream read it 100 ms later, while the default
    # stream allocated and filled eight tensors of its size
    assert streams_run[0]["freed_while_read"]


def test_a_non_blocking_copy_from_pinned_memory_reads_it_in_place(streams_run):
    # each copy waited behind 100 ms of queued kernels; the host changed the source right after
    # queuing it: the pinned source was read when the copy ran, the pageable one was staged
    assert streams_run[0]["pinned_read"] == {"pinned": [5.0] * 4, "pageable": [0.0] * 4}


@pytest.mark.timing  # two streams of 100 ms each, queued within a few ms of each other
def test_kernels_of_two_streams_run_at_the_same_time(streams_run):
    facts, run, _ = streams_run
    k = run.device_kernels
    k = k[k["step"] == 0]  # overlap(): 50 kernels of 2 ms queued on each stream, no wait between them
    side, main = k[k["stream"] == facts["side"]], k[k["stream"] == 0]
    assert len(side) >= 50 and len(main) >= 50
    # some side kernel starts before a stream-0 kernel ends and ends after it starts (each stream
    # holds 100 ms of kernels, queued within a few ms of each other)
    overlapping = [((s.ts < ends(main)) & (s.ts + s.dur > main["ts"])).any() for s in side.itertuples()]
    assert any(overlapping)


def test_a_wait_orders_the_default_stream_after_the_event(streams_run):
    facts, run, _ = streams_run
    events = run.event_enqueues
    (wait,) = at_line(events, "WAIT-LINE").itertuples()
    assert wait.kind == "wait" and wait.stream == 0
    record = events[(events["event"] == wait.event) & (events["kind"] == "record")]
    assert record["stream"].tolist() == [facts["side"]] and record["ts"].iloc[0] < wait.ts
    done = completion(run, wait.event)
    # every stream-0 kernel queued after the wait started after the event completed (the side
    # stream's 100 ms of kernels ran first; without the wait they would have started at once)
    k, enq = run.device_kernels, run.device_enqueues
    queued_at = enq.set_index("id")["ts"]
    first_queued = k["enqueue_ids"].map(lambda ids: queued_at.loc[list(ids)].min())
    after = k[(k["stream"] == 0) & (k["step"] == 1) & (first_queued > wait.ts)]  # step 1: ordered()
    assert len(after) >= 5 and (after["ts"] >= done).all()
    # the device's side: stream 0 stood idle at the wait until the event completed
    waits = run.stream_waits
    (sw,) = waits[(waits["event"] == wait.event)].itertuples()
    assert sw.stream == 0 and sw.ts <= done <= sw.ts + sw.dur


@pytest.mark.timing  # 100 ms on stream 0 against 2 ms on the side stream: ~50x
def test_stream_synchronize_waits_for_its_stream_only(streams_run):
    facts, run, _ = streams_run
    syncs = run.stream_syncs
    (sync,) = at_line(syncs, "SIDE-SYNC-LINE").itertuples()
    assert sync.reason == "stream_synchronize" and sync.stream == facts["side"] and sync.event == 0
    # a stream-0 kernel queued before it was still running when it returned: stream 0 held 100 ms
    # of kernels, the side stream one 2 ms kernel (a margin of ~50x)
    k = run.device_kernels
    main = k[(k["stream"] == 0) & (k["step"] == 2)]
    assert sync.ts + sync.dur < ends(main).max()
    # and it is a queue_flushes row too, for the analyses of host waits
    flushes = run.queue_flushes
    assert ((flushes["ts"] == sync.ts) & (flushes["reason"] == "stream_synchronize")).sum() == 1


@pytest.mark.timing  # 100 ms queued after the record against the wait for it: ~50x
def test_event_synchronize_waits_for_its_event_only(streams_run):
    facts, run, _ = streams_run
    (record,) = at_line(run.event_enqueues, "EVENT-RECORD-LINE").itertuples()
    (sync,) = at_line(run.stream_syncs, "EVENT-SYNC-LINE").itertuples()
    assert sync.reason == "event_synchronize" and sync.event == record.event and sync.stream == facts["side"]
    done = completion(run, record.event)
    assert sync.ts + sync.dur >= done
    # the side stream's 100 ms of kernels queued after the record were still running (~50x margin)
    k = run.device_kernels
    side = k[(k["stream"] == facts["side"]) & (k["step"] == 2)]
    assert sync.ts + sync.dur < ends(side).max()


def test_elapsed_time_is_the_difference_of_the_recorded_completions(streams_run):
    facts, run, _ = streams_run
    events = run.event_enqueues
    (start,), (end,) = at_line(events, "START-LINE")["event"], at_line(events, "END-LINE")["event"]
    recorded_ns = completion(run, end) - completion(run, start)
    assert facts["elapsed_ms"] >= 0 and abs(facts["elapsed_ms"] * 1e6 - recorded_ns) < 1000
    # between the two records: 5 kernels that each sleep 2 ms on the device (a floor, by construction)
    assert recorded_ns >= 5 * 2_000_000


@pytest.fixture(scope="module")
def streams_trace(streams_run) -> tuple[neuron_prof.Run, TraceReport, dict, list[dict]]:
    """(the run, the strict reader's report of its Perfetto trace, export's counts, the events of
    its Chrome JSON export: the reader keeps no args)."""
    _, run, root = streams_run
    out, counts = export_run(root / "run", root / "t.perfetto-trace")
    chrome, _ = export_run(root / "run", root / "t.json", fmt="chrome")
    return run, check_trace(out), counts, json.loads(chrome.read_text())["traceEvents"]


def on_trace_clock(run, ts: int) -> int:
    """A one-rank run's time in its trace: its own plus rank 0's wall-clock offset."""
    return int(ts) + int(run.rank_data[0].meta.get("clock_offset_ns", 0))


def track_names(report) -> dict[int, str]:
    return {u: t["name"] for u, t in report.tracks.items()}


def chrome_slice(events, name: str, source_marker: str | None = None) -> dict:
    """The one complete event of ``name`` (of the script's line holding ``source_marker``)."""
    line = f"neuron_streams_script.py:{line_of(SCRIPT, source_marker)}" if source_marker else ""
    (e,) = [e for e in events if e["ph"] == "X" and e["name"] == name
            and e.get("args", {}).get("source", "").endswith(line)]
    return e


def ordering_wait(run):
    """The WAIT-LINE call (its ``event_enqueues`` row) and the device's wait for its event."""
    (call,) = at_line(run.event_enqueues, "WAIT-LINE").itertuples()
    waits = run.stream_waits
    (waited,) = waits[waits["event"] == call.event].itertuples()
    return call, waited


def test_a_run_with_streams_exports(streams_trace):
    run, report, counts, _ = streams_trace
    assert counts["device_kernels"] == len(run.device_kernels) > 0
    assert counts["stream_waits"] == len(run.stream_waits) > 0
    assert counts["event_completions"] == len(run.event_completions) > 0
    # each wait ended by a completion of the capture: one arrow each, from the completion
    assert counts["event_flows"] == len(run.stream_waits)
    assert counts["device_flows"] + counts["event_flows"] == len(report.flows)


def test_kernels_are_drawn_as_recorded_beside_the_waits(streams_trace):
    """A wait shares its stream's lanes with the kernels: had one overlapped a kernel, the writer
    would have cut a slice short."""
    run, report, _, _ = streams_trace
    names, k = track_names(report), run.device_kernels
    drawn = sorted((s.ts, s.dur) for s in report.slices
                   if names[s.track].startswith("Device ")
                   and not s.name.startswith(("wait for", "event", "released", "Memcpy", "Memset")))
    assert drawn == sorted((on_trace_clock(run, t), int(d)) for t, d in zip(k["ts"], k["dur"]))


def test_the_waiting_stream_shows_its_wait_for_the_event_with_the_wait_line(streams_run, streams_trace):
    facts = streams_run[0]
    run, report, _, events = streams_trace
    call, waited = ordering_wait(run)
    (s,) = [s for s in report.slices if s.name == f"wait for event {call.event}"]
    # on stream 0's track, between its kernels (the stream stood idle), as the device recorded it
    assert track_names(report)[s.track].startswith("Device neuron:0 (stream 0)") and s.depth == 0
    assert (s.ts, s.dur) == (on_trace_clock(run, waited.ts), waited.dur)
    args = chrome_slice(events, f"wait for event {call.event}", "WAIT-LINE")["args"]
    assert args["event"] == call.event and args["recorded_on"] == facts["side"]
    (record,) = run.event_enqueues[(run.event_enqueues["event"] == call.event)
                                   & (run.event_enqueues["kind"] == "record")].itertuples()
    assert args["record_source"] == record.source_full


def test_a_flow_joins_the_events_completion_to_the_end_of_the_wait_it_ended(streams_run, streams_trace):
    facts = streams_run[0]
    run, report, _, events = streams_trace
    names = track_names(report)
    call, waited = ordering_wait(run)
    (f,) = [f for f in report.flows if f.src.name == f"event {call.event}"]
    assert names[f.src.track] == f"Device neuron:0 (stream {facts['side']})"
    assert f.src.ts == on_trace_clock(run, completion(run, call.event))
    assert names[f.dst.track].startswith("Device neuron:0 (stream 0)")
    assert (f.dst.name, f.dst.ts) == (f"released by event {call.event}", on_trace_clock(run, waited.ts + waited.dur))
    # the completion names the line that recorded the event
    (done,) = [e for e in events if e["ph"] == "i" and e["name"] == f"event {call.event}"]
    assert done["args"]["source"] == chrome_slice(events, f"wait for event {call.event}")["args"]["record_source"]


def test_the_host_waits_on_a_stream_or_an_event_name_it(streams_run, streams_trace):
    facts = streams_run[0]
    run, report, _, events = streams_trace
    side = chrome_slice(events, "wait for neuron:0 (stream_synchronize)", "SIDE-SYNC-LINE")["args"]
    assert (side["stream"], side["event"]) == (facts["side"], 0)
    (record,) = at_line(run.event_enqueues, "EVENT-RECORD-LINE").itertuples()
    event = chrome_slice(events, "wait for neuron:0 (event_synchronize)", "EVENT-SYNC-LINE")["args"]
    assert (event["stream"], event["event"]) == (facts["side"], record.event)
    # a wait for every stream names none (as a run without streams draws it)
    for e in events:
        if e["ph"] == "X" and e["name"] == "wait for neuron:0 (synchronize)":
            assert "stream" not in e["args"] and "event" not in e["args"]
    syncs = run.stream_syncs
    assert report.names["wait for neuron:0 (stream_synchronize)"] == (syncs["reason"] == "stream_synchronize").sum()
