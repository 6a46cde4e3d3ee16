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
* ``memory_keepers``, ``keeper_walks`` — at the end of capture and at an always-on dump, what keeps
  alive the blocks made in steps that ended and still live (``_keepers``: the Python tensors over
  them or whose graph saved them, and the list, dict, attribute or variable that holds those),
  with the stack of the user's call that ended the first step (the file that runs the step
  loop). Never inside a step on the training thread: a dump there walks at the next boundary.

Allocations made before capture started are not seen (their frees are ignored too): under
``neuron-prof record`` capture starts with the interpreter, so everything is seen.

The job's own ``torch.profiler`` started inside a capture takes the allocator reports while it
runs (``_memtrack.MemoryTracker``). A step in which it had them, for any moment, gets no
``memory_steps`` row of a device followed by allocator events (its live bytes are not the
allocator's, and the difference to the boundary before is not the step's); each such stretch of
steps is a ``failures`` row ``memory (memory_steps)`` naming its steps, and its rows count as
dropped. A device read from its backend's counters is not affected and keeps its rows.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import weakref
from typing import Any, Iterator

import numpy as np

from neuron_prof import forks
from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.collectors._keepers import walk
from neuron_prof.collectors._memcounters import CounterSampler
from neuron_prof.recording.api import frames_of
from neuron_prof.collectors._memtrack import device_code, device_name
from neuron_prof.recording.api import Recorder, framework_prefixes
from neuron_prof.store.schema import Frame, lost_events_label
from neuron_prof.store.schema import MEMORY_KINDS, TABLES, row_dtype
from neuron_prof.recording.torchhooks import hide_from_dynamo
from neuron_prof.units import parse_bytes

DEFAULT_MAX_EVENTS = 4_000_000
_STEP_ROW = row_dtype(TABLES["memory_steps"])
_PROCESS_ROW = row_dtype(TABLES["process_memory"])
_OOM_SIZE = re.compile(r"tried to allocate\s+([\d.]+\s*(?:bytes|[KMGT]i?B)?)", re.I)


