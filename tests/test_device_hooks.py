"""The backend hook API (issue 12): a device backend reports its queue, kernels and CPU fallbacks
to a capture, from Python (collectors.device.report_*) and through the C struct of the capsule
(collectors/neuron_prof_backend.h), called here with ctypes as a C++ backend calls it. Real
captures of a small training loop; the reports come from inside a real custom op's CPU kernel,
so a host op is open on the reporting thread."""
from __future__ import annotations

import ctypes
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import neuron_prof
from conftest import cli, line_of
from neuron_prof.collectors import device as dev

SCHEDULE = dict(wait=1, warmup=1, active=2, repeat=1)  # steps 0 wait, 1 warmup, 2-3 recorded, 4-5 none


# ---------------------------------------------------------------- the C struct, as ctypes sees it
class BackendAPI(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("capturing", ctypes.POINTER(ctypes.c_int32)),
        ("now_ns", ctypes.CFUNCTYPE(ctypes.c_int64)),
        ("op_enqueued", ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p,
                                         ctypes.c_int32)),
        ("queue_flushed", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
                                           ctypes.c_int64)),
        ("kernel_executed", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32)),
        ("cpu_fallback", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                          ctypes.c_int64, ctypes.c_int64)),
    ]


class BackendAPIV2(ctypes.Structure):
    """Version 2: version 1's fields, then streams' and events' (appended)."""
    _fields_ = BackendAPI._fields_ + [
        ("event_recorded", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64)),
        ("event_waited", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64)),
        ("event_completed", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64)),
        ("stream_waited", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64,
                                           ctypes.c_int64)),
        ("queue_synchronized", ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int32,
                                                ctypes.c_int32, ctypes.c_int64, ctypes.c_int64)),
    ]


def c_api(struct=BackendAPI):
    capsule = dev.backend_api()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, b"neuron_prof.backend_api")
    assert ptr
    return struct.from_address(ptr)


# ---------------------------------------------------------------- two fake backends
class PyBackend:
    """Queues every `devq::add` call; a kernel runs every 3 queued ops (a size flush); `devq::fallback`
    runs on the CPU (a fallback flush first). Reports through the Python functions."""

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.ids: list[int] = []

    def enqueue(self, op: str) -> None:
        eid = dev.report_enqueue(0, 1, op, len(self.queue) + 1)
        self.ids.append(eid)
        self.queue.append(eid)
        if len(self.queue) == 3:
            self.drain("size")

    def drain(self, reason: str) -> None:
        t0 = time.monotonic_ns()
        ids, self.queue = self.queue, []
        t1 = time.monotonic_ns() + 1000
        dev.report_kernel(0, 1, f"fused_{len(ids)}", t0, t1, ids)
        dev.report_flush(0, reason, len(ids), t0, t1 + 10)

    def fallback(self, x: torch.Tensor) -> None:
        if self.queue:
            self.drain("fallback")
        t0 = time.monotonic_ns()
        dev.report_fallback("neuron:0", "aten::nonzero", x.numel() * 4, 8, t0, t0 + 500)


class CBackend(PyBackend):
    """The same, through the C function pointers."""

    def __init__(self) -> None:
        super().__init__()
        self.api = c_api()
        self.flags: list[int] = []

    def enqueue(self, op: str) -> None:
        api = self.api
        eid = api.op_enqueued(0, 1, op.encode(), len(self.queue) + 1) if api.capturing[0] else 0
        self.ids.append(eid)
        self.queue.append(eid)
        if len(self.queue) == 3:
            self.drain("size")

    def drain(self, reason: str) -> None:
        api = self.api
        t0 = api.now_ns()
        ids, self.queue = self.queue, []
        t1 = api.now_ns() + 1000
        if api.capturing[0]:
            arr = (ctypes.c_uint64 * len(ids))(*ids)
            api.kernel_executed(0, 1, f"fused_{len(ids)}".encode(), t0, t1, arr, len(ids))
            api.queue_flushed(0, dev.FLUSH_REASONS.index(reason), len(ids), t0, t1 + 10)

    def fallback(self, x: torch.Tensor) -> None:
        if self.queue:
            self.drain("fallback")
        api = self.api
        t0 = api.now_ns()
        if api.capturing[0]:
            api.cpu_fallback(0, b"aten::nonzero", x.numel() * 4, 8, t0, t0 + 500)


