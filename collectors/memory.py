"""The memory collector: every allocation and free, on any device that reports to the profiler;
per-step totals from its backend's own counters for a device that does not.

Mechanism: the engine's native memory tracker (``_memory.cpp``, Python side ``_memtrack``)
receives the allocator reports PyTorch sends to profilers (``c10::reportMemoryUsageToProfiler``:
the CPU allocator, CUDA's caching allocator, PrivateUse1 backends that report) and attributes
each allocation to the op the eager observer has open on the allocating thread (op, module path,
user stack: the lines that executed). Tables:

* ``memory_events`` — during capture windows, every alloc/free; when a window opens, what was
  allocated since capture started and is still live (``baseline``); frees of such blocks after
  the window (``late_free``), so every captured allocation has its lifetime.
* ``memory_steps`` — at every step boundary of the run, windows or not (cheap: counters), per
  device: live bytes (allocated since capture started), the peak since the previous boundary,
  and the allocator's own totals where it reports them (CUDA). A PrivateUse1 device whose
  allocator reports nothing to the profiler has its backend's own counters here instead
  (``_memcounters``: its allocated bytes and high-water mark; which source each device's rows
  come from is a ``memory_sources`` row). Always-on capture follows the CPU
  allocator in its sampled steps only (unless ``follow_cpu_memory``: c10's CPU allocator pays a
  mutex and a size-table entry per block whenever memory is reported), so it has no CPU rows
  here; ``process_memory`` is the CPU's per-step figure then, and a CPU block still live when a
  sampled step's window closes ends its known lifetime with an ``unfollowed`` event.
* ``memory_tensors`` — at each captured step boundary, the tensors whose role Python knows:
  ``parameter``, ``gradient`` and ``optimizer state`` of every optimizer that stepped (found
  through ``torch.optim``'s global step hook), by storage address, with shape and dtype.
  The analyses give an allocation alive at that moment at that address the same category.
* ``memory_ooms`` — an out-of-memory error that ends the capture (``profile`` exits with it, or
  the script dies of it under ``neuron-prof record``): its message and requested size; the
  live set at that moment goes to ``memory_events`` as ``live`` rows, the last allocator events
  before it as ``recent`` rows.
* ``process_memory`` — at every step boundary, the process's resident memory (RSS): what the
  allocators do not see (Python objects, autograd graph nodes, native libraries) shows there.

Allocations made before capture started are not seen (their frees are ignored too): under
``neuron-prof record`` capture starts with the interpreter, so everything is seen.
"""
from __future__ import annotations

import os
import re
import threading
import time
import weakref

import numpy as np

from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.collectors._memcounters import CounterSampler
from neuron_prof.recording import Recorder
from neuron_prof.schema import MEMORY_KINDS, TABLES, row_dtype
from neuron_prof.torchhooks import hide_from_dynamo
from neuron_prof.units import parse_bytes

