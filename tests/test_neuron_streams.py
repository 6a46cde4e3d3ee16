"""Streams and events on the emulated `neuron` device (tests/neuron_streams_script.py, in a process
of its own: enabling the device renames PrivateUse1 for a whole process): training with inputs
prefetched on a side stream, PyTorch's generic stream and event classes, memory a side stream
still reads, pinned memory, and what a capture records of streams, events and host waits (hook
API version 2). Timing facts come from the recorded timestamps; where one compares spans, the
script makes the effect tens of times its noise (2 ms kernels that sleep on the device, 50 of
them in a long stream) and the test says so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import check_trace, line_of

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]  # a training in a process of its own

SCRIPT = Path(__file__).with_name("neuron_streams_script.py")


@pytest.fixture(scope="module")
def streams_run(tmp_path_factory) -> tuple[dict, neuron_prof.Run, Path]:
    root = tmp_path_factory.mktemp("streams")
    p = subprocess.run([sys.executable, str(SCRIPT), str(root / "run")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), neuron_prof.load(root / "run"), root


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


def test_a_run_with_streams_exports(streams_run):
    from neuron_prof.export.run_export import export_run

    _, _, root = streams_run
    out, counts = export_run(root / "run", root / "t.perfetto-trace")
    check_trace(out)
    assert counts["device_kernels"] > 0
