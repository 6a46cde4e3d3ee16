"""The device collector: what the device did in each capture window, as its backend reports it to
PyTorch's profiler (Kineto), the path every backend already takes.

CUDA reports through CUPTI, a PrivateUse1 backend (TorchNeuron, the emulated ``neuron`` device)
through the ``libkineto::IActivityProfiler`` it registers, XPU through PTI: whichever of
``torch.profiler.supported_activities()`` names a device, this collector runs Kineto for it alone,
with no CPU activity (neuron_prof's op observer records the ops), in capture windows and always-on
capture's sampled steps. A process with no such activity type (a CPU-only job) starts nothing.
The session's activities are saved as torch.profiler saves a trace and turned into the run's
device tables by ``neuron_prof.backends.device_activity`` (one conversion for a capture and an imported
trace): kernels and the launches they ran, copies, host waits, CPU fallbacks, event records and
waits, stream waits. Times go on the run clock; the host op and line of each launch or wait are
joined at read time from the ops by thread and time.

A session ends at the window's end, and within a long window at the first step boundary
``DRAIN_INTERVAL_NS`` after it started (then a new one starts); its trace is saved and read into
the run's rows at the window's end, or every ``READ_INTERVAL_NS`` / ``READ_BUDGET_BYTES`` of a
long window. Rows of warmup steps are dropped like the ops'.

**The job's own torch.profiler** keeps working: Kineto serves one trace at a time, and a thread
holds one profiler state. When the job prepares or starts torch.profiler (or ``emit_nvtx``,
``emit_itt``) while a session of this collector runs, the session ends first (its rows kept) and
no new one starts until the job's profiler stops; a capture window that begins while the job's
profiler runs starts none. Each such stretch is a ``device_gaps`` row (capture health names the
steps without device activity and why). Nothing of it raises into training.

**Always-on dumps** (a hang, an exception, SIGUSR1) happen between windows, when no Kineto session
runs: each queue's depth and latest host wait come from the backend hook API
(``collectors/neuron_prof_backend.h``, version 3), which a backend may implement for that alone:
:func:`backend_api` hands it the C struct, :func:`report_enqueue` and :func:`report_sync` are the
same for a backend written in Python. The dump's ``dump_queues`` rows are those.
"""
from __future__ import annotations

import importlib
import os
import queue
import tempfile
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.recording.api import Recorder
from neuron_prof.recording.torchhooks import watch_user_profilers

if TYPE_CHECKING:
    from neuron_prof.backends.device_activity import DeviceTables

__all__ = ["DeviceCollector", "backend_api", "report_enqueue", "report_sync", "FLUSH_REASONS", "DRAIN_INTERVAL_NS",
           "READ_INTERVAL_NS", "READ_BUDGET_BYTES"]

FLUSH_REASONS = ("sync", "size", "fallback", "synchronize", "other", "stream_synchronize", "event_synchronize")
"""The hook API's flush reasons (``enum neuron_prof_flush_reason``), in code order."""
_REASON_CODES = {r: i for i, r in enumerate(FLUSH_REASONS)}
DRAIN_INTERVAL_NS = 2_000_000_000
"""Within a capture window, a Kineto session is stopped, its trace saved to a file and a new one
started at the first step boundary this long after it started: Kineto's buffers stay bounded."""
READ_INTERVAL_NS = 30_000_000_000
READ_BUDGET_BYTES = 128 << 20
"""Saved traces are read into the run's device tables at the window's end, at always-on's sampled
steps and dumps, and within a long window at the first boundary after they hold this long or this
many bytes of activity: reading costs ~12 µs an event (parsing, on the training thread, between
steps), so it comes in few stalls; a kill -9 loses what is saved and not read."""
_STRING_COLUMNS = {"device_kernels": ("device", "name"), "device_enqueues": ("device", "op", "host_op", "module"),
                   "device_copies": ("device", "kind", "name", "host_op", "module"),
                   "queue_flushes": ("device", "reason", "host_op", "module"),
                   "stream_syncs": ("device", "reason", "host_op", "module"),
                   "fallbacks": ("device", "op", "host_op", "module"),
                   "event_enqueues": ("device", "kind", "host_op", "module"), "event_completions": ("device",),
                   "stream_waits": ("device",), "kernel_enqueues": ()}