DEFAULT_MAX_EVENTS = 4_000_000
_STEP_ROW = row_dtype(TABLES["memory_steps"])
_PROCESS_ROW = row_dtype(TABLES["process_memory"])
_OOM_SIZE = re.compile(r"tried to allocate\s+([\d.]+\s*(?:bytes|[KMGT]i?B)?)", re.I)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (any device), Python's MemoryError, or an allocator's RuntimeError."""
    import torch

    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        k in text for k in ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory"))


def oom_device(message: str, devices: set[str]) -> str:
    """The device an OOM message is about: the CPU allocator's and MemoryError are the CPU's; a
    message naming a device type (``CUDA out of memory``, ``neuron:0``...) picks the first
    tracked device of that type; else the CPU."""
    text = message.lower()
    if "cpuallocator" in text or message.startswith("MemoryError"):
        return "cpu"
    for d in sorted(devices):
        kind = d.split(":")[0]
        if kind != "cpu" and (d in text or kind in text):
            return d
    return "cpu"


def requested_bytes(message: str) -> int:
    """The size an OOM message says could not be allocated (0 if it does not say)."""
    m = _OOM_SIZE.search(message)
    if not m:
        return 0
    return parse_bytes(m.group(1))


class ResidentMemory:
    """This process's resident set size, cheap enough for every step boundary: Linux's
    ``/proc/self/statm`` stays open and one ``pread`` (a few µs) reads it. Elsewhere there is no
    cheap reading of the *current* RSS (``resource`` gives only the peak), so nothing is read."""

    def __init__(self) -> None:
        self._fd = -1
        self._pid = 0
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def read(self) -> int | None:
        """Resident bytes now, or None where they cannot be read (never raises)."""
        try:
            if self._pid != os.getpid():  # first use, or a forked child: its own file
                self.close()
                self._pid = os.getpid()
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)  # no such file: not Linux
            return int(os.pread(self._fd, 128, 0).split()[1]) * self._page if self._fd >= 0 else None
        except (OSError, ValueError, IndexError):
            self.close()
            return None

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = -1


class MemoryCollector:
    """Collector (neuron_prof.recording) of allocator events: ``memory_events``, ``memory_steps``,
    ``memory_tensors``, ``memory_ooms``, ``memory_sources``, ``process_memory``."""

    name = "memory"

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.max_events = max_events
        self.engine = None
        self.tracker = None
        self._window = False
        self._steps: list[tuple] = []  # (step, ts, device, live, peak, allocated, reserved)
        self._counters: CounterSampler | None = CounterSampler()  # None once its counters failed
        self._sources: list[tuple[int, str, str, str]] = []  # (ts, device, figures_from, api)
        self._resident = ResidentMemory()
        self._process: list[tuple[int, int, int]] = []  # (step, ts, rss)
        self._tensors: list[tuple] = []  # (ts, step, addr, device, bytes, category, shape, dtype)
        self._optimizers: "weakref.WeakSet" = weakref.WeakSet()
        self._counts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> (params, states)
        self._fresh_window = False
        self._hook = None
        self._unhide = None
        self._devices: dict[tuple[int, int], str] = {}
        self._tensor_texts: dict[tuple, tuple[str, str, str]] = {}  # (device, shape, dtype) -> their texts
        self._lock = threading.Lock()
        self._guard = HookGuard(self.name)  # tensors a step boundary could not note (capture health)

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        self._guard.attach(rec)
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            from neuron_prof.collectors._engine import load_engine
            from neuron_prof.collectors._memtrack import MemoryTracker

            self.engine = load_engine()
            tracker = MemoryTracker(self.engine.extension())
            tracker.start(self.max_events, follow_cpu=rec.follows_cpu_memory)
            self.tracker = tracker
            optimizers = self._optimizers

            def note_optimizer(opt, args, kwargs) -> None:
                optimizers.add(opt)

            self._unhide = hide_from_dynamo(note_optimizer)  # see neuron_prof.torchhooks
            self._hook = register_optimizer_step_post_hook(note_optimizer)
        except Exception as exc:  # noqa: BLE001 - training must never break
            rec.failure(self.name, exc)
            self._teardown()

    def window(self, on: bool) -> None:
        self._window = on
        self._fresh_window = on
        if self.tracker is not None:
            self.tracker.set_detail(on)

    def on_step(self, step: int, ts: int) -> None:
        """Every step boundary: live bytes and peak per device (the backend's counters for a device
        whose allocator does not report), the process's resident memory; in windows, the known
        tensors."""
        if self.tracker is None:
            return
        rows, decided = self._counted(step, ts, [(step, ts, self._device(t, i), live, peak, alloc, res)
                                                 for t, i, live, peak, alloc, res in self.tracker.totals()])
        rss = self._resident.read()
        with self._lock:
            self._steps.extend(rows)
            self._sources.extend(decided)
            if rss is not None:
                self._process.append((step, ts, rss))
        if self._window:
            self._note_tensors(step, ts)

    def on_error(self, rec: Recorder, exc: BaseException, step: int) -> None:
        """The capture ends with ``exc``: if it is an out-of-memory, record what was live."""
        if self.tracker is None or not is_out_of_memory(exc):
            return
        now = time.monotonic_ns()
        live, recent = self.tracker.snapshot()
        message = f"{type(exc).__name__}: {exc}".strip()
        # the allocator's own report of the failure (c10::reportOutOfMemoryToProfiler: CUDA, a
        # PrivateUse1 backend) names the device and size; the message is read where none came
        # (the CPU allocator, MemoryError), against the devices that had blocks live
        reported = recent[recent["kind"] == MEMORY_KINDS.index("oom")]
        asked = requested_bytes(str(exc))
        cpu_message = "cpuallocator" in message.lower() or message.startswith("MemoryError")
        if len(reported) and not cpu_message:
            same = reported[reported["bytes"] == asked] if asked else reported
            last = (same if len(same) else reported)[-1]
            device = self._device(int(last["device_type"]), int(last["device_index"]))
            asked = asked or int(last["bytes"])
        else:
            devices = {self._device(int(t), int(i)) for t, i in zip(live["device_type"], live["device_index"])}
            device = oom_device(message, devices)
        rec.append("memory_ooms", {
            "ts": np.array([now], np.int64), "step": np.array([step], np.int32),
            "device": np.array([rec.intern(device)], np.int32),
            "bytes": np.array([asked], np.int64),
            "message": np.array([rec.intern(message.splitlines()[0][:2000])], np.int32)})
        live = live.copy()
        live["alloc_ts"], live["ts"] = live["ts"], now
        self._append_events(rec, live)
        recent = recent.copy()
        recent["kind"] = MEMORY_KINDS.index("recent")
        self._append_events(rec, recent)

    def flush(self, rec: Recorder, keep: bool) -> None:
        """All memory rows are kept whatever ``keep`` says: a block allocated in a warmup step
        and alive in an active one belongs to what is live then."""
        if self.tracker is None:
            return
        events, dropped = self.tracker.drain()
        self._append_events(rec, events)
        if dropped:
            rec.dropped("memory_events", dropped)
        with self._lock:
            steps, self._steps = self._steps, []
            tensors, self._tensors = self._tensors, []
            process, self._process = self._process, []
            sources, self._sources = self._sources, []
        if sources:
            c = list(zip(*sources))
            rec.append("memory_sources", {
                "ts": np.array(c[0], np.int64), "device": np.array([rec.intern(d) for d in c[1]], np.int32),
                "figures_from": np.array([rec.intern(s) for s in c[2]], np.int32),
                "api": np.array([rec.intern(s) for s in c[3]], np.int32)})
        # every step's rows, made in their journals' layout at once: written as they are
        if process:
            rec.append("process_memory", np.array(process, dtype=_PROCESS_ROW))
        if steps:
            rec.append("memory_steps", np.array([(s, ts, rec.intern(d), *rest) for s, ts, d, *rest in steps],
                                                dtype=_STEP_ROW))
        if tensors:
            c = list(zip(*tensors))
            rec.append("memory_tensors", {
                "ts": np.array(c[0], np.int64), "step": np.array(c[1], np.int32),
                "addr": np.array(c[2], np.int64), "device": np.array([rec.intern(d) for d in c[3]], np.int32),
                "bytes": np.array(c[4], np.int64), "category": np.array([rec.intern(s) for s in c[5]], np.int32),
                "shape": np.array([rec.intern(s) for s in c[6]], np.int32),
                "dtype": np.array([rec.intern(s) for s in c[7]], np.int32)})

    def uninstall(self) -> None:
        self._teardown()

    # ---- internals
    def _teardown(self) -> None:
        self._guard.attach(None)
        self._resident.close()
        if self._hook is not None:
            try:
                self._hook.remove()
            finally:
                self._hook = None
        if self._unhide is not None:
            self._unhide()
            self._unhide = None
        if self.tracker is not None:
            try:
                self.tracker.stop()
            finally:
                self.tracker = None

    def _counted(self, step: int, ts: int, tracked: list[tuple]) -> tuple[list[tuple], list[tuple]]:
        """``CounterSampler.rows``; a backend whose counters fail is not read again (the boundary's
        row of it is counted lost, with its message, in Capture health)."""
        if self._counters is None:
            return tracked, []
        try:
            return self._counters.rows(step, ts, tracked)
        except Exception as exc:  # noqa: BLE001 - a backend's counters must never break training
            self._counters = None
            self._guard.lost("memory_steps", exc)
            return tracked, []

    def _device(self, device_type: int, index: int) -> str:
        key = (device_type, index)
        name = self._devices.get(key)
        if name is None:
            from neuron_prof.collectors._memtrack import device_name

            name = self._devices[key] = device_name(device_type, index)
        return name

    def _note_tensors(self, step: int, ts: int) -> None:
        """Storages of parameters, gradients and optimizer state, by address; the first role
        wins (a parameter is never also counted as optimizer state). Parameters and state are
        noted at the first boundary of a window and whenever an optimizer's parameter or state
        count changes (Adam makes its state at its first step): their blocks outlive steps, and
        one row inside an allocation's lifetime is all the category join needs. Gradients are
        noted at every boundary: they are new blocks every step."""
        import torch

        seen: set[tuple[object, int]] = set()
        rows = []
        texts = self._tensor_texts
        lost = self._guard.lost

        def add(t, category: str) -> None:
            try:
                st = t.untyped_storage()
                key = (t.device, st.data_ptr())
                if key in seen or not st.nbytes():
                    return
                seen.add(key)
                kind = (t.device, t.shape, t.dtype)
                text = texts.get(kind)
                if text is None:  # the same few per model, every step: built once
                    text = texts[kind] = (str(t.device), str(list(t.shape)), str(t.dtype).replace("torch.", ""))
                rows.append((ts, step, key[1], text[0], st.nbytes(), category, text[1], text[2]))
            except Exception as exc:  # noqa: BLE001 - e.g. a tensor without a storage: its block goes unnamed
                lost("memory_tensors", exc)

        for opt in list(self._optimizers):
            params = [p for g in opt.param_groups for p in g["params"]]
            counts = (len(params), len(opt.state))
            if self._fresh_window or self._counts.get(opt) != counts:
                self._counts[opt] = counts
                for p in params:
                    add(p, "parameter")
                for state in opt.state.values():
                    for v in state.values() if isinstance(state, dict) else ():
                        if isinstance(v, torch.Tensor):
                            add(v, "optimizer state")
            for p in params:
                if p.grad is not None:
                    add(p.grad, "gradient")
        self._fresh_window = False
        with self._lock:
            self._tensors.extend(rows)

    def _append_events(self, rec: Recorder, ev: np.ndarray) -> None:
        if len(ev):
            rec.append("memory_events", self.tracker.rows(ev, rec, self.engine))
