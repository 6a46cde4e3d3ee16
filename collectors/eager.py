"""The eager op collector: every ATen op, backward node and ``record_function`` range.

A C++ ``at::RecordFunction`` observer (``_engine``) records ops into per-thread buffers while a
window is on; global module hooks (``modules``) tell it the current module path. ``flush``
drains the engine, whose rows come with the Recorder's string and stack ids.

Importing this module imports no torch extension: the observer is built in ``install``.
"""
from __future__ import annotations

import os
import sysconfig
import threading

import numpy as np

from neuron_prof.collectors._dispatch import DispatchPaths
from neuron_prof.recording.api import Recorder, framework_prefixes

DEFAULT_MAX_BUFFERED = 2_000_000


def skip_prefixes() -> list[str]:
    """Filename prefixes of Python frames left out of op stacks.

    torch (and its sibling packages), neuron_prof, the standard library except site-packages /
    dist-packages, and frozen modules: what is left is the user's code (and third-party libs).
    """
    out = framework_prefixes()
    paths = sysconfig.get_paths()
    seen = set()
    for key in ("stdlib", "platstdlib"):
        d = paths.get(key)
        if not d or d in seen or not os.path.isdir(d):
            continue
        seen.add(d)
        for entry in sorted(os.listdir(d)):
            if entry in ("site-packages", "dist-packages"):
                continue
            full = os.path.join(d, entry)
            out.append(os.path.join(full, "") if os.path.isdir(full) else full)
    return list(dict.fromkeys(out))


def _thread_names() -> dict[int, str]:
    names = {}
    for t in threading.enumerate():
        if t.native_id is not None:
            names[t.native_id] = t.name
    return names


def _os_thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return f"thread-{tid}"


class EagerCollector:
    """Collector (neuron_prof.recording.api) of eager ops: table ``ops`` (+ ``threads``, and ``op_dispatch``
    for the ops that ran on a PrivateUse1 device: ``_dispatch``)."""

    name = "eager"

    def __init__(self, max_buffered: int | None = None, skip: list[str] | None = None) -> None:
        self.max_buffered = max_buffered
        self.skip = skip
        self.engine = None
        self.tracker = None
        self._new_threads: dict[int, str] = {}  # OS tid -> name, learnt but not yet appended
        self._dispatch: DispatchPaths | None = None

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        try:
            from neuron_prof.collectors._engine import load_engine
            from neuron_prof.collectors.modules import ModuleTracker

            eng = load_engine()
            cap = self.max_buffered or getattr(rec, "max_buffered_events", None) or DEFAULT_MAX_BUFFERED
            eng.start(self.skip if self.skip is not None else skip_prefixes(), int(cap))
            self.engine = eng
            self._dispatch = DispatchPaths()
            self.tracker = ModuleTracker(eng.set_module, eng.intern, rec.training_began)
            self.tracker.install()
        except Exception as exc:  # noqa: BLE001 - training must never break
            rec.failure(self.name, exc)
            self._teardown()

    def window(self, on: bool) -> None:
        if self.engine is not None:
            self.engine.set_recording(on)
        if self.tracker is not None:
            self.tracker.window(on)  # module hooks only while a window needs them

    def flush(self, rec: Recorder, keep: bool) -> None:
        if self.engine is None:
            return
        dispatch = self._dispatch
        batch = self.engine.drain(dispatch.intern(rec.intern) if dispatch else rec.intern, rec.intern_stack)
        self._new_threads.update(batch.thread_names)
        if not keep or len(batch) == 0:
            return
        rec.append("ops", batch.rows)  # already the ops journal's rows: stored as they are
        if dispatch is not None:
            try:
                dispatch.note(rec, batch.rows)
            except Exception as exc:  # noqa: BLE001 - the ops are kept; what the dispatcher says is not asked again
                rec.failure(self.name, exc)
                self._dispatch = None
        if self._new_threads:
            self._append_threads(rec)
        if batch.dropped:
            rec.dropped("ops", batch.dropped)

    def exclude(self, ns: int) -> None:
        """The session's own step-boundary work took ``ns`` on this thread (see Collector)."""
        if self.engine is not None:
            self.engine.exclude(ns)

    def uninstall(self) -> None:
        self._teardown()

    # ---- internals
    def _teardown(self) -> None:
        if self.tracker is not None:
            try:
                self.tracker.uninstall()
            finally:
                self.tracker = None
        if self.engine is not None:
            try:
                self.engine.stop()
            finally:
                self.engine = None

    def _append_threads(self, rec: Recorder) -> None:
        """The engine reports every thread it sees (and renames) once; pass them on."""
        python_names = _thread_names()
        tids = list(self._new_threads)
        rec.append("threads", {
            "tid": np.array(tids, dtype=np.int64),
            "name": np.array([rec.intern(python_names.get(t) or self._new_threads[t] or _os_thread_name(t))
                              for t in tids], dtype=np.int32),
        })
        self._new_threads.clear()