class CBackendV2(CBackend):
    """The same through version 2: each size flush is a record of an event on stream 1 that stream
    0 waits for (the host's reports from inside devq::add), the device's completion of it and
    stream 0's wait, and the host's wait as queue_synchronized with stream 1 and the event."""

    def __init__(self) -> None:
        super().__init__()
        self.api = c_api(BackendAPIV2)
        self.events = 0

    def drain(self, reason: str) -> None:
        api = self.api
        t0 = api.now_ns()
        ids, self.queue = self.queue, []
        t1 = api.now_ns() + 1000
        if api.capturing[0]:
            self.events += 1
            api.event_recorded(0, 1, self.events)
            api.event_waited(0, 0, self.events)
            arr = (ctypes.c_uint64 * len(ids))(*ids)
            api.kernel_executed(0, 1, f"fused_{len(ids)}".encode(), t0, t1, arr, len(ids))
            api.event_completed(0, 1, self.events, t1)
            api.stream_waited(0, 0, self.events, t0, t1)
            api.queue_synchronized(0, 1, self.events, dev.FLUSH_REASONS.index(reason), len(ids), t0, t1 + 10)


BACKEND: list[PyBackend] = []


@torch.library.custom_op("devq::add", mutates_args=())
def devq_add(x: torch.Tensor) -> torch.Tensor:
    BACKEND[0].enqueue("aten::add")
    return x + 1


@devq_add.register_fake
def _(x):
    return torch.empty_like(x)


def _backward(ctx, g):
    return g


devq_add.register_autograd(_backward)


@torch.library.custom_op("devq::fallback", mutates_args=())
def devq_fallback(x: torch.Tensor) -> torch.Tensor:
    BACKEND[0].fallback(x)
    return x.clone()


@devq_fallback.register_fake
def _(x):
    return torch.empty_like(x)


devq_fallback.register_autograd(_backward)


class OnDevice(torch.nn.Module):
    def forward(self, x):
        return devq_add(x)  # the enqueuing line


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.dev = OnDevice()

    def forward(self, x):
        y = self.dev(self.lin(x))
        y = self.dev(y)
        y = self.dev(y)
        return devq_fallback(y)