_UNNAMED_BACKEND = "privateuseone"  # torch's name for PrivateUse1 until a backend renames it
_USER_PROFILER = "the job's own torch.profiler was running (Kineto serves one trace at a time)"

_ext = None  # the engine extension once loaded (backend_api or a collector's install)
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
    cached). A backend calls this once, at its start-up, whether or not a capture runs."""
    capsule = _engine_ext().device_api_capsule()
    col = _ACTIVE
    if col is not None:
        col._attach_hooks()
    return capsule


def _index(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):  # "neuron:0"; "neuron": -1
        _, _, index = device.partition(":")
        return int(index) if index else -1
    index = getattr(device, "index", None)  # a torch.device
    return -1 if index is None else int(index)


def report_enqueue(device, queue_depth: int) -> None:
    """A Python backend put an op on ``device``'s queue: the queue's depth with it (always-on
    dumps show it). ``device``: an index, a ``torch.device`` or ``"neuron:0"``. Never raises."""
    if _ext is None or not _ext.device_capturing():
        return
    try:
        _ext.device_enqueue(_index(device), int(queue_depth))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("dump_queues", exc)


def report_sync(device, reason: str, ops: int, start_ns: int, end_ns: int) -> None:
    """A Python backend's host thread waited from ``start_ns`` to ``end_ns``
    (``time.monotonic_ns()``) for ``ops`` queued ops of ``device``: the queue's latest flush
    (always-on dumps show it). ``reason``: one of :data:`FLUSH_REASONS`. Never raises."""
    if _ext is None or not _ext.device_capturing():
        return
    try:
        _ext.device_flush(_index(device), _REASON_CODES.get(reason, 4), int(ops), int(start_ns), int(end_ns))
    except Exception as exc:  # noqa: BLE001 - the backend's queue must go on
        _lost("dump_queues", exc)


def _lost(table: str, exc: BaseException) -> None:
    col = _ACTIVE
    if col is not None:
        col._guard.lost(table, exc)


def epoch_offset_ns() -> int:
    """``CLOCK_REALTIME - CLOCK_MONOTONIC`` now, read between the two closest monotonic reads of a
    few tries: Kineto's times are the Unix epoch's, the run's ``CLOCK_MONOTONIC``'s."""
    best, out = None, 0
    for _ in range(200):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best:
            best, out = b - a, r - (a + (b - a) // 2)
    return out


class _ProfilerThread:
    """The thread that holds neuron_prof's Kineto sessions. torch keeps a profiler's state per
    thread: on the training thread it may be the job's own torch.profiler, or the memory
    collector's tracker, and either refuses a second. Kineto itself traces the whole process, so
    a session held here sees every thread's device work. Calls are made from any thread (a step
    boundary, always-on capture's background thread, the capture's end at exit) and wait for
    their result. A daemon thread: it runs during the interpreter's exit handlers."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="neuron_prof device activity", daemon=True)
        self._thread.start()

    def call(self, fn, *args):
        if threading.current_thread() is self._thread:
            return fn(*args)
        done, box = threading.Event(), {}
        self._calls.put((fn, args, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def post(self, fn, *args) -> None:
        """``fn(*args)`` on the thread, not waited for (its result and error are dropped)."""
        self._calls.put((fn, args, {}, threading.Event()))

    def close(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, args, box, done = item
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
            done.set()


class _Kineto:
    """One Kineto session for the device's activity type. Prepared on the calling thread (the
    first preparation initializes Kineto, which wants the thread that imported torch: the
    training thread, usually), enabled and held by ``thread``."""

    def __init__(self, thread: _ProfilerThread, activity, state, backend: str) -> None:
        self.activity, self.state, self.backend = activity, state, backend
        self.started = time.monotonic_ns()
        import torch._C._autograd as autograd
        from torch._C._profiler import ProfilerConfig, _ExperimentalConfig

        config = ProfilerConfig(state, False, False, False, False, False, _ExperimentalConfig())
        with _quiet_kineto() as quiet:
            autograd._prepare_profiler(config, {activity})
            quiet.again()  # the first preparation initializes Kineto, which sets its own level
            thread.call(autograd._enable_profiler, config, {activity})

    def stop(self) -> _Saved:
        """End the session and save its trace (as torch.profiler saves one) to a file of its own,
        read later (``_Saved.read``): the training thread waits for Kineto's stop and save only."""
        import torch._C._autograd as autograd

        with _quiet_kineto():
            result = autograd._disable_profiler()
        fd, path = tempfile.mkstemp(prefix="neuron_prof-device-", suffix=".json")
        os.close(fd)
        try:
            result.save(path)
        except BaseException:
            os.unlink(path)
            raise
        return _Saved(path, self.started, time.monotonic_ns(), self.backend, os.path.getsize(path))


class _Saved:
    """A stopped session's trace, saved and not read yet."""

    def __init__(self, path: str, started: int, stopped: int, backend: str, size: int) -> None:
        self.path, self.started, self.stopped, self.backend, self.size = path, started, stopped, backend, size

    def read(self) -> bytes:
        """The trace's JSON; the file goes."""
        try:
            with open(self.path, "rb") as f:
                return f.read()
        finally:
            self.discard()

    def discard(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _quiet_kineto:
    """Kineto logs every trace start and stop to stderr (its USDT messages, above the ERROR level
    torch sets): one pair per window and drain would fill a job's log. Their level is raised for
    neuron_prof's own starts and stops only, where libkineto's level variable is found."""

    _level = None

    def __enter__(self):
        self.saved = None
        return self.again()

    def again(self):
        """Quiet from here on (after a call that may have set Kineto's level)."""
        level = type(self)._find()
        if level is not None:
            if level.value != 6:
                self.saved = level.value
            level.value = 6  # above USDT (5): ENUM_COUNT
        return self

    def __exit__(self, *exc):
        level = type(self)._level
        if level is not None and self.saved is not None:
            level.value = self.saved
        return False

    @classmethod
    def _find(cls):
        if cls._level is None:
            import ctypes

            try:
                import torch

                lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
                cls._level = ctypes.c_int.in_dll(lib, "_ZN9libkineto6Logger14severityLevel_E")
            except (OSError, ValueError):
                cls._level = False
        return cls._level or None


def device_activity_type():
    """(the profiler activity, the profiler state, the backend's name) of this process's device,
    as ``torch.autograd.profiler.profile`` picks them; None when the process has none (CPU only)."""
    import torch
    from torch._C._autograd import _supported_activities
    from torch._C._profiler import ProfilerActivity, ProfilerState

    supported = _supported_activities()
    if ProfilerActivity.PrivateUse1 in supported:
        return (ProfilerActivity.PrivateUse1, getattr(ProfilerState, "KINETO_PRIVATEUSE1", ProfilerState.KINETO),
                torch._C._get_privateuse1_backend_name())
    for name in ("CUDA", "XPU", "MTIA", "HPU"):
        activity = getattr(ProfilerActivity, name, None)
        if activity is not None and activity in supported:
            return activity, ProfilerState.KINETO, name.lower()
    return None


class DeviceCollector:
    """Collector (neuron_prof.recording.api) of the device tables (``device_kernels``,
    ``kernel_enqueues``, ``device_enqueues``, ``device_copies``, ``queue_flushes``,
    ``stream_syncs``, ``fallbacks``, ``event_enqueues``, ``event_completions``, ``stream_waits``),
    ``device_gaps`` and, at always-on dumps, ``dump_queues``."""

    name = "device"

    def __init__(self) -> None:
        self._rec: Recorder | None = None
        self._session: _Kineto | None = None
        self._window = False
        self._window_start = 0
        self._discard_before = 0  # rows before this are of warmup steps
        self._pending: list[DeviceTables] = []
        self._saved: list[_Saved] = []  # stopped sessions' traces, read at the window's end
        self._offset = 0
        self._next_kernel = 1
        self._user_profiler = False  # the job's own torch.profiler holds Kineto
        self._no_device_as: str | None = None  # the backend's name when it was found to have no device
        self._gap: tuple[int, str] | None = None  # a window's stretch without a session: since, why
        self._gaps: list[tuple[int, int, str]] = []
        self._unwatch = None
        self._thread: _ProfilerThread | None = None
        self._live = False
        self._boundary_ts = 0  # the latest step boundary: a session begun before it may be drained
        self._lock = threading.RLock()
        self._guard = HookGuard(self.name)

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        global _ACTIVE
        from neuron_prof.collectors import _engine

        self._rec = rec
        self._live = getattr(rec, "always_on", None) is not None  # always-on: dumps show each queue
        self._guard.attach(rec)
        self._offset = epoch_offset_ns()
        self._unwatch = watch_user_profilers(self)
        _ACTIVE = self
        if _ext is not None or _engine._engine is not None:
            self._attach_hooks()

    def window(self, on: bool) -> None:
        with self._lock:
            self._window = on
            if on:
                self._window_start = self._discard_before = time.monotonic_ns()
                self._start()
            else:
                self._stop()
                self._end_gap()

    def flush(self, rec: Recorder, keep: bool) -> None:
        with self._lock:
            now = time.monotonic_ns()
            session = self._session
            # always-on: every sampled step's rows now, for its ring (a dump writes the ring); a
            # drain only at a step boundary (always-on's background thread flushes mid-step too):
            # the device's records of work in flight go to the next session, started at once
            if session is not None and (rec.closing or session.started < self._boundary_ts and (
                    self._live or now - session.started >= DRAIN_INTERVAL_NS)):
                self._stop()
                if not rec.closing and self._window:
                    self._start()
            elif self._window and session is None and not self._user_profiler:
                # the job's profiler stopped, or the device's backend registered since the window
                # opened (a script that enables its device after capture began): from this boundary
                self._start()
            if rec.closing:
                self._end_gap()
            if not keep:  # warmup: its rows go, and what still comes of it
                for saved in self._saved:
                    saved.discard()
                self._saved.clear()
                self._pending.clear()
                self._discard_before = now
                return
            if self._saved and (rec.closing or self._live or not self._window or self._saved_due(now)):
                self._read_saved()
            pending, self._pending = self._pending, []
            gaps, self._gaps = self._gaps, []
        for tables in pending:
            self._append(rec, tables)
        if gaps:
            rec.append("device_gaps", {"ts": np.array([g[0] for g in gaps], np.int64),
                                       "dur": np.array([g[1] - g[0] for g in gaps], np.int64),
                                       "reason": np.array([rec.intern(g[2]) for g in gaps], np.int32)})

    def on_step(self, step: int, ts: int) -> None:
        """A step boundary: a session begun before it may be drained from now on."""
        self._boundary_ts = ts

    def on_dump(self, rec: Recorder, ts: int) -> None:
        """An always-on dump: the step in flight's device activity so far (a session running is
        drained, and goes on), and each device queue as the backend hook API last heard of it
        (``dump_queues``): its depth after the latest enqueue (0 if a flush drained it since) and
        the latest flush with its reason."""
        with self._lock:
            if self._session is not None:
                self._stop()
                self._start()
            self._read_saved()
            pending, self._pending = self._pending, []
        for tables in pending:
            self._append(rec, tables)
        queues = _ext.device_live_queues() if _ext is not None else {}
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
        backend = _backend_name()
        names = [rec.intern(backend if i < 0 else f"{backend}:{i}") for i in index.tolist()]
        rec.append("dump_queues", {
            "ts": np.full(len(index), ts, np.int64), "device": np.array(names, np.int32),
            "depth": depth.astype(np.int32), "depth_ts": depth_ts, "flush_ts": flush_ts, "flush_dur": flush_dur,
            "flush_reason": reason.astype(np.int32), "flush_ops": flush_ops.astype(np.int32)})

    def uninstall(self) -> None:
        global _ACTIVE
        with self._lock:
            if _ACTIVE is self:
                _ACTIVE = None
            session, self._session = self._session, None
            if session is not None:
                try:
                    self._thread.call(session.stop)
                except Exception:  # noqa: BLE001 - a session torch no longer holds: nothing to stop
                    pass
            for saved in self._saved:
                saved.discard()
            self._saved.clear()
            if self._thread is not None:
                self._thread.close()
                self._thread = None
            if self._unwatch is not None:
                self._unwatch()
                self._unwatch = None
            if _ext is not None:
                _ext.device_set_live(False)
            self._guard.attach(None)

    # ---- the job's own profiler (neuron_prof.recording.torchhooks.ProfilerWatcher)
    def profiler_starting(self, phase: str) -> None:
        """The job prepares or starts its own profiler: this collector's session ends first (its
        rows kept), and no new one starts until the job's profiler stops."""
        with self._lock:
            self._user_profiler = True
            self._stop()
            if self._window and self._gap is None:
                self._gap = (time.monotonic_ns(), _USER_PROFILER)

    def profiler_start_failed(self) -> None:
        pass  # the job's profiler state is whatever it was: its own stop says when Kineto is free

    def profiler_stopped(self) -> None:
        with self._lock:
            self._user_profiler = False

    # ---- internals
    def _device_kind(self):
        """``device_activity_type()``, not asked again in a process whose PrivateUse1 backend is
        still unnamed once it said there is no device: a window's boundaries in a CPU-only job then
        cost one name lookup, not the profiler's query (issue 39: 8-10 us a boundary). A backend
        that names itself later is asked about from then on."""
        name = _backend_name()
        if name == self._no_device_as:
            return None
        kind = device_activity_type()
        self._no_device_as = name if kind is None and name == _UNNAMED_BACKEND else None
        return kind

    def _start(self) -> None:
        if self._session is not None:
            return
        kind = self._device_kind()
        if kind is None:
            return
        if self._user_profiler or _user_profiler_running():
            if self._gap is None:
                self._gap = (time.monotonic_ns(), _USER_PROFILER)
            return
        if self._thread is None:
            self._thread = _ProfilerThread()
            # the trace's reader (pandas) loads beside the first window, not inside its first drain;
            # never in a process without a device: starting a capture loads no pandas (test_startup)
            self._thread.post(importlib.import_module, "neuron_prof.backends.device_activity")
        try:
            self._session = _Kineto(self._thread, *kind)
        except Exception as exc:  # noqa: BLE001 - Kineto would not start: the window goes on without it
            self._guard.lost("device_kernels", exc, n=0)
            if self._gap is None:
                self._gap = (time.monotonic_ns(), f"Kineto did not start: {type(exc).__name__}: {exc}"[:300])
            return
        self._end_gap()

    def _stop(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        try:
            self._saved.append(self._thread.call(session.stop))
        except Exception as exc:  # noqa: BLE001 - a trace Kineto could not save: its rows are lost
            self._unreadable(session.started, time.monotonic_ns(), exc)

    def _saved_due(self, now: int) -> bool:
        """Whether the saved traces are read at this boundary although the window goes on: they
        hold ``READ_INTERVAL_NS`` of activity, or ``READ_BUDGET_BYTES`` of trace."""
        return now - self._saved[0].started >= READ_INTERVAL_NS or sum(x.size for x in self._saved) >= READ_BUDGET_BYTES

    def _read_saved(self) -> None:
        """The saved traces, read in order, as device tables (``_pending``)."""
        saved, self._saved = self._saved, []
        threads = _kineto_threads() if saved else {}
        for x in saved:
            try:
                tables = self._tables(x.read(), x.backend, threads)
            except Exception as exc:  # noqa: BLE001 - a trace that could not be read: its rows are lost
                self._unreadable(x.started, x.stopped, exc)
                continue
            self._next_kernel += len(tables.kernels)
            self._pending.append(tables)

    def _tables(self, data: bytes, backend: str, threads: dict[int, int]) -> DeviceTables:
        """A saved trace's device tables: parsed with orjson, and again with decimals where a time
        is past what a double holds to the nanosecond (``InexactTime``); no garbage collection
        meanwhile (``gc_paused``)."""
        from neuron_prof.backends.device_activity import InexactTime, device_tables, gc_paused, read_kineto_json

        def tables(doc) -> DeviceTables:
            base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
            events = doc.get("traceEvents") or [] if isinstance(doc, dict) else []
            return device_tables(events, label=_labeler(backend), shift_ns=(base if isinstance(base, int) else 0)
                                 - self._offset, first_kernel_id=self._next_kernel, threads=threads)

        with gc_paused():
            try:
                return tables(read_kineto_json(data))
            except InexactTime:
                return tables(read_kineto_json(data, exact=True))

    def _unreadable(self, started: int, stopped: int, exc: BaseException) -> None:
        """What a trace held is not known: the stretch it covered is a gap, the error its first
        one's."""
        self._guard.lost("device_kernels", exc, n=0)
        self._gaps.append((started, stopped, f"the device's trace could not be read: {type(exc).__name__}: {exc}"[:300]))

    def _end_gap(self) -> None:
        if self._gap is not None:
            since, why = self._gap
            self._gaps.append((since, time.monotonic_ns(), why))
            self._gap = None

    def _append(self, rec: Recorder, tables: DeviceTables) -> None:
        """``tables``' rows of this window (a late kernel of an earlier trace, or a warmup step's
        row, is dropped), strings interned."""
        since = max(self._window_start, self._discard_before)
        kept: np.ndarray | None = None  # the kernels kept: their links to launches go with them
        for table, df in tables.tables().items():
            if table == "kernel_enqueues" and kept is not None:
                df = df[np.isin(df["kernel"].to_numpy(), kept)]
            elif "ts" in df.columns:
                df = df[df["ts"].to_numpy() >= since]
            if table == "device_kernels":
                kept = df["id"].to_numpy()
            if not len(df):
                continue
            cols = {c: df[c].to_numpy() for c in df.columns}
            for c in _STRING_COLUMNS[table]:
                cols[c] = _interned(rec, cols[c])
            rec.append(table, cols)

    def _attach_hooks(self) -> None:
        """The hook API's queue state, kept all through an always-on capture."""
        if self._live:
            _engine_ext().device_set_live(True)


def _interned(rec: Recorder, values: np.ndarray) -> np.ndarray:
    """``values``' string ids. A column of strings has each distinct one interned once, in the order
    it first appears (the ids a row-by-row pass gives): a trace repeats a few names tens of
    thousands of times, and an ``intern`` takes the session's lock. Anything else (a None, a
    number) row by row, as ``str`` names it."""
    import pandas as pd  # loaded with the tables already (device_activity): never in a CPU-only process

    if pd.api.types.infer_dtype(values, skipna=False) != "string":
        return np.array([rec.intern(str(v)) for v in values], np.int32)
    codes, distinct = pd.factorize(values)
    return np.array([rec.intern(v) for v in distinct], np.int32)[codes]


def _kineto_threads() -> dict[int, int]:
    """OS tids by ``libkineto::threadId()``, for the threads the op observer saw (the ones that
    launch device work): how a session without CPU activity names CUDA's runtime calls. An id
    that is some thread's OS tid as well is left as it is."""
    ids = _engine_ext().kineto_thread_ids()
    known = set(ids.values())
    return {k: v for k, v in ids.items() if k not in known}


def _backend_name() -> str:
    import torch

    return torch._C._get_privateuse1_backend_name()


def _labeler(backend: str):
    names: dict[int, str] = {}

    def label(index: int) -> str:
        name = names.get(index)
        if name is None:
            name = names[index] = backend if index < 0 else f"{backend}:{index}"
        return name

    return label


def _user_profiler_running() -> bool:
    """Whether a profiler of the job's holds torch's profiler state now (this thread's, or
    torch.profiler's flag)."""
    try:
        import torch.autograd.profiler as profiler
        from torch._C._autograd import _profiler_enabled

        return bool(_profiler_enabled() or getattr(profiler, "_is_profiler_enabled", False))
    except ImportError:
        return False
