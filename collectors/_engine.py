"""The eager op engine: one small interface in front of a C++ ``at::RecordFunction`` observer.

The observer lives in ``_observer.cpp`` and is JIT-built with ``torch.utils.cpp_extension.load``
(cached by torch in ``TORCH_EXTENSIONS_DIR``) under a name keyed by what it is built from
(:func:`extension_name`); once built, it is loaded from there directly. Everything the eager
collector needs from it goes through :class:`OpEngine`, so the mechanism can be replaced without
touching the collector.

Rows (:class:`OpBatch`), one per completed op, laid out as the run store's ``ops`` journal row
(``neuron_prof.store.schema.row_dtype``) with the Recorder's string and stack ids:

=========  =======  ==================================================================
ts         int64    start, ns, ``CLOCK_MONOTONIC`` (equals ``time.monotonic_ns()``)
dur        int64    ns
tid        int64    OS thread id (gettid) of the thread the op started on
name       int32    string id of the op / range name (``aten::addmm``, ...)
module     int32    string id of the module path (0: none)
stack      int32    stack id (0: none)
shapes     int32    string id of e.g. ``"[[8, 64], [64, 64]]"``
dtypes     int32    string id of e.g. ``"float32,float32"``
devices    int32    string id of e.g. ``"cpu,cpu"``
seq        int64    autograd sequence number (-1: none)
fwd_tid    int64    OS tid of the thread that ran the forward op: the op's own tid for
                    forward ops, the forward thread for backward ops (0: unknown)
bwd        bool     the op ran in the backward pass
depth      int16    nesting depth on its thread (0: top level)
=========  =======  ==================================================================

Input metadata strings have one positional entry per op input, trailing entries that are
neither tensors, tensor lists nor devices trimmed. A non-tensor input is ``[]`` in ``shapes``
and an empty entry in ``dtypes``/``devices`` (``addmm(b, x, w, beta, alpha)`` gives
``"[[64], [8, 64], [64, 64]]"``, ``"float32,float32,float32"``, ``"cpu,cpu,cpu"``). A
``c10::Device`` argument shows in ``devices`` (``_to_copy(x, device=cpu)`` gives
``"cpu,,,cpu"``). A tensor list is one nested entry (``"[[2, 3], [2, 3]]"``) whose dtype/device
is the common value or the values joined with ``|``. Symbolic dims print as ``?``.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

Frame = tuple[str, str, int]


@dataclass
class OpBatch:
    """Everything recorded since the last drain (see the module docstring for the rows)."""

    rows: np.ndarray
    dropped: int = 0
    thread_names: list[tuple[int, str]] = field(default_factory=list)
    """(OS tid, name) learnt since the last drain: the Python ``threading`` name of threads that
    ran Python, else the OS thread name (comm)."""

    def __len__(self) -> int:
        return len(self.rows)


class OpEngine(Protocol):
    def start(self, skip_prefixes: list[str], max_buffered: int) -> None:
        """Start the observer, recording off: its RecordFunction callback is registered only while
        recording (``set_recording``), so ops outside windows pay nothing for it. Raises if already
        started."""

    def set_recording(self, on: bool) -> None: ...

    def set_module(self, module_id: int) -> None:
        """Current module-path string id of the calling thread (0: none)."""

    def exclude(self, ns: int) -> None:
        """neuron_prof's own work just took ``ns`` on the calling thread: the ops open there
        do not count it in their durations."""

    def intern(self, s: str) -> int:
        """Engine-local string id."""

    def drain(self, intern: Callable[[str], int], intern_stack: Callable[[list[Frame]], int]) -> OpBatch:
        """Everything recorded since the last drain, with the ids ``intern`` and ``intern_stack``
        (the Recorder's) give each string and stack: each is asked once per ``start``."""

    def stop(self) -> None:
        """Remove the callbacks."""


def journal_rows(table: str, native: list[tuple[str, int, int]]) -> np.dtype:
    """``table``'s journal row layout (``schema.row_dtype``), which the engine's packed rows of it
    must match field for field: (name, offset, size) as the native side lays them out."""
    from neuron_prof.store.schema import TABLES, row_dtype

    rows = row_dtype(TABLES[table])
    ours = [(n, rows.fields[n][1], rows.fields[n][0].itemsize) for n in rows.names]
    if [tuple(f) for f in native] != ours:
        raise RuntimeError(f"the engine's {table} rows {native} are not the {table} journal's {ours}: "
                           "rebuild the engine")
    return rows


class CppOpEngine:
    """:class:`OpEngine` over the compiled ``_observer.cpp`` extension (a process singleton)."""

    def __init__(self, ext) -> None:
        self._ext = ext
        lay = ext.layout()
        self.row_dtype = journal_rows("ops", [(n, off, np.dtype(t).itemsize) for n, off, t in lay["fields"]])
        self._started = False
        # hot paths called from module hooks: bind the C functions directly (no Python wrapper)
        self.set_module = ext.set_module
        self.intern = ext.intern

    # -- OpEngine
    def start(self, skip_prefixes: list[str], max_buffered: int) -> None:
        self._ext.start(list(skip_prefixes), int(max_buffered))
        self._started = True

    def set_recording(self, on: bool) -> None:
        self._ext.set_recording(bool(on))

    def set_module(self, module_id: int) -> None:
        self._ext.set_module(module_id)

    def intern(self, s: str) -> int:
        return self._ext.intern(s)

    def exclude(self, ns: int) -> None:
        self._ext.exclude(int(ns))

    def drain(self, intern: Callable[[str], int], intern_stack: Callable[[list[Frame]], int]) -> OpBatch:
        _, strings, stacks, dropped, threads = self._ext.drain()
        data = self._ext.take_rows([(i, intern(value)) for i, value in strings],
                                   [(i, intern_stack([tuple(f) for f in frames])) for i, frames in stacks])
        return OpBatch(rows=np.frombuffer(data, dtype=self.row_dtype), dropped=int(dropped),
                       thread_names=[(int(t), str(n)) for t, n in threads])

    def stop(self) -> None:
        self._ext.set_recording(False)
        self._ext.stop()
        self._started = False

    # -- extras (tests, diagnostics)
    def stats(self) -> dict:
        return dict(self._ext.stats())

    def now_ns(self) -> int:
        return self._ext.now_ns()

    def extension(self):
        """The compiled module, for the engine's other native parts (the memory tracker)."""
        return self._ext

    def strings_of(self, ids: list[int]) -> list[str]:
        """Engine strings by id, without draining (collectors other than the eager one)."""
        return list(self._ext.strings_of([int(i) for i in ids]))

    def stacks_of(self, ids: list[int]) -> list[list[Frame]]:
        """Engine stacks by id, innermost frame first (``[]`` for 0 or unknown)."""
        return [[tuple(f) for f in frames] for frames in self._ext.stacks_of([int(i) for i in ids])]


class EngineIds:
    """Engine string and stack ids to a Recorder's, each looked up once, on first sight (for the
    engine's native parts other than the op observer, whose collector gets them by draining)."""

    def __init__(self, engine: CppOpEngine) -> None:
        self.engine = engine
        self._luts = {"strings": np.zeros(1, np.int32), "stacks": np.zeros(1, np.int32)}  # -1: not looked up

    def map(self, rec, ids: np.ndarray, which: str) -> np.ndarray:
        """``which``: "strings" or "stacks"; ``rec``: the Recorder the ids are for."""
        ids = ids.astype(np.int64)
        lut = self._luts[which]
        top = int(ids.max(initial=0))
        if top >= len(lut):
            lut = np.concatenate([lut, np.full(max(top + 1, 2 * len(lut)) - len(lut), -1, np.int32)])
        mapped = lut[ids]
        if mapped.min(initial=0) >= 0:
            return mapped
        unknown = np.unique(ids[mapped < 0]).tolist()
        if which == "stacks":
            for i, frames in zip(unknown, self.engine.stacks_of(unknown)):
                lut[i] = rec.intern_stack(frames) if frames else 0
        else:
            for i, s in zip(unknown, self.engine.strings_of(unknown)):
                lut[i] = rec.intern(s)
        self._luts[which] = lut
        return lut[ids]


_lock = threading.Lock()
_engine: CppOpEngine | None = None
_build_seconds: float | None = None

_SOURCES = ("_observer.cpp", "_engine_services.cpp", "_input_meta.cpp", "_memory.cpp", "_comms.cpp", "_device.cpp")
_HEADERS = ("_engine.h", "_observer.h", "neuron_prof_backend.h")  # included by the sources: part of what is built
_CFLAGS = ("-O2", "-DNDEBUG")


_HERE = os.path.dirname(os.path.abspath(__file__))


def extension_name(folder: str = _HERE) -> str:
    """``neuron_prof_engine_<key>``: the name torch's extension cache builds and finds the engine
    under. The key hashes what the binary depends on: the sources and header, the build flags,
    torch's version and the Python ABI. Every copy of neuron_prof on a machine with the same
    engine shares one build; copies with different sources (or torches) no longer rebuild one
    another's under one shared name, nor wait on one another's build lock. ``folder``: where the
    sources are (this package's)."""
    import torch

    h = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        with open(os.path.join(folder, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    abi = sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or ""
    h.update("\0".join((*_CFLAGS, torch.__version__, abi)).encode())
    return f"neuron_prof_engine_{h.hexdigest()[:16]}"


def build_folder(name: str) -> str:
    """Where ``torch.utils.cpp_extension`` builds extension ``name`` (its ``_get_build_directory``,
    which imports setuptools: this is the same rule without it)."""
    import torch
    import torch._appdirs  # not imported by `import torch`; cpp_extension imports it itself

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        if torch.version.hip is not None:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        elif torch.version.cuda is not None:
            accelerator = f"cu{torch.version.cuda.replace('.', '')}"
        else:
            accelerator = "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(torch._appdirs.user_cache_dir(appname="torch_extensions")),
                            f"{python}_{accelerator}")
    return os.path.join(root, name)


def _built_extension(name: str) -> str | None:
    """The built library of ``name`` if torch's extension cache has it, complete; else None.
    Loading it directly skips importing ``cpp_extension`` (and setuptools with it) and running
    ninja: 0.2-0.4 s of every capture's start. Should torch move its builds, this finds nothing
    and ``load`` does the work as before."""
    folder = build_folder(name)
    library = os.path.join(folder, name + (".pyd" if sys.platform == "win32" else ".so"))
    # a build in progress holds the folder's lock file (and may be writing the library)
    if os.path.isfile(library) and not os.path.exists(os.path.join(folder, "lock")):
        return library
    return None


def _import_library(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_engine(verbose: bool = False) -> CppOpEngine:
    """Build (or load from torch's extension cache) the native engine; raises on failure.

    One extension holds the op observer and the memory tracker (``_memory.cpp``), which reads the
    observer's open op on the allocating thread. The memory tracker's Python side is
    ``collectors/_memtrack.py``; it gets the extension from :meth:`CppOpEngine.extension`.
    """
    global _engine, _build_seconds
    with _lock:
        if _engine is not None:
            return _engine
        t0 = time.perf_counter()
        name = extension_name()
        library = _built_extension(name)
        if library is not None:
            ext = _import_library(name, library)
        else:
            from torch.utils.cpp_extension import load

            ext = load(name=name, sources=[os.path.join(_HERE, s) for s in _SOURCES], extra_cflags=list(_CFLAGS),
                       verbose=verbose)
        _build_seconds = time.perf_counter() - t0
        _engine = CppOpEngine(ext)
        atexit.register(_at_exit)
        return _engine


def build_seconds() -> float | None:
    """Seconds the last ``load_engine`` spent building or loading the extension."""
    return _build_seconds


def _at_exit() -> None:
    # Stop recording before the interpreter finalizes: callbacks must never touch Python then.
    eng = _engine
    if eng is not None:
        try:
            eng.stop()
        except Exception:
            pass
