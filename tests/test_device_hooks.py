"""The backend hook API, version 3 (collectors/neuron_prof_backend.h): what a backend reports of its
queues that PyTorch's profiler cannot carry -- each queue's depth and latest host wait, for
always-on capture's dumps -- through the C struct of the capsule (called here with ctypes, as a C++
backend calls it) and the Python report functions. Everything else a device did comes from its
Kineto activity profiler (tests/test_kineto_device.py): the struct's retired functions are there
for older backends and do nothing. Real captures of a small training loop, no device backend."""
from __future__ import annotations

import ctypes
import json
import time

import torch

import neuron_prof
from conftest import cli
from neuron_prof.collectors import device as dev

DEVICE_TABLES = ("device_enqueues", "queue_flushes", "device_kernels", "kernel_enqueues", "fallbacks",
                 "event_enqueues", "event_completions", "stream_waits", "stream_syncs", "device_copies")


class BackendAPI(ctypes.Structure):
    """The struct as a backend written for version 1 sees it."""
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


def c_api() -> BackendAPIV2:
    capsule = dev.backend_api()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, b"neuron_prof.backend_api")
    assert ptr
    return BackendAPIV2.from_address(ptr)


def _train(prof, steps: int, each=None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if each is not None:
            each(step)
        prof.step()


def test_the_struct_keeps_every_version_s_layout_and_its_clock_is_the_run_s():
    api = c_api()
    assert api.version == 3 and api.size == ctypes.sizeof(BackendAPIV2)  # version 3 appended nothing
    assert api.size >= ctypes.sizeof(BackendAPI)  # a version-1 backend's rule holds
    # the API's clock is time.monotonic_ns's: read between two of its reads, it falls between them
    before = time.monotonic_ns()
    now = api.now_ns()
    assert before <= now <= time.monotonic_ns()


def test_a_dump_shows_each_queue_as_the_backend_reported_it_last(tmp_path):
    """All through an always-on capture the flag is on and the reports keep each queue's state:
    a dump shows the latest depth and the latest wait of each device the backend reported, with its
    reason; before and after the capture the flag is off and a report keeps nothing."""
    api = c_api()
    assert api.capturing[0] == 0
    assert api.op_enqueued(0, 0, b"aten::add", 7) == 0  # not capturing: nothing kept
    flags = []
    with neuron_prof.profile(tmp_path / "run", mode="always-on") as prof:
        def each(step: int) -> None:
            flags.append(api.capturing[0])
            t = api.now_ns()
            api.op_enqueued(0, 0, b"aten::add", step + 1)  # device 0: depth 1, 2, 3
            api.queue_synchronized(1, -1, 0, dev.FLUSH_REASONS.index("sync"), 5, t, t + 1000)  # device 1: a wait
            dev.report_enqueue("neuron:2", 4)  # a Python backend's device 2
        _train(prof, 3, each)
        prof.dump("look at the queues")
    assert flags == [1, 1, 1] and api.capturing[0] == 0
    q = neuron_prof.load(tmp_path / "run").dump_queues
    backend = torch._C._get_privateuse1_backend_name()
    by = {str(d): r for d, r in zip(q["device"], q.itertuples())}
    assert set(by) == {f"{backend}:0", f"{backend}:1", f"{backend}:2"}
    assert by[f"{backend}:0"].depth == 3 and by[f"{backend}:0"].flush_ts == -1
    one = by[f"{backend}:1"]
    assert str(one.flush_reason) == "sync" and one.flush_ops == 5 and one.flush_dur == 1000 and one.depth == 0
    assert by[f"{backend}:2"].depth == 4


def test_retired_reports_and_windows_leave_no_device_rows(tmp_path):
    """Version 1 and 2's reports of kernels, fallbacks and events are accepted and do nothing; the
    device tables of a capture with no device activity type (a CPU-only process) are empty, and
    the report reads them."""
    api = c_api()
    with neuron_prof.profile(tmp_path / "run") as prof:
        def each(step: int) -> None:
            t = api.now_ns()
            ids = (ctypes.c_uint64 * 2)(1, 2)
            api.kernel_executed(0, 0, b"fused", t, t + 10, ids, 2)
            api.cpu_fallback(0, b"aten::nonzero", 8, 8, t, t + 10)
            api.event_recorded(0, 1, 1)
            api.event_waited(0, 0, 1)
            api.event_completed(0, 1, 1, t)
            api.stream_waited(0, 0, 1, t, t + 10)
        _train(prof, 3, each)
    run = neuron_prof.load(tmp_path / "run")
    assert "device" in run.rank_data[0].meta["collectors"]
    for table in DEVICE_TABLES:
        assert len(run.table(table)) == 0, table
    assert not list((tmp_path / "run" / "rank-00000").glob("device_*"))  # nothing written
    report = cli("report", tmp_path / "run")
    assert report.returncode == 0, report.stderr
    js = json.loads(cli("report", tmp_path / "run", "--json").stdout)
    assert js["device"] == {"captured": False} and js["health"]["device_gaps"] == []