def train(backend: PyBackend, run_dir, steps=6, flags=None):
    BACKEND[:] = [backend]
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_prof.profile(run_dir, schedule=neuron_prof.schedule(**SCHEDULE)) as prof:
        for step in range(steps):
            if flags is not None:
                flags.append(backend.api.capturing[0])
            loss = model(torch.randn(4, 8)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return neuron_prof.load(run_dir)


def check_run(run, backend: PyBackend) -> None:
    enq, kern, fl, fb = run.device_enqueues, run.device_kernels, run.queue_flushes, run.fallbacks
    # 3 enqueues, one size flush/kernel and one fallback per forward; steps 2 and 3 recorded only
    assert sorted(set(enq["step"])) == [2, 3], enq
    assert len(enq) == 6 and len(kern) == 2 and len(fl) == 2 and len(fb) == 2
    # ids: unique, increasing, what the backend got back for the recorded steps
    ids = enq["id"].tolist()
    assert ids == sorted(ids) and len(set(ids)) == 6 and 0 not in ids
    assert set(ids) <= set(backend.ids)
    assert set(enq["device"]) == {f"{torch._C._get_privateuse1_backend_name()}:0"}
    assert set(enq["op"]) == {"aten::add"} and set(enq["stream"]) == {1}
    assert enq["queue_depth"].tolist() == [1, 2, 3, 1, 2, 3]
    # the host op that enqueued: the innermost op open on the training thread, inside the custom
    # op (torch runs a custom op's kernel inside its generated autograd function's range), in
    # module Net.dev, at the test's line
    assert len(set(enq["host_op"])) == 1 and "devq" in str(enq["host_op"].iloc[0]), enq["host_op"]
    assert all("dev" in str(m) for m in enq["module"]), enq["module"]
    assert set(enq["tid"]) == {threading.get_native_id()}
    line = line_of(Path(__file__), "return devq_add(x)  # the enqueuing line")
    assert set(enq["user_source"].astype(str)) == {f"tests/test_device_hooks.py:{line}"}, enq["user_source"]
    assert not enq["bwd"].any()
    # joinable with the ops table by (tid, ts): the host op's row, inside a devq::add row
    for ts, tid, host in zip(enq["ts"], enq["tid"], enq["host_op"].astype(str)):
        ops = run.ops[(run.ops["tid"] == tid) & (run.ops["ts"] <= ts) & (run.ops["ts"] + run.ops["dur"] >= ts)]
        names = ops["name"].astype(str).tolist()
        assert host in names and "devq::add" in names, (ts, names)
    # kernels name the enqueues they ran
    assert kern["enqueue_ids"].tolist() == [ids[:3], ids[3:]]
    assert kern["n_ops"].tolist() == [3, 3] and set(kern["name"]) == {"fused_3"}
    assert (kern["dur"] >= 1000).all() and set(kern["tid"]) == {threading.get_native_id()}
    # flushes: size, waited for 3 ops, inside devq::add
    assert fl["reason"].astype(str).tolist() == ["size", "size"]
    assert fl["ops"].tolist() == [3, 3] and set(fl["host_op"]) == set(enq["host_op"])
    # fallbacks: bytes and host op
    assert fb["op"].astype(str).tolist() == ["aten::nonzero"] * 2
    assert fb["bytes_to_host"].tolist() == [128, 128] and fb["bytes_from_host"].tolist() == [8, 8]
    assert (fb["dur"] == 500).all() and "devq_fallback" in str(fb["host_op"].iloc[0]).replace("::", "_"), fb["host_op"]


def test_python_backend_reports(tmp_path):
    b = PyBackend()
    run = train(b, tmp_path / "run")
    check_run(run, b)
    # outside the capture: no-ops
    assert dev.report_enqueue(0, 0, "aten::add", 1) == 0


def test_c_abi_reports_and_flag(tmp_path):
    b = CBackend()  # written for version 1: its rule is version >= 1 and size >= its struct's
    assert b.api.version >= 1 and b.api.size >= ctypes.sizeof(BackendAPI)
    assert b.api.capturing[0] == 0
    flags: list[int] = []
    run = train(b, tmp_path / "run", flags=flags)
    # wait step 0: off; warmup 1 and active 2-3: on; after the window: off
    assert flags == [0, 1, 1, 1, 0, 0], flags
    assert b.api.capturing[0] == 0
    assert b.api.op_enqueued(0, 0, b"aten::add", 1) == 0  # not capturing: 0, nothing kept
    check_run(run, b)
    # the API's clock is time.monotonic_ns's: read between two of its reads, it falls between them
    before = time.monotonic_ns()
    now = b.api.now_ns()
    assert before <= now <= time.monotonic_ns()


def test_c_abi_version_2_reports_streams_and_events(tmp_path):
    b = CBackendV2()
    assert b.api.version == 2 and b.api.size == ctypes.sizeof(BackendAPIV2)
    run = train(b, tmp_path / "run")
    check_run(run, b)  # queue_synchronized makes the queue_flushes rows version 1's flush made
    tid = threading.get_native_id()
    line = f"tests/test_device_hooks.py:{line_of(Path(__file__), 'return devq_add(x)  # the enqueuing line')}"
    events = run.event_enqueues
    assert events["kind"].astype(str).tolist() == ["record", "wait"] * 2
    assert events["stream"].tolist() == [1, 0] * 2 and events["event"].tolist() == [2, 2, 3, 3]  # 1: warmup step 1's (dropped)
    assert set(events["user_source"].astype(str)) == {line} and set(events["tid"]) == {tid}
    assert all("devq" in str(h) for h in events["host_op"])
    done, waits, syncs, kernels = run.event_completions, run.stream_waits, run.stream_syncs, run.device_kernels
    assert done["event"].tolist() == [2, 3] and (done["stream"] == 1).all()
    assert done["ts"].tolist() == (kernels["ts"] + kernels["dur"]).tolist()
    assert waits["event"].tolist() == [2, 3] and (waits["stream"] == 0).all()
    assert waits["ts"].tolist() == kernels["ts"].tolist() and waits["dur"].tolist() == kernels["dur"].tolist()
    assert syncs["event"].tolist() == [2, 3] and (syncs["stream"] == 1).all() and syncs["ops"].tolist() == [3, 3]
    assert syncs["reason"].astype(str).tolist() == ["size"] * 2 and set(syncs["user_source"].astype(str)) == {line}
    flushes = run.queue_flushes
    assert syncs["ts"].tolist() == flushes["ts"].tolist() and syncs["dur"].tolist() == flushes["dur"].tolist()


def test_kernels_from_worker_thread_and_no_events_outside_windows(tmp_path):
    """Events reported outside windows (wait steps, after the window, after the capture) leave no
    rows; a kernel reported from a device worker thread carries that thread's id."""
    api = c_api()
    worker_tid: list[int] = []

    def worker(ids):
        worker_tid.append(threading.get_native_id())
        t = api.now_ns()
        arr = (ctypes.c_uint64 * len(ids))(*ids)
        api.kernel_executed(0, 2, b"worker_kernel", t, t + 5, arr, len(ids))

    with neuron_prof.profile(tmp_path / "run", schedule=neuron_prof.schedule(wait=1, warmup=0, active=1)) as prof:
        for step in range(3):
            eid = dev.report_enqueue(0, 2, "aten::mul", 1)
            assert (eid != 0) == (step == 1)
            th = threading.Thread(target=worker, args=([eid],))
            th.start()
            th.join()
            dev.report_flush(0, "synchronize", 1, time.monotonic_ns(), time.monotonic_ns() + 1)
            dev.report_flush(0, "no such reason", 1, time.monotonic_ns(), time.monotonic_ns() + 1)
            prof.step()
    run = neuron_prof.load(tmp_path / "run")
    assert len(run.device_enqueues) == 1 and run.device_enqueues["step"].tolist() == [1]
    k = run.device_kernels
    assert len(k) == 1 and k["tid"].tolist() == [worker_tid[1]] and k["stream"].tolist() == [2]
    assert k["enqueue_ids"].tolist() == [run.device_enqueues["id"].tolist()]
    assert run.queue_flushes["reason"].astype(str).tolist() == ["synchronize", "other"]
    # no op open: no host op; the enqueue took place outside any module
    assert run.device_enqueues["host_op"].astype(str).tolist() == [""]


def test_no_backend_gives_empty_tables_and_report_works(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_prof.profile(tmp_path / "run") as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = neuron_prof.load(tmp_path / "run")
    assert "device" in run.rank_data[0].meta["collectors"]
    for table, cols in (("device_enqueues", ["id", "host_op", "queue_depth"]), ("queue_flushes", ["reason"]),
                        ("device_kernels", ["id", "enqueue_ids"]), ("fallbacks", ["bytes_to_host"])):
        df = getattr(run, table)
        assert len(df) == 0 and set(cols) <= set(df.columns), (table, df.columns)
    assert not list((tmp_path / "run" / "rank-00000").glob("device_*"))  # nothing written
    report = cli("report", tmp_path / "run")
    assert report.returncode == 0, report.stderr
    js = json.loads(cli("report", tmp_path / "run", "--json").stdout)
    assert js["health"]


def test_python_report_functions_keep_nothing_off(tmp_path):
    """Not capturing, a Python report returns 0 and nothing is kept: every call of many, and none
    reaches a capture that starts after them. What a call costs is measured by
    benchmarks/device_hooks.py, not asserted here."""
    n = 20000
    assert [dev.report_enqueue(0, 0, "aten::add", 1) for _ in range(n)] == [0] * n
    t0 = time.monotonic_ns()
    dev.report_kernel(0, 0, "off", t0, t0 + 1, [])
    dev.report_flush(0, "size", 1, t0, t0 + 1)
    dev.report_fallback("neuron:0", "aten::nonzero", 4, 4, t0, t0 + 1)
    with neuron_prof.profile(tmp_path / "run") as prof:
        torch.ones(4).sum()
        prof.step()
    run = neuron_prof.load(tmp_path / "run")
    assert all(len(getattr(run, t)) == 0 for t in ("device_enqueues", "device_kernels", "queue_flushes", "fallbacks"))
