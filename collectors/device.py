"""The device collector: what a device backend reports of its queues, kernels, events and CPU
fallbacks.

Only the backend knows when its queue flushes, which enqueued ops a kernel ran and when, on which
stream, when an event completed or a stream waited for one, and which ops fell back to the CPU. It
reports them through the backend hook API (``collectors/neuron_prof_backend.h``, version 2; a
backend written for version 1 reports no events and keeps working): C function pointers in a
struct it gets once from :func:`backend_api` (a PyCapsule named ``"neuron_prof.backend_api"``),
or, for a backend written in Python, :func:`report_enqueue`, :func:`report_flush`,
:func:`report_kernel`, :func:`report_fallback` and version 2's :func:`report_event`,
:func:`report_event_completed`, :func:`report_stream_wait` and :func:`report_sync`. Both feed the same buffers in the native engine (``_device.cpp``), and
only while a capture window is open. The struct's ``*capturing`` is 1 then, and all through an
always-on capture, whose dumps show each queue as it is (see :meth:`DeviceCollector.on_dump`),
0 otherwise: one branch per report when nothing captures. The collector drains the buffers at
every flush into:

===================  ============================================================================
table                one row per
===================  ============================================================================
``device_enqueues``  op put on a device queue: ts, tid (the host thread), id (unique, increasing,
                     what kernels name), device (``"neuron:0"``), stream, op (as the backend
                     named it), queue_depth (after it), and the host op open on the thread then:
                     host_op, module, stack, bwd. ``(tid, ts)`` falls inside that op's row of
                     ``ops``.
``queue_flushes``    wait of a host thread for a queue to drain: ts, dur, tid, device, reason
                     (``sync``, ``size``, ``fallback``, ``synchronize``, ``other``,
                     ``stream_synchronize``, ``event_synchronize``), ops (queued ops it waited
                     for), host_op, module, stack, bwd
``device_kernels``   kernel that ran on the device: ts, dur, tid (the thread that reported it),
                     id, device, stream, name, n_ops (enqueued ops it ran)
``kernel_enqueues``  (kernel, enqueue): ``device_kernels.id`` and the ``device_enqueues.id`` of each
                     op it ran, in the order the backend gave (``run.device_kernels`` shows them
                     as the list ``enqueue_ids``)
``fallbacks``        op that ran on the CPU instead: ts, dur, tid, device, op, bytes_to_host
                     (inputs copied off the device), bytes_from_host (outputs copied back),
                     host_op, module, stack, bwd
``event_enqueues``   record of an event (kind ``record``, ``Event.record()``) or wait for one
                     (kind ``wait``, ``Stream.wait_event()``) a host thread put on a stream: ts,
                     tid, device, stream, event (the backend's id), kind, host_op, module, stack
                     (the thread's user line when no op is open), bwd
``event_completions`` the device reached an event's record: ts (the event's timestamp, what
                     ``Event.elapsed_time`` reads), device, stream, event
``stream_waits``     a stream stood idle at a wait for an event not yet complete: ts, dur,
                     device, stream, event (its ``event_enqueues`` row of kind ``wait`` names the
                     host line)
``stream_syncs``     a version-2 host wait (``queue_synchronized``; it also makes the
                     ``queue_flushes`` row of the same tid and ts): ts, dur, tid, device, stream
                     (-1: every stream of the device), event (0: none), reason, ops, host_op,
                     module, stack, bwd
===================  ============================================================================

Timestamps are ns of ``CLOCK_MONOTONIC`` (the run clock; the API's ``now_ns``). A device index
becomes ``"<backend>:<index>"`` with the PrivateUse1 backend's name
(``torch._C._get_privateuse1_backend_name()``, ``privateuseone`` until the backend renames it);
index -1 is the backend name alone. Rows of warmup steps are dropped like the ops'. Each kind
buffers at most ``max_buffered_events`` rows between flushes; the rest are counted as dropped. A
Python report the capture cannot take (a value it cannot convert) is counted as dropped too, the
first of each table with its message in ``failures`` (``collectors/_hookguard``).
No backend reporting, no rows: the tables are then empty in the run (the reader gives them empty).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.recording import Recorder

__all__ = ["DeviceCollector", "backend_api", "report_enqueue", "report_flush", "report_kernel",
           "report_fallback", "report_event", "report_event_completed", "report_stream_wait", "report_sync",
           "FLUSH_REASONS"]

FLUSH_REASONS = ("sync", "size", "fallback", "synchronize", "other", "stream_synchronize", "event_synchronize")
"""``queue_flushes.reason``: the names of ``enum neuron_prof_flush_reason``, in code order."""
_REASON_CODES = {r: i for i, r in enumerate(FLUSH_REASONS)}

_TABLES = {  # engine kind -> table
    "enqueues": "device_enqueues", "flushes": "queue_flushes", "kernels": "device_kernels",
    "fallbacks": "fallbacks", "links": "kernel_enqueues", "events": "event_enqueues",
    "completions": "event_completions", "stream_waits": "stream_waits", "syncs": "stream_syncs",
}
_STRINGS = {"enqueues": ("op", "host_op", "module"), "flushes": ("host_op", "module"),
            "kernels": ("name",), "fallbacks": ("op", "host_op", "module"), "links": (),
            "events": ("kind", "host_op", "module"), "completions": (), "stream_waits": (),
            "syncs": ("host_op", "module")}

_ext = None       # the engine extension once loaded (backend_api or a collector's install)
_CAPTURING = False  # mirrors the API's flag (window or queue state), for the Python report functions' fast exit
_ACTIVE: "DeviceCollector | None" = None  # the installed collector, if any


def _engine_ext():
    global _ext
    if _ext is None:
        from neuron_prof.collectors._engine import load_engine

        _ext = load_engine().extension()
    return _ext


def backend_api():
    """The backend hook API as a PyCapsule named ``"neuron_prof.backend_api"``, holding a pointer
    to the process's ``neuron_prof_backend_api`` struct (``collectors/neuron_prof_backend.h``),
    which lives as long as the process. Builds or loads the native engine (JIT-built once, then
    cached). A backend calls this once, at its start-up, whether or not a capture runs; one that
    asks during a capture is reported from then on."""
    capsule = _engine_ext().device_api_capsule()
    col = _ACTIVE
    if col is not None:
        col._attach()
    return capsule


def _index(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):  # "neuron:0"; "neuron": -1
        _, _, index = device.partition(":")
        return int(index) if index else -1
    index = getattr(device, "index", None)  # a torch.device
    return -1 if index is None else int(index)


def report_enqueue(device, stream: int, op: str, queue_depth: int) -> int:
    """An op was put on a device queue by the calling (host) thread; ``queue_depth``: after it.
    The host op open on this thread (its module and source line) is recorded with it. Returns the
    enqueue's id (unique, increasing; what :func:`report_kernel` names), 0 when not capturing.
    ``device``: an index, a ``torch.device`` or ``"neuron:0"``. Never raises."""
    if not _CAPTURING:
        return 0
    try:
        return _ext.device_enqueue(_index(device), int(stream), str(op), int(queue_depth))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("device_enqueues", exc)
        return 0


def report_flush(device, reason: str, ops: int, start_ns: int, end_ns: int) -> None:
    """The calling (host) thread waited from ``start_ns`` to ``end_ns`` (``time.monotonic_ns()``)
    for ``ops`` queued ops to run. ``reason``: one of :data:`FLUSH_REASONS` (anything else is
    ``"other"``). Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_flush(_index(device), _REASON_CODES.get(reason, 4), int(ops), int(start_ns), int(end_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("queue_flushes", exc)


def report_kernel(device, stream: int, name: str, start_ns: int, end_ns: int, enqueue_ids=()) -> None:
    """A kernel ran on the device from ``start_ns`` to ``end_ns``: the enqueued ops (ids from
    :func:`report_enqueue`) it ran, fused. Any thread may report it. Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_kernel(_index(device), int(stream), str(name), int(start_ns), int(end_ns),
                           [int(i) for i in enqueue_ids])
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("device_kernels", exc)


def report_fallback(device, op: str, bytes_to_host: int, bytes_from_host: int, start_ns: int, end_ns: int) -> None:
    """``op`` ran on the CPU instead, from ``start_ns`` to ``end_ns`` on the calling thread (copies
    included): ``bytes_to_host`` copied off the device for its inputs, ``bytes_from_host`` back for
    its outputs. Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_fallback(_index(device), str(op), int(bytes_to_host), int(bytes_from_host), int(start_ns),
                             int(end_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("fallbacks", exc)


def report_event(device, stream: int, event: int, wait: bool = False) -> None:
    """The calling (host) thread put a record of ``event`` (the backend's id, nonzero) on
    ``stream`` (``wait``: a wait for it). The host op open on this thread, or its user line, is
    recorded with it. Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_event(_index(device), int(stream), int(event), bool(wait))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("event_enqueues", exc)


def report_event_completed(device, stream: int, event: int, ts_ns: int) -> None:
    """The device reached the record of ``event`` on ``stream`` at ``ts_ns``. Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_event_completed(_index(device), int(stream), int(event), int(ts_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("event_completions", exc)


def report_stream_wait(device, stream: int, event: int, start_ns: int, end_ns: int) -> None:
    """``stream`` stood idle from ``start_ns`` to ``end_ns`` waiting for ``event``. Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_stream_wait(_index(device), int(stream), int(event), int(start_ns), int(end_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("stream_waits", exc)


def report_sync(device, stream: int, event: int, reason: str, ops: int, start_ns: int, end_ns: int) -> None:
    """The calling (host) thread waited from ``start_ns`` to ``end_ns`` for ``ops`` queued ops of
    ``stream`` (-1: every stream of the device), for ``event`` (0: none): :func:`report_flush`
    with the stream and event (it makes the ``queue_flushes`` row too; report one or the other).
    Never raises."""
    if not _CAPTURING:
        return
    try:
        _ext.device_sync(_index(device), int(stream), int(event), _REASON_CODES.get(reason, 4), int(ops),
                         int(start_ns), int(end_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("stream_syncs", exc)


def _lost(table: str, exc: BaseException) -> None:
    """A report the capture could not take (a value it cannot convert, an engine error): counted
    as one dropped event of ``table``, the first with its message (``collectors/_hookguard``).
    Called only from the report functions' handlers: their path costs nothing more when nothing
    raises."""
    col = _ACTIVE
    if col is not None:
        col._guard.lost(table, exc)


def now_ns() -> int:
    """The run clock (what the report functions' times are on)."""
    return time.monotonic_ns()


def _set_capturing(window: bool, live: bool = False) -> None:
    """``window``: reports become rows; ``live``: they keep each queue's state for dumps (always-on
    capture; the state kept before is not this capture's)."""
    global _CAPTURING
    _CAPTURING = bool(window or live)
    if _ext is not None:
        _ext.device_set_flags(bool(window), bool(live))


class DeviceCollector:
    """Collector (neuron_prof.recording) of ``device_enqueues``, ``queue_flushes``,
    ``device_kernels``, ``kernel_enqueues``, ``fallbacks``, ``event_enqueues``,
    ``event_completions``, ``stream_waits`` and ``stream_syncs``."""

    name = "device"

    def __init__(self, max_buffered: int | None = None) -> None:
        self._rec: Recorder | None = None
        self._ids = None
        self._dtypes: dict[str, np.dtype] = {}  # set once attached to the engine
        self._devices: dict[int, int] = {}  # device index -> string id, per backend name
        self._backend = None
        self._max = max_buffered
        self._window = False
        self._live = False  # always-on: reports keep each queue's state, window on or off (on_dump)
        self._lock = threading.Lock()
        self._guard = HookGuard(self.name)  # reports the capture could not take (capture health)

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        """Attaches to the engine if it is loaded (the eager collector loads it; so does a
        backend's :func:`backend_api`); otherwise no backend can report yet, and the collector
        waits for :func:`backend_api` rather than build the engine itself: without a backend a
        capture costs nothing here, and an engine that cannot build is the op collector's failure."""
        global _ACTIVE
        from neuron_prof.collectors import _engine

        self._rec = rec
        self._live = getattr(rec, "always_on", None) is not None  # always-on, the one mode that dumps
        self._guard.attach(rec)
        _ACTIVE = self
        if _ext is not None or _engine._engine is not None:
            self._attach()

    def window(self, on: bool) -> None:
        with self._lock:
            self._window = bool(on)
            if self._dtypes:
                _set_capturing(on, self._live)

    def flush(self, rec: Recorder, keep: bool) -> None:
        if _ext is None or not self._dtypes:
            return
        rows, dropped = _ext.device_drain()
        if not keep:
            return
        for kind, n in dropped.items():
            if n:
                rec.dropped(_TABLES[kind], int(n))
        for kind, data in rows.items():
            if not data:
                continue
            arr = np.frombuffer(data, dtype=self._dtypes[kind])
            cols = {c: np.ascontiguousarray(arr[c]) for c in self._dtypes[kind].names}
            for c in _STRINGS[kind]:
                cols[c] = self._ids.map(rec, cols[c], "strings")
            if "stack" in cols:
                cols["stack"] = self._ids.map(rec, cols["stack"], "stacks")
            if "bwd" in cols:
                cols["bwd"] = cols["bwd"].astype(bool)
            if "device" in cols:
                cols["device"] = self._device_ids(rec, cols["device"])
            if "reason" in cols:
                codes = np.clip(cols["reason"], 0, len(FLUSH_REASONS) - 1)
                lut = np.array([rec.intern(r) for r in FLUSH_REASONS], np.int32)
                cols["reason"] = lut[codes]
            rec.append(_TABLES[kind], cols)

    def on_dump(self, rec: Recorder, ts: int) -> None:
        """An always-on dump: each device queue as it is now (``dump_queues``): its depth after the
        latest enqueue (0 if a flush drained it since) and the latest flush with its reason. The
        engine keeps both per device (index -1 to 62) from every report of this capture, window on
        or off, so a dump between sampled steps shows the step in flight, not the last sampled one."""
        queues = _ext.device_live_queues() if _ext is not None and self._dtypes else {}
        if not queues:
            return
        index = np.array(sorted(queues), np.int32)
        depth, depth_ts, flush_ts, flush_dur, reason, flush_ops = (
            np.array(col, np.int64) for col in zip(*(queues[i] for i in index.tolist())))
        drained = (flush_ts >= 0) & (flush_ts + flush_dur >= depth_ts)  # the host waited for the queue to drain
        depth = np.where(drained, 0, depth)
        depth_ts = np.where(drained, flush_ts + flush_dur, depth_ts)
        lut = np.array([rec.intern(r) for r in FLUSH_REASONS], np.int32)
        reason = np.where(flush_ts >= 0, lut[np.clip(reason, 0, len(FLUSH_REASONS) - 1)], 0)  # no flush: ""
        rec.append("dump_queues", {
            "ts": np.full(len(index), ts, np.int64), "device": self._device_ids(rec, index),
            "depth": depth.astype(np.int32), "depth_ts": depth_ts, "flush_ts": flush_ts, "flush_dur": flush_dur,
            "flush_reason": reason.astype(np.int32), "flush_ops": flush_ops.astype(np.int32)})

    def uninstall(self) -> None:
        global _ACTIVE
        with self._lock:
            if _ACTIVE is self:
                _ACTIVE = None
            self._guard.attach(None)
            _set_capturing(False)
            if _ext is not None and self._dtypes:
                _ext.device_drain()
            self._dtypes = {}

    # ---- internals
    def _attach(self) -> None:
        from neuron_prof.collectors._engine import EngineIds, load_engine

        with self._lock:
            if self._dtypes or _ACTIVE is not self:
                return
            engine = load_engine()  # loaded already: returns it
            ext = _engine_ext()
            self._ids = EngineIds(engine)
            ext.device_set_flags(False, False)
            ext.device_drain()  # reports from before this capture (none should be) are not its
            max_buffered = self._max or getattr(self._rec, "max_buffered_events", None)
            if max_buffered:
                ext.device_set_max(int(max_buffered))
            self._dtypes = {kind: np.dtype({"names": [f[0] for f in lay["fields"]],
                                            "offsets": [f[1] for f in lay["fields"]],
                                            "formats": [f[2] for f in lay["fields"]], "itemsize": lay["itemsize"]})
                            for kind, lay in ext.device_layout().items()}
            _set_capturing(self._window, self._live)

    def _device_ids(self, rec: Recorder, index: np.ndarray) -> np.ndarray:
        import torch

        backend = torch._C._get_privateuse1_backend_name()
        if backend != self._backend:  # renamed (rename_privateuse1_backend) since the last flush
            self._backend, self._devices = backend, {}
        out = np.empty(len(index), np.int32)
        for i in np.unique(index).tolist():
            sid = self._devices.get(i)
            if sid is None:
                sid = self._devices[i] = rec.intern(backend if i < 0 else f"{backend}:{i}")
            out[index == i] = sid
        return out
