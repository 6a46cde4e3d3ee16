"""The device in the exported trace: kernels on a stream track, flows from the host ops that queued
them, the host's waits and CPU fallbacks nested in its op slices, the queue-depth counter.

A real capture of examples/device_defects.py on the emulated device (the ``device_run``
fixture), exported once as Perfetto (read back with the strict reader, which keeps no args) and
once as Chrome JSON (for the args); and a short capture made here of waits outside any op
(``torch.neuron.synchronize()``). A kernel's ``ops`` arg holds the full op names ("aten::mul",
as ``CHAIN`` spells them), ", "-joined in queue order.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import DEVICE_STEPS, check_trace, cli, line_of, write_script
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import device_defects
from neuron_prof.export.run_export import export_run
from neuron_prof.export.layout_device import OPS_SEPARATOR

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

EXAMPLE = Path(device_defects.__file__)
DEVICE = "Device neuron:0 (stream 0)"  # then "... #2", ... where clock jitter makes kernels overlap
CHAIN_KERNEL = "+".join(op.split("::")[1] for op in device_defects.CHAIN)   # "mul+add+tanh+mul+sub+relu"
ELEMENT = 4  # bytes of a float32


def _line(marker: str) -> str:
    return f"device_defects.py:{line_of(EXAMPLE, f'# {marker}')}"


@pytest.fixture(scope="module")
def exported(device_run, tmp_path_factory):
    """(run, strict report of its Perfetto trace, write_run's counts, its Chrome JSON events)."""
    tmp = tmp_path_factory.mktemp("device_trace")
    out, counts = export_run(device_run, tmp / "t.perfetto-trace")
    res = cli("export", device_run, "--format", "chrome", "-o", tmp / "t.json")
    assert res.returncode == 0, res.stderr
    events = json.loads((tmp / "t.json").read_text())["traceEvents"]
    return neuron_prof.load(device_run), check_trace(out), counts, events


def _offset(run) -> int:
    """Rank 0's wall-clock offset: a one-rank run's times in the trace are its own plus this."""
    return int(run.rank_data[0].meta.get("clock_offset_ns", 0))


def _track_names(report) -> dict[int, str]:
    return {u: t["name"] for u, t in report.tracks.items()}


COPY = ("Memcpy", "Memset")  # the device's copies, drawn on its stream tracks beside the kernels


def _device_slices(report) -> list:
    """The kernels' slices on the device's stream tracks."""
    names = _track_names(report)
    return [s for s in report.slices if names[s.track].startswith(DEVICE) and not s.name.startswith(COPY)]


def _copy_slices(report) -> list:
    names = _track_names(report)
    return [s for s in report.slices if names[s.track].startswith(DEVICE) and s.name.startswith(COPY)]


def _parent(report, s):
    """The slice directly enclosing ``s`` on its track, as the reader nested them."""
    around = [p for p in report.slices if p.track == s.track and p.depth == s.depth - 1
              and p.ts <= s.ts and s.ts + s.dur <= p.ts + p.dur]
    assert around, s
    return max(around, key=lambda p: p.ts)


def _chrome_track_names(events) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


def _chrome_kernels(events) -> list[dict]:
    names = _chrome_track_names(events)
    return [e for e in events if e["ph"] == "X" and names.get((e["pid"], e["tid"]), "").startswith(DEVICE)
            and not e["name"].startswith(COPY)]


def test_counts_match_the_run(exported):
    run, report, counts, _ = exported
    assert counts["device_kernels"] == len(run.device_kernels) > 0
    assert counts["queue_flushes"] == len(run.queue_flushes) > 0
    assert counts["fallbacks"] == len(run.fallbacks) == DEVICE_STEPS
    assert counts["device_flows"] == len(report.flows) == report.stats["flows"]
    assert 0 < counts["queue_depth_samples"] == len([c for c in report.counters
                                                     if _track_names(report)[c.track] == "Queue depth neuron:0"])


def test_one_slice_per_kernel_on_the_stream_track(exported):
    run, report, _, _ = exported
    k = run.device_kernels
    off = _offset(run)
    drawn = sorted((s.ts, s.dur, s.name) for s in _device_slices(report))
    assert drawn == sorted(zip((k["ts"] + off).tolist(), k["dur"].tolist(), k["name"].astype(str)))
    assert {s.depth for s in _device_slices(report)} == {0}
    assert all(report.tracks[s.track]["kind"] == "custom" for s in _device_slices(report))


def test_kernel_args_name_the_ops_it_ran_in_queue_order(exported):
    run, _, _, events = exported
    kernels = _chrome_kernels(events)
    assert len(kernels) == len(run.device_kernels)
    corr = analyze(run).device_correlation.sort_values("id")
    ops = {kid: [str(o) for o in g["op"]] for kid, g in corr.groupby("kernel")}
    first = corr.drop_duplicates("kernel").set_index("kernel")
    by_id = run.device_kernels.set_index("id")
    for e in kernels:
        kid = e["args"]["kernel_id"]
        assert e["name"] == by_id.at[kid, "name"]
        assert e["args"]["ops"].split(OPS_SEPARATOR) == ops[kid]
        assert e["args"]["n_ops"] == by_id.at[kid, "n_ops"] == len(ops[kid])
        assert e["args"]["step"] == by_id.at[kid, "step"]
        assert e["args"]["source"] == first.at[kid, "source_full"]


def test_the_fused_chain_kernel_holds_the_chain_of_its_line(exported):
    _, _, _, events = exported
    line = [e for e in _chrome_kernels(events) if e["args"]["source"].endswith(_line("FUSED-LINE"))]
    # fusion is adaptive: the chain fuses while it waits behind MATMUL-LINE's matmuls, so a host
    # descheduled mid-chain may split it; split or not, each step's kernels of the line run CHAIN
    for step in range(DEVICE_STEPS):
        kernels = sorted((e for e in line if e["args"]["step"] == step), key=lambda e: e["args"]["kernel_id"])
        assert [op for e in kernels for op in e["args"]["ops"].split(OPS_SEPARATOR)] == list(device_defects.CHAIN)
    fused = [e for e in line if e["name"] == CHAIN_KERNEL]
    assert fused
    for e in fused:
        assert e["args"]["ops"].split(OPS_SEPARATOR) == list(device_defects.CHAIN)
        assert e["args"]["n_ops"] == len(device_defects.CHAIN)


def test_flows_join_each_host_op_to_the_kernels_that_ran_its_work(exported):
    run, report, _, _ = exported
    names = _track_names(report)
    ops, corr = run.ops, analyze(run).device_correlation
    known = corr[(corr["op_index"] >= 0) & (corr["kernel"] >= 0)]
    assert len(known) == len(corr)  # every queued op of this run was captured and ran
    op_names = ops["name"].astype(str).to_numpy()
    assert (op_names[known["op_index"]] == known["host_op"].astype(str).to_numpy()).all()
    pairs = known[["op_index", "kernel"]].drop_duplicates()
    to_kernels = [f for f in report.flows if not f.dst.name.startswith(COPY)]
    assert len(to_kernels) == len(pairs)
    off, k = _offset(run), run.device_kernels.set_index("id")
    want = {(int(ops.at[i, "ts"]) + off, op_names[i], int(k.at[kid, "ts"]) + off, k.at[kid, "name"])
            for i, kid in zip(pairs["op_index"], pairs["kernel"])}
    assert {(f.src.ts, f.src.name, f.dst.ts, f.dst.name) for f in to_kernels} == want
    # each copy to the host: one flow from the op that issued it (the .item()'s, the fallback's)
    copies = run.device_copies
    assert len(copies) and len(report.flows) - len(to_kernels) == len(copies)
    assert sorted((f.src.name, f.dst.ts) for f in report.flows if f.dst.name.startswith(COPY)) == sorted(
        zip(copies["host_op"].astype(str), (copies["ts"] + off).tolist()))
    for f in report.flows:
        assert report.tracks[f.src.track]["kind"] == "thread" and names[f.dst.track].startswith(DEVICE)
    arrived = {(f.dst.track, f.dst.ts) for f in report.flows}
    assert all((s.track, s.ts) in arrived for s in _device_slices(report) + _copy_slices(report))


def test_the_chrome_export_has_the_same_flows(exported):
    _, report, _, events = exported
    names = _chrome_track_names(events)
    starts, ends = [e for e in events if e["ph"] == "s"], [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == len(report.flows)
    assert all(names[e["pid"], e["tid"]].startswith(DEVICE) for e in ends)
    assert all(not names[e["pid"], e["tid"]].startswith(DEVICE) for e in starts)


def test_the_stall_lines_wait_is_nested_in_its_item_on_the_host_thread(exported):
    run, report, _, _ = exported
    names, off, ops = _track_names(report), _offset(run), run.ops
    f = run.queue_flushes
    f = f[f["source"].astype(str).str.endswith(_line("STALL-LINE"))]
    # a step whose queue had drained by then does not wait (no flush is reported); a device-bound one must
    assert {s for s in range(DEVICE_STEPS) if device_defects.device_bound(s)} <= set(f["step"])
    assert set(f["reason"].astype(str)) == {"sync"}
    thread = dict(zip(run.threads["tid"], run.threads["name"].astype(str)))
    waits = sorted((s for s in report.slices if s.name == "wait for neuron:0 (sync)"), key=lambda s: s.ts)
    assert len(waits) == len(run.queue_flushes[run.queue_flushes["reason"] == "sync"])
    for row in f.itertuples():
        start, end = row.ts + off, row.ts + row.dur + off
        (s,) = [w for w in waits if start <= w.ts and w.ts + w.dur <= end]
        assert report.tracks[s.track]["kind"] == "thread" and names[s.track] == thread[row.tid]
        assert _parent(report, s).name == "aten::_local_scalar_dense"
        assert _parent(report, _parent(report, s)).name == "aten::item"
        host = ops[(ops["tid"] == row.tid) & (ops["name"] == "aten::_local_scalar_dense")
                   & (ops["ts"] <= row.ts) & (ops["ts"] + ops["dur"] >= row.ts + row.dur)]
        if len(host):  # recorded inside its op: drawn as recorded, not clipped
            assert (s.ts, s.dur) == (start, row.dur)


def test_the_fallback_is_nested_in_its_op_around_its_copies_with_the_bytes_copied(exported):
    run, report, _, events = exported
    drawn = [s for s in report.slices if s.name == "CPU fallback aten::cumsum"]
    assert len(drawn) == DEVICE_STEPS
    for s in drawn:
        assert report.tracks[s.track]["kind"] == "thread" and _parent(report, s).name == "aten::cumsum"
        inside = [c for c in report.slices if c.track == s.track and c.depth == s.depth + 1
                  and s.ts <= c.ts and c.ts + c.dur <= s.ts + s.dur]
        assert "aten::_to_cpu" in {c.name for c in inside}  # the copy of its input to the host
    chrome = [e for e in events if e["ph"] == "X" and e["name"] == "CPU fallback aten::cumsum"]
    assert len(chrome) == DEVICE_STEPS
    size = device_defects.BATCH * device_defects.IN * ELEMENT
    for e in chrome:
        # cumsum.out on the CPU: the input and the out buffer go to the host, the result comes back
        assert e["args"]["bytes_to_host"] == 2 * size and e["args"]["bytes_from_host"] == size
        assert e["args"]["source"].endswith(_line("FALLBACK-LINE")) and e["args"]["device"] == "neuron:0"


def test_waits_and_fallbacks_cut_no_op_slice_short(exported):
    """The writer clips a slice that sticks out of the one around it: had a wait or a fallback
    not fitted into the op slices, an op slice would be drawn shorter than it ran."""
    run, report, _, _ = exported
    off = _offset(run)
    host = [s for s in report.slices if report.tracks[s.track]["kind"] == "thread"
            and not s.name.startswith(("wait for ", "CPU fallback "))]
    recorded = [(int(t) + off, int(d), str(n)) for df in (run.ops, run.marks)
                for t, d, n in zip(df["ts"], df["dur"], df["name"])]
    assert sorted((s.ts, s.dur, s.name) for s in host) == sorted(recorded)


def test_queue_depth_counter_reaches_the_deepest_reported_queue(exported):
    run, report, _, _ = exported
    names = _track_names(report)
    (track,) = [u for u, name in names.items() if name == "Queue depth neuron:0"]
    assert report.tracks[track]["kind"] == "counter"
    values = [c.value for c in report.counters if c.track == track]
    assert max(values) == run.device_enqueues["queue_depth"].max() > 1 and min(values) >= 0


def test_a_run_without_a_device_has_no_device_tracks(demo_run, tmp_path):
    out, counts = export_run(demo_run, tmp_path / "t.perfetto-trace")
    report = check_trace(out)
    names = {t["name"] for t in report.tracks.values()}
    assert "Steps" in names
    assert not [n for n in names if n.startswith(("Device", "Queue depth"))]
    assert not [n for n in report.names if n.startswith(("wait for", "CPU fallback"))]
    assert counts["device_kernels"] == counts["device_flows"] == counts["queue_depth_samples"] == 0


SYNCHRONIZE = """
import sys
import torch
import neuron_prof
from neuron_prof.testing import neuron

neuron.enable()
x = torch.ones(512, 512).to("neuron") / 512
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(3):
        y = x
        for _ in range(8):  # long enough on the device that the queue still holds work
            y = y @ x
        torch.neuron.synchronize()  # SYNC-LINE
        prof.step()
"""


def test_a_wait_outside_any_aten_op_is_on_the_thread_track_in_its_backend_range(tmp_path):
    """``torch.neuron.synchronize()`` runs no ATen op: the backend's own range around it
    (``neuron::synchronize``, a record_function scope, as a backend annotates its host calls)
    holds its wait, which names the line."""
    script = write_script(tmp_path / "sync.py", SYNCHRONIZE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = neuron_prof.load(tmp_path / "run")
    out, counts = export_run(tmp_path / "run", tmp_path / "t.perfetto-trace")
    report = check_trace(out)
    f = run.queue_flushes
    assert len(f) == counts["queue_flushes"] > 0 and set(f["reason"].astype(str)) == {"synchronize"}
    assert set(f["host_op"].astype(str)) == {"neuron::synchronize"}
    assert set(f["user_source"].astype(str).map(lambda s: s.rsplit("/", 1)[-1])) == {
        f"sync.py:{line_of(script, 'SYNC-LINE')}"}
    waits = sorted((s for s in report.slices if s.name == "wait for neuron:0 (synchronize)"), key=lambda s: s.ts)
    assert [(s.ts, s.dur, s.depth) for s in waits] == [(t + _offset(run), d, 1) for t, d in zip(f["ts"], f["dur"])]
    ranges = [s for s in report.slices if s.name == "neuron::synchronize" and s.depth == 0]
    for w in waits:  # each inside its range, on the same track
        assert any(r.track == w.track and r.ts <= w.ts and w.ts + w.dur <= r.ts + r.dur for r in ranges), w
    thread = dict(zip(run.threads["tid"], run.threads["name"].astype(str)))
    assert {_track_names(report)[s.track] for s in waits} == {thread[t] for t in f["tid"]}