class AllocatorReportsHeld(Exception):
    """The ``failures`` row of a stretch of steps whose allocator reports went to the job's own
    torch.profiler (the module docstring)."""

    def __init__(self, first: int, last: int, open_at_end: bool) -> None:
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        super().__init__(
            f"the job's own torch.profiler held the allocator's reports in {steps}"
            + (" (until capture ended)" if open_at_end else "")
            + ": their allocations and frees are not in the run (no live bytes or leak verdict for those "
              "steps; blocks freed in them count as live after)")


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
        self._forks = -1  # ``forks.generation()`` when the file was opened (-1: not yet): a file
        # opened as /proc/self before a fork is the parent's
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def read(self) -> int | None:
        """Resident bytes now, or None where they cannot be read (never raises). A fork is told by
        a count the fork itself moves, not by asking the pid at every boundary (a system call)."""
        try:
            if self._forks != forks.generation():  # first use, or a forked child: its own file
                self.close()
                self._forks = forks.generation()
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)  # no such file: not Linux
            # the second field: resident pages (one split that stops after it)
            return int(os.pread(self._fd, 128, 0).split(None, 2)[1]) * self._page if self._fd >= 0 else None
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
    """Collector (neuron_prof.recording.api) of allocator events: ``memory_events``, ``memory_steps``,
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
        # stretches of steps whose allocator reports the job's torch.profiler held: [first, last],
        # the last one still open while it holds them; and the memory_steps rows they cost
        self._held: list[list[int]] = []
        self._held_open = False
        self._held_rows = 0
        self._rec: Recorder | None = None
        # Recorder.kept_for_us's list as last seen, how many of it are measured, their bytes per device
        self._ours: list = []
        self._ours_seen = 0
        self._ours_bytes: dict[str, int] = {}
        self._step_frames: list[Frame] | None = None  # the user's call that ended the first step
        self._training_thread = 0
        self._boundaries = (0, 0)  # ts of the first and the latest step boundary
        self._walk_due = False  # a dump on the training thread: walk at the next boundary

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        self._guard.attach(rec)
        self._rec = rec
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

            self._unhide = hide_from_dynamo(note_optimizer)  # see neuron_prof.recording.torchhooks
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
        if self._step_frames is None:
            self._step_frames = _user_frames()
            self._training_thread = threading.get_ident()
        self._boundaries = (self._boundaries[0] or ts, ts)
        if self._walk_due and self._rec is not None:
            self._walk_due = False
            self._walk_keepers(self._rec)
        held = self.tracker.held_since_last_call()
        totals = self.tracker.totals()  # none on a host that follows no device between windows
        rss = self._resident.read()
        counters = self._counters
        if not (held or self._held_open or totals or self._window or (counters is not None and counters.reading())):
            # the resident memory alone: most boundaries of an always-on capture on a host
            if rss is not None:
                with self._lock:
                    self._process.append((step, ts, rss))
            return
        tracked = [(step, ts, self._device(t, i), live, peak, alloc, res)
                   for t, i, live, peak, alloc, res in totals] if totals else []
        rows, decided = self._counted(step, ts, tracked)
        with self._lock:
            if held:  # only the rows read from a backend's counters are true (the module docstring)
                spoiled = {id(r) for r in tracked}
                kept = [r for r in rows if id(r) not in spoiled]
                self._held_rows += len(rows) - len(kept)
                rows = kept
                if self._held_open:
                    self._held[-1][1] = step
                else:
                    self._held.append([step, step])
            self._held_open = held
            if rows:  # no row, nothing to take neuron_prof's own bytes off
                self._steps.extend(self._less_ours(rows, tracked))
            if decided:
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

    def on_dump(self, rec: Recorder, ts: int) -> None:
        """An always-on dump: what keeps the blocks alive, now, or (a dump on the training thread,
        which may be inside a step) at the next step boundary."""
        if self.tracker is None:
            return
        if threading.get_ident() == self._training_thread:
            self._walk_due = True
        else:
            self._walk_keepers(rec)

    def flush(self, rec: Recorder, keep: bool) -> None:
        """All memory rows are kept whatever ``keep`` says: a block allocated in a warmup step
        and alive in an active one belongs to what is live then. The final flush first walks for
        what keeps the blocks alive."""
        if self.tracker is None:
            return
        if rec.closing:
            self._walk_keepers(rec)
        events, dropped = self.tracker.drain()
        self._append_events(rec, events)
        if dropped:
            rec.dropped("memory_events", dropped)
        with self._lock:
            self._record_held(rec)
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

    def _less_ours(self, rows: list[tuple], tracked: list[tuple]) -> list[tuple]:
        """``rows`` with what neuron_prof alone keeps alive (``Recorder.kept_for_us``: losses not
        read yet) taken off live and allocated bytes, so that holding them is no leak of the
        user's: at the size the allocator reported for the block (CUDA's rounded one) on a device
        that reports (one of ``tracked``'s), else (counters) at the storage's size. That list only
        grows until its tensors are read (then it is a new one), so each tensor is measured once."""
        ours = self._rec.kept_for_us() if self._rec is not None else []
        if ours is not self._ours or len(ours) < self._ours_seen:
            self._ours, self._ours_seen, self._ours_bytes = ours, 0, {}
        if len(ours) > self._ours_seen:
            reported = {r[2] for r in tracked}
            fresh = ours[self._ours_seen:]
            self._ours_seen = len(ours)
            codes = [device_code(t.device) for t in fresh]
            storages = [t.untyped_storage() for t in fresh]
            blocks = self.tracker.block_bytes([(c, i, st.data_ptr()) for (c, i), st in zip(codes, storages)])
            sizes = self._ours_bytes
            for (c, i), st, block in zip(codes, storages, blocks):
                device = device_name(c, i)
                sizes[device] = sizes.get(device, 0) + (block if device in reported else st.nbytes())
        sizes = self._ours_bytes
        if not sizes:
            return rows
        return [(step, ts, d, live - sizes.get(d, 0), peak, alloc - sizes.get(d, 0) if alloc else alloc, res)
                for step, ts, d, live, peak, alloc, res in rows]

    def _record_held(self, rec: Recorder) -> None:
        """A ``failures`` row per stretch of steps the job's torch.profiler held the allocator
        reports in, once it ended (or the capture does); the rows it cost as dropped (lock held)."""
        ended = len(self._held) if rec.closing or not self._held_open else len(self._held) - 1
        for i, (first, last) in enumerate(self._held[:ended]):
            still_held = self._held_open and i == len(self._held) - 1  # only when the capture closes
            rec.failure(lost_events_label(self.name, "memory_steps"), AllocatorReportsHeld(first, last, still_held))
        self._held = self._held[ended:]
        if self._held_rows:
            rec.dropped("memory_steps", self._held_rows)
            self._held_rows = 0

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
            name = self._devices[key] = device_name(device_type, index)
        return name

    def _note_tensors(self, step: int, ts: int) -> None:
        """Storages of parameters, gradients and optimizer state, by address; the first role
        wins (a parameter is never also counted as optimizer state). Parameters and state are
        noted at the first boundary of a window and whenever an optimizer's parameter or state
        count changes (Adam makes its state at its first step): their blocks outlive steps, and
        one row inside an allocation's lifetime is all the category join needs. Gradients are
        noted at every boundary: they are new blocks every step."""
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
            counts = (sum(len(g["params"]) for g in opt.param_groups), len(opt.state))
            kept = self._fresh_window or self._counts.get(opt) != counts
            self._counts[opt] = counts
            for t, category in _optimizer_tensors(opt, kept):
                add(t, category)
        self._fresh_window = False
        with self._lock:
            self._tensors.extend(rows)

    def _walk_keepers(self, rec: Recorder) -> None:
        """``memory_keepers`` and a ``keeper_walks`` row for the blocks made between the first and
        the latest step boundary and live now, less parameters, gradients and optimizer state."""
        first, last = self._boundaries
        if not first:
            return  # no step ended: nothing made in one
        try:
            live, _ = self.tracker.snapshot()
            live = live[(live["ts"] >= first) & (live["ts"] < last)]
            roles = self._role_storages()
            storages = {}
            for t, i, addr, size in zip(live["device_type"], live["device_index"], live["addr"], live["bytes"]):
                key = (self._device(int(t), int(i)), int(addr))
                if key not in roles:
                    storages[key] = int(size)
            now = time.monotonic_ns()
            found = walk(storages)
        except Exception as exc:  # noqa: BLE001 - training must never break
            self._guard.lost("keeper_walks", exc)
            return
        kept = found.kept
        rec.append("memory_keepers", {
            "ts": np.full(len(kept), now, np.int64),
            "device": np.array([rec.intern(k.device) for k in kept], np.int32),
            "addr": np.array([k.addr for k in kept], np.int64),
            **{c: np.array([rec.intern(getattr(k, c)) for k in kept], np.int32)
               for c in ("via", "keeper", "scope", "file")}})
        rec.append("keeper_walks", {
            "ts": np.array([now], np.int64), "dur": np.array([found.dur_ns], np.int64),
            "objects": np.array([found.objects], np.int64), "storages": np.array([found.storages], np.int32),
            "kept": np.array([len(kept)], np.int32), "stopped": np.array([rec.intern(found.stopped)], np.int32),
            "stack": np.array([rec.intern_stack(self._step_frames or [])], np.int32)})

    def _role_storages(self) -> set[tuple[str, int]]:
        """(device, address) of the parameters, gradients and optimizer state of the optimizers
        that stepped: kept by design, not what a leak's keeper is looked for."""
        return {(self._device(*device_code(t.device)), t.untyped_storage().data_ptr())
                for opt in list(self._optimizers) for t, _ in _optimizer_tensors(opt)}

    def _append_events(self, rec: Recorder, ev: np.ndarray) -> None:
        if len(ev):
            rec.append("memory_events", self.tracker.rows(ev, rec, self.engine))


_FRAMEWORK: list[str] = []


def _optimizer_tensors(opt: Any, kept: bool = True) -> Iterator[tuple[Any, str]]:
    """An optimizer's tensors with their role, the first role of a storage first: its parameters
    and their optimizer state (unless not ``kept``: blocks that outlive steps), their gradients."""
    import torch

    params = [p for g in opt.param_groups for p in g["params"]]
    if kept:
        yield from ((p, "parameter") for p in params)
    for state in opt.state.values() if kept else ():
        for v in state.values() if isinstance(state, dict) else ():
            if isinstance(v, torch.Tensor):
                yield v, "optimizer state"
    yield from ((p.grad, "gradient") for p in params if p.grad is not None)


def _user_frames(limit: int = 8) -> list[Frame]:
    """The caller's stack from its first frame outside torch and neuron_prof outwards, innermost
    first: at a step boundary, the user's call that ended the step (``prof.step()``, the
    optimizer's ``step()``) and its callers."""
    if not _FRAMEWORK:
        _FRAMEWORK.extend(framework_prefixes())
    prefixes = tuple(_FRAMEWORK)
    frames = frames_of(sys._getframe(1))
    first = next((i for i, (name, _, _) in enumerate(frames) if not name.startswith(prefixes)), len(frames))
    return frames[first:first + limit]
