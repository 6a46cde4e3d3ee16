"""The compiler collector: what ``torch.compile`` did, from hooks in Dynamo and Inductor.

Mechanism: a handful of narrow hooks, each on a point where torch already hands over the fact we
want, all put back at uninstall (and inert if someone wrapped them on top of us). Each is put in
when the program imports the module it hooks (:func:`neuron_prof.recording.torchhooks.when_imported`;
at once if it already has): starting a capture imports neither Dynamo nor Inductor.

======================================================  =========================================
hook (torch 2.13)                                       table(s)
======================================================  =========================================
``torch._dynamo.utils.ChromiumEventLogger.``            ``compile_phases``; ``compiles.ts/dur``
``_log_timed_event`` (Dynamo's ``dynamo_timed`` B/E     (``entire_frame_compile``); the caller
events; torch's own work kept, its structured log       stack walked at its begin
record left out)                                        (``compiles.stack``); the backend read off
                                                        the tracer at ``backend_compile``
``torch._dynamo.utils.log_compilation_event``           ``compiles`` (torch's CompilationMetrics,
(called with every CompilationMetrics)                  one per frame compile); ``compile_cache``
                                                        (Dynamo's cache counters, diffed per
                                                        compile)
the ``graph_breaks`` artifact loggers (what             ``graph_breaks``
``TORCH_LOGS=graph_breaks`` prints), our handler only
``torch._dynamo.convert_frame.``                        ``recompiles`` (one row per cache entry
``get_and_maybe_log_recompilation_reasons``             whose guards failed)
``torch._inductor.debug.set_kernel_post_grad_``         ``fusions`` (kernel -> FX nodes: the
``provenance_tracing``, called at every kernel's        scheduler nodes of each generated
codegen (and its copies in ``codegen.cpp`` and          kernel, ``collectors/_fusions``), kept
``codegen.triton``); ``compile_fx.``                    per compiled graph for cache hits
``fx_codegen_and_compile``; ``FxGraphCache.``
``cache_hit_post_compile``
======================================================  =========================================

No setting of torch's is changed: nothing here enters a compile cache key (Inductor's
provenance tracking, which would give the same fusion facts, does: see ``collectors/_fusions``),
and every wrapper is hidden from Dynamo's frame evaluation
(:func:`neuron_prof.recording.torchhooks.skip_frames`).

Why not torch's structured trace log (``trace_log``, what tlparse reads): torch builds every
structured record — graphs printed, guards, generated code, each JSON-encoded and md5-hashed — as
soon as that logger has any handler. Measured on examples/graph_breaks.py (benchmarks/
compile_overhead.py), a bare ``NullHandler`` there adds 23-29% to compile time; these hooks read
the same facts where torch computes them anyway. A user's own ``TORCH_TRACE`` keeps working.

Columns worth knowing: ``compiles.status`` is ``ok``, ``no graph`` (nothing to compile),
``skipped`` (a graph break dynamo could not resume from: the frame runs eagerly) or ``failed``
(the error reached the user: backend error, ``fullgraph=True``...). ``compiles.stack`` is the
user's stack *calling into* the frame (innermost first, torch frames left out); the frame itself
is ``func/file/line`` (its ``def`` line). ``graph_breaks.reason`` is torch's message (graph-break
type, explanation, hints, GBxxxx link); ``reason_class`` is :func:`reason_class` of it. Dynamo
logs a break it has seen before under the same ``torch.compile`` (same type, same place) without
its stack; such rows get the stack of the first one. ``compile_phases.depth`` is the nesting among
phases (the compile itself and ``compile_attempt_N`` are not phases), so the depth-0 phases of a
frame lie inside its ``compiles`` span; the lazy backward compile (at the first ``backward()``) is
``backward compile`` with ``(backward)`` phases under it. ``fusions.nodes`` are the names of the
nodes of the graph dynamo handed to Inductor (pre-grad names through each post-grad node's
``from_node`` history; post-grad names where there is none, e.g. nodes made by the joint graph
or the backward pass), for the forward and the backward graph; an extern kernel
(``extern_kernels.addmm``) lists the node it computes. A graph loaded from Inductor's caches has
the fusion rows of its fresh compile if that compile was captured (``collectors/_fusions``).
``compile_cache`` counts Inductor's FX graph cache and AOTAutograd's cache (hit/miss/bypass) from
``torch._dynamo.utils.counters``.

The hooks only file away what they are handed (a tuple each); everything is parsed in ``flush``.
All rows are kept whatever ``keep`` says: compiles are rare and usually happen in the first,
uncaptured steps. ``compile_id`` strings are torch's ``frame_id/frame_compile_id`` (with
``!<compiled_autograd_id>/`` in front under compiled autograd) without the ``_attempt`` suffix:
a compile that restarts (every graph break restarts tracing once) is one compile. Compiled code
that runs without recompiling calls none of the hooks.

If torch changed the shape of a hooked function, nothing is hooked: the collector records the
failure (capture health) and the run goes on without compiler tables. A record a hook (or the
parse in ``flush``) could not file is counted as dropped for its table, the first of each table
with its message in ``failures`` (``collectors/_hookguard``); the collector goes on. With
``torch._dynamo.config.log_compilation_metrics = False`` torch does not hand over its metrics,
and the ``compiles`` table stays empty.

Backends other than Inductor report their own fusion groups and cache results through
:func:`report_fusion` and :func:`report_cache`.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import re
import sys
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np

from neuron_prof.collectors._fusions import FusionRecord, Kernels, fused_nodes
from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.recording.api import Recorder, framework_prefixes
from neuron_prof.store.schema import Frame
from neuron_prof.recording.torchhooks import skip_frames, when_imported

__all__ = ["CompilerCollector", "report_fusion", "report_cache", "reason_class", "parse_graph_break", "compile_status"]

# (table name, counter group, counter) for torch._dynamo.utils.counters, per cache and result
_CACHE_COUNTERS = (
    ("fx_graph", "inductor", "fxgraph_cache_hit", "hit"),
    ("fx_graph", "inductor", "fxgraph_cache_miss", "miss"),
    ("fx_graph", "inductor", "fxgraph_cache_bypass", "bypass"),
    ("aot_autograd", "aot_autograd", "autograd_cache_hit", "hit"),
    ("aot_autograd", "aot_autograd", "autograd_cache_miss", "miss"),
    ("aot_autograd", "aot_autograd", "autograd_cache_bypass", "bypass"),
)

# dynamo_timed / chromium event names -> compile phase names (unknown names are kept as they are)
PHASE_NAMES = {
    "bytecode_tracing": "dynamo: bytecode tracing",
    "build_guards": "guards",
    "gc": "gc",
    "backend_compile": "backend compile",
    "create_aot_dispatcher_function": "aot autograd",
    "aot_collect_metadata": "aot autograd: collect metadata",
    "aot_trace_joint_graph": "aot autograd: trace joint graph",
    "compile_fx.<locals>.fw_compiler_base": "inductor: forward compiler",
    "compile_fx.<locals>.bw_compiler": "inductor: backward compiler",
    "_recursive_pre_grad_passes": "inductor: pre-grad passes",
    "_recursive_joint_graph_passes": "inductor: joint-graph passes",
    "_recursive_post_grad_passes": "inductor: post-grad passes",
    "inductor_compile": "inductor: compile_fx_inner",
    "fx_codegen_and_compile": "inductor: fx codegen and compile",
    "GraphLowering.run": "inductor: lowering",
    "Scheduler.__init__": "inductor: scheduling and fusion",
    "Scheduler.fused_nodes": "inductor: fused nodes",
    "GraphLowering.codegen": "inductor: codegen",
    "GraphLowering.compile_to_fn": "inductor: compile to module",
    "code_gen": "inductor: codegen",
    "Scheduler.codegen": "inductor: kernel codegen",
    "PythonWrapperCodegen.generate": "inductor: wrapper codegen",
    "compile_file": "inductor: C++ compile",
    "async_compile.wait": "inductor: wait for kernel compiles",
    "PyCodeCache.load_by_key_path": "inductor: load module",
    "additional_fake_tensor_prop": "inductor: fake tensor propagation",
    "insert_deferred_runtime_asserts": "dynamo: runtime asserts",
    "pgo.dynamic_whitelist": "dynamo: pgo",
    "entire_backward_compile": "backward compile",
    "AOTAutogradCache.inductor_load": "aot autograd cache: load",
    "inductor_codecache_torch_key": "inductor: cache key (torch hash)",
    "CacheBase.get_system.triton_key": "inductor: cache key (triton)",
    "TritonBundler.read_and_emit": "inductor: triton bundle load",
    "TritonBundler.collect": "inductor: triton bundle",
}
_RAW_TABLES = {  # kind of a filed hook record -> the table its parse feeds (what a lost one counts against)
    "timed": "compile_phases", "start": "compiles", "backend": "compiles", "metrics": "compiles",
    "break": "graph_breaks", "recompile": "recompiles", "fusion": "fusions",
}
_ROOTS = frozenset({"dynamo", "entire_frame_compile"})  # the compile itself, not a phase of it
_ATTEMPT = re.compile(r"^compile_attempt_(\d+)$")

_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_GB_LINK = re.compile(r"/gb/gb(\d+)\.html")
_REASON = re.compile(
    r"Graph Break Reason: (.*?)(?:\n\nStack variable source attribution:|\n\nUser code traceback:|\Z)", re.S)


# ---------------------------------------------------------------- public reporting functions
_ACTIVE: "CompilerCollector | None" = None


def wall_to_mono(wall_ns: int) -> int:
    """One of torch's wall-clock times (``time.time_ns()``: its compile events and metrics) on the
    monotonic clock of everything else, by the two clocks' offset read now, as torch reports it:
    an offset read once goes stale as the wall clock is slewed or stepped (NTP), by milliseconds
    over a long compile, which put compile spans into the steps after the compiling one."""
    return wall_ns + time.monotonic_ns() - time.time_ns()


def _current_compile_id() -> str:
    try:
        import torch._guards

        cid = torch._guards.CompileContext.current_compile_id()
        return "" if cid is None else str(cid)
    except Exception:  # a probe: no compile context on this thread is the answer "", nothing is lost
        return ""


def report_fusion(backend: str, kernel: str, nodes: list[str], compile_id: str = "") -> None:
    """Report one fusion group of a non-Inductor backend (e.g. ``neuron``) to the ``fusions`` table.

    ``kernel`` is the name of the generated kernel, ``nodes`` the names of the FX nodes (of the
    graph the backend was given) fused into it. ``compile_id`` defaults to the compile in progress
    on this thread (``torch._guards.CompileContext``), e.g. ``"0/1"``. A no-op unless a
    :class:`CompilerCollector` is installed; never raises.
    """
    col = _ACTIVE
    if col is None:
        return
    try:
        col._add_fusion(time.monotonic_ns(), compile_id or _current_compile_id(), str(backend), str(kernel),
                        [str(n) for n in nodes])
    except Exception as exc:  # noqa: BLE001 - a backend's report never raises
        col._guard.lost("fusions", exc)


def report_cache(cache: str, result: str, compile_id: str = "") -> None:
    """Report a compile-cache lookup of a non-Inductor backend to the ``compile_cache`` table.

    ``cache`` names the cache (e.g. ``"neuron_neff"``), ``result`` is ``"hit"``, ``"miss"`` or
    ``"bypass"``. ``compile_id`` defaults to the compile in progress on this thread. A no-op
    unless a :class:`CompilerCollector` is installed; never raises.
    """
    col = _ACTIVE
    if col is None:
        return
    try:
        col._add_cache(time.monotonic_ns(), compile_id or _current_compile_id(), str(cache), str(result))
    except Exception as exc:  # noqa: BLE001 - a backend's report never raises
        col._guard.lost("compile_cache", exc)


# ---------------------------------------------------------------- graph-break classification
# (gb_type prefix or regex, predicate on the whole reason text or None, class)
_CLASSES: list[tuple[re.Pattern, re.Pattern | None, str]] = [
    (re.compile(r"^Failed to trace builtin operator"), re.compile(r"builtin operator `print`"), "print"),
    (re.compile(r"^Failed to trace builtin operator"), None, "builtin operator"),
    (re.compile(r"Tensor\.item\(\)"), None, "Tensor.item()"),
    (re.compile(r"Tensor\.tolist\(\)"), None, "Tensor.tolist()"),
    (re.compile(r"^Attempted to call function marked as skipped"),
     re.compile(r"builtin `|C extension|C/C\+\+|cannot determine source file"), "skipped C function"),
    (re.compile(r"^Attempted to call function marked as skipped"), None, "skipped function"),
    (re.compile(r"^Attempted to inline function marked as skipped"), None, "skipped function"),
    (re.compile(r"tp_iternext|generator", re.I), re.compile(r"next\(\)|next\(generator\)|generator"),
     "generator next()"),
    (re.compile(r"numpy", re.I), None, "numpy"),
    (re.compile(r"torch\._dynamo\.graph_break\(\)"), None, "explicit graph_break()"),
    (re.compile(r"^Data-dependent branching|data.dependent branch", re.I), None, "data-dependent branch"),
    (re.compile(r"^Data dependent operator"), None, "data-dependent operator"),
    (re.compile(r"^Dynamic shape operator"), None, "dynamic-shape operator"),
    (re.compile(r"^Unsupported context manager|context manager", re.I), None, "context manager"),
    (re.compile(r"^Unsupported method call"), None, "unsupported method"),
    (re.compile(r"^Unsupported function call"), None, "unsupported function"),
    (re.compile(r"^Dynamo recompile limit exceeded"), None, "recompile limit"),
    (re.compile(r"^Unsupported Tensor\.backward"), None, "Tensor.backward()"),
    (re.compile(r"^Encountered non-tensor|non-Tensor output", re.I), None, "non-tensor output"),
]


def _gb_type_of(reason: str) -> str:
    """torch's ``gb_type``: the first line of the formatted graph-break message."""
    lines = reason.splitlines()
    # "Encountered graph break when attempting to trace CALL: ...:" "" "<gb_type>" "  Explanation:"
    for i, ln in enumerate(lines):
        if ln.startswith("  Explanation:") and i > 0:
            j = i - 1
            while j > 0 and not lines[j].strip():
                j -= 1
            return lines[j].strip()
    return lines[0].strip() if lines else ""


_BRANCH = re.compile(r"^\s*(if|elif|while|assert)\b")


def reason_class(reason: str, gb_type: str | None = None, source_line: str = "") -> str:
    """A short class for a graph-break reason: ``"print"``, ``"Tensor.item()"``, ``"numpy"``...

    ``source_line`` is the user's line of the break: an ``.item()`` (or ``.tolist()``) whose value
    feeds an ``if``/``elif``/``while``/``assert`` on that line is a ``"data-dependent branch"``
    (with ``capture_scalar_outputs=True`` dynamo would break at the branch instead). Unknown
    reasons give torch's graph-break type (its first line), cut to 80 characters.
    """
    gb_type = gb_type if gb_type is not None else _gb_type_of(reason)
    for pat, pred, cls in _CLASSES:
        if pat.search(gb_type) and (pred is None or pred.search(reason)):
            if cls in ("Tensor.item()", "Tensor.tolist()") and _BRANCH.match(source_line or ""):
                return "data-dependent branch"
            return cls
    text = gb_type or (reason.strip().splitlines() or [""])[0]
    return text[:80]


# ---------------------------------------------------------------- capture side: the hooks
_DUP_BREAK = re.compile(r"in user code at (.+):(\d+)\n")


def _signature_is(fn: Callable, params: list[str]) -> None:
    """Refuse to wrap a torch function whose parameters are not the ones the wrapper passes on."""
    got = list(inspect.signature(fn).parameters)
    if got != params:
        raise RuntimeError(f"torch changed {getattr(fn, '__qualname__', fn)}{tuple(got)}; "
                           f"neuron_prof expects {tuple(params)}")


class _Patches:
    """Attributes replaced by wrappers, put back in reverse order unless someone replaced ours."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, ours)

    def replace(self, owner: Any, name: str, ours: Any, original: Any = None) -> None:
        """``owner.name = ours``; ``original`` is what goes back (default: what is there now)."""
        if original is None:
            original = vars(owner)[name]
        skip_frames(getattr(ours, "__func__", ours))
        setattr(owner, name, ours)
        self._saved.append((owner, name, original, ours))

    def restore(self) -> None:
        while self._saved:
            owner, name, original, ours = self._saved.pop()
            if vars(owner).get(name) is ours:
                setattr(owner, name, original)


class _BreakHandler(logging.Handler):
    """On Dynamo's ``graph_breaks`` loggers: files the message away, never formats or raises."""

    def __init__(self, sink: "CompilerCollector") -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def handle(self, record: logging.LogRecord) -> bool:  # skip Handler's lock and filters
        try:
            self.sink._on_break(record)
        except Exception as exc:  # noqa: BLE001 - torch's logging call must go on
            self.sink._guard.lost("graph_breaks", exc)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it
        self.handle(record)


class CompilerCollector:
    """Collector (neuron_prof.recording.api) of ``torch.compile`` events.

    Tables: ``compiles``, ``compile_phases``, ``graph_breaks``, ``recompiles``, ``fusions``,
    ``compile_cache`` (see ``neuron_prof.store.schema``).

    ``fusions``: record Inductor's fusion decisions (the ``fusions`` table) from its kernel codegen.
    """

    name = "compiler"

    def __init__(self, fusions: bool = True) -> None:
        self.fusions = fusions
        self._on = False  # wrappers left behind by someone wrapping ours call straight through
        self._rec: Recorder | None = None
        self._patches = _Patches()
        self._cancels: list[Callable[[], None]] = []  # hooks still waiting for their module
        self._handler: _BreakHandler | None = None
        self._loggers: list[tuple[logging.Logger, int, bool] | tuple[logging.Logger, None, None]] = []
        self._fusion_record = FusionRecord()
        self._guard = HookGuard(self.name)  # what the hooks lost (capture health)
        self._tls = threading.local()  # .kernels: those of the graph being generated on this thread
        self._kernel_hook: Callable | None = None  # our wrapper of Inductor's per-kernel function
        self._hook_lock = threading.RLock()  # installing and removing hooks (imports may nest)
        self._raw: list[tuple] = []  # (kind, mono ns, tid, compile id, payload)
        self._reported: list[tuple] = []  # report_fusion / report_cache rows
        self._lock = threading.Lock()
        self._prefixes: tuple[str, ...] = ()
        self._counters: Any = None
        self._last_counts: tuple[int, ...] = ()
        # parse state kept across flushes (a compile may be in flight during a flush)
        self._open: dict[tuple[int, str], list[tuple[str, int]]] = {}  # (tid, cid) -> [(name, ts)]
        self._spans: dict[str, tuple[int, int]] = {}  # cid -> entire_frame_compile (ts, end)
        self._starts: dict[str, tuple[int, int, list]] = {}  # cid -> (ts, tid, caller frames)
        self._backends: dict[str, str] = {}  # cid -> backend name
        self._pending_recompiles: dict[str, list[tuple[int, str]]] = {}
        self._break_cids: set[str] = set()  # compiles that logged a graph break (skip vs. error)
        self._break_sites: dict[tuple[str, int], tuple[list[Frame], str]] = {}  # -> (stack, code)

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        global _ACTIVE
        try:
            self._rec = rec
            self._guard.attach(rec)
            self._prefixes = tuple(framework_prefixes())
            hooks: list[tuple[str, Callable[[Any], None]]] = [("torch._dynamo", self._hook_dynamo)]
            if self.fusions:
                hooks += [("torch._inductor.debug", self._hook_kernel_codegen),
                          ("torch._inductor.codegen.cpp", self._hook_kernel_codegen),
                          ("torch._inductor.codegen.triton", self._hook_kernel_codegen),
                          ("torch._inductor.compile_fx", self._hook_graph_codegen),
                          ("torch._inductor.codecache", self._hook_cache_hits)]
            self._on = True
            _ACTIVE = self
            for module, hook in hooks:
                if not self._on:  # a hook that ran at once failed
                    break
                self._cancels.append(when_imported(module, self._when_imported(hook)))
        except Exception as exc:  # noqa: BLE001 - training must never break
            rec.failure(self.name, exc)
            self._teardown()

    def window(self, on: bool) -> None:
        """Compiles are recorded whatever the window: nothing to do."""

    def flush(self, rec: Recorder, keep: bool) -> None:
        """Append everything captured since the last flush (``keep`` is ignored: compiles are rare)."""
        with self._lock:
            raw, self._raw = self._raw, []
            reported, self._reported = self._reported, []
        if not raw and not reported:
            return
        rows = _Rows()
        self._parse(raw, rows)
        for r in reported:
            (rows.fusions if r[0] == "fusion" else rows.cache).append(r[1:])
        rows.append_to(rec)

    def uninstall(self) -> None:
        self._teardown()

    # ---- the hooks
    def _when_imported(self, hook: Callable[[Any], None]) -> Callable[[Any], None]:
        """``hook(module)`` as a post-import callback: never raises into the user's import; a
        failure switches the whole collector off (every hook put back) and is recorded."""
        def run(module: Any) -> None:
            try:
                with self._hook_lock:
                    if self._on:
                        hook(module)
            except Exception as exc:  # noqa: BLE001 - the user's import must go on
                rec = self._rec
                self._teardown()
                if rec is not None:
                    rec.failure(self.name, exc)
        return run

    def _hook_dynamo(self, _dynamo: Any) -> None:
        self._hook_timed_events()
        self._hook_metrics()
        self._hook_recompiles()
        self._hook_graph_break_logs()

    def _hook_timed_events(self) -> None:
        """Dynamo's timed compile events (phases, compile spans), without torch's structured-log
        record of each (~3/4 of all records); torch's own bookkeeping still runs."""
        import torch._guards
        from torch._dynamo import utils as dynamo_utils

        cls = dynamo_utils.ChromiumEventLogger
        original = cls._log_timed_event
        _signature_is(original, ["self", "event_name", "time_ns", "phase", "metadata"])
        record_internal = dynamo_utils.record_chromium_event_internal
        current_trace_id = torch._guards.CompileContext.current_trace_id
        col = self

        def _log_timed_event(logger, event_name, time_ns, phase, metadata=None):
            if not col._on:
                return original(logger, event_name, time_ns, phase, metadata)
            event = {"name": event_name, "ts": time_ns / 1000, "args": metadata, "ph": phase,
                     "cat": "dynamo_timed", "tid": 0, "pid": 0}
            try:
                trace_id = current_trace_id()
                cid = str(trace_id.compile_id) if trace_id is not None and trace_id.compile_id else ""
                now, tid = time.monotonic_ns(), threading.get_native_id()
                begins = phase == "B" and event_name == "entire_frame_compile"
                stack = col._caller_stack() if begins else None  # before any put: all or nothing is filed
                col._put(("timed", wall_to_mono(time_ns), tid, cid, event))
                if begins:
                    col._put(("start", now, tid, cid, stack))
                elif phase == "B" and event_name == "backend_compile":
                    col._put(("backend", now, tid, cid, _backend_name()))
            except Exception as exc:  # noqa: BLE001 - torch's compile must go on
                col._guard.lost("compile_phases", exc)
            record_internal(event)
            return event

        self._patches.replace(cls, "_log_timed_event", _log_timed_event)

    def _hook_metrics(self) -> None:
        """torch hands every CompilationMetrics (forward and backward compiles) to this function."""
        from torch._dynamo import utils as dynamo_utils

        original = dynamo_utils.log_compilation_event
        _signature_is(original, ["metrics"])
        self._counters = dynamo_utils.counters
        self._last_counts = self._cache_counts()
        col = self

        def log_compilation_event(metrics):
            if col._on:
                try:
                    counts = col._cache_counts()
                    delta = tuple(b - a for a, b in zip(col._last_counts, counts))
                    col._last_counts = counts
                    start_us = getattr(metrics, "start_time_us", None)
                    start = wall_to_mono(int(start_us) * 1000) if start_us is not None else None
                    col._put(("metrics", time.monotonic_ns(), threading.get_native_id(),
                              str(getattr(metrics, "compile_id", "") or ""), (metrics, delta, start)))
                except Exception as exc:  # noqa: BLE001 - torch's compile must go on
                    col._guard.lost("compiles", exc)
            return original(metrics)

        self._patches.replace(dynamo_utils, "log_compilation_event", log_compilation_event)

    def _hook_recompiles(self) -> None:
        """Every failed guard of every cache entry, before Dynamo recompiles a frame."""
        from torch._dynamo import convert_frame

        original = convert_frame.get_and_maybe_log_recompilation_reasons
        _signature_is(original, ["cache_entries", "frame", "backend", "skip_logging"])
        col = self

        def get_and_maybe_log_recompilation_reasons(cache_entries, frame, backend, skip_logging=False):
            reasons = original(cache_entries, frame, backend, skip_logging)
            if col._on and not skip_logging:
                try:
                    col._put(("recompile", time.monotonic_ns(), threading.get_native_id(),
                              _current_compile_id(), [str(r) for r in reasons]))
                except Exception as exc:  # noqa: BLE001 - torch's compile must go on
                    col._guard.lost("recompiles", exc)
            return reasons

        self._patches.replace(convert_frame, "get_and_maybe_log_recompilation_reasons",
                              get_and_maybe_log_recompilation_reasons)

    def _hook_graph_break_logs(self) -> None:
        """Our handler on each ``graph_breaks`` artifact logger. One the user has not switched on
        (``TORCH_LOGS``) is enabled for us alone: DEBUG, and not propagating to torch's console
        handler while we hold it; one they did switch on keeps printing as before."""
        import torch._dynamo  # noqa: F401 - creates the loggers
        from torch._logging._internal import log_registry

        loggers = [logging.getLogger(q) for q in sorted(log_registry.artifact_log_qnames)]
        loggers = [lg for lg in loggers if getattr(lg, "artifact_name", None) == "graph_breaks"]
        if not loggers:
            raise RuntimeError("torch has no 'graph_breaks' artifact loggers")
        self._handler = _BreakHandler(self)
        for lg in loggers:
            if lg.isEnabledFor(logging.DEBUG):
                self._loggers.append((lg, None, None))
            else:
                self._loggers.append((lg, lg.level, lg.propagate))
                lg.propagate = False
                lg.setLevel(logging.DEBUG)
            lg.addHandler(self._handler)

    def _hook_kernel_codegen(self, module: Any) -> None:
        """Every kernel Inductor generates, with the scheduler nodes it covers (``debug`` defines
        the function; ``codegen.cpp``/``codegen.triton`` call a copy imported by name)."""
        import torch._inductor.debug as inductor_debug

        name = "set_kernel_post_grad_provenance_tracing"
        ours = self._kernel_hook
        if module is not inductor_debug:
            if ours is not None and vars(module).get(name) is ours:  # imported while we were in
                self._patches.replace(module, name, ours, original=ours.original)
            elif ours is not None:
                self._patches.replace(module, name, self._kernel_wrapper(vars(module)[name]))
            return
        original = vars(module)[name]
        _signature_is(original, ["node_schedule", "kernel_name", "is_extern"])
        self._kernel_hook = self._kernel_wrapper(original)
        self._patches.replace(module, name, self._kernel_hook)

    def _kernel_wrapper(self, original: Callable) -> Callable:
        import torch._inductor.debug as inductor_debug

        col = self

        def set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name, is_extern=False):
            out = original(node_schedule, kernel_name, is_extern)
            if col._on and kernel_name:
                try:
                    nodes = fused_nodes(node_schedule, is_extern, inductor_debug._pre_grad_graph_id)
                    col._put(("fusion", time.monotonic_ns(), threading.get_native_id(), _current_compile_id(),
                              (str(kernel_name), nodes)))
                    kernels = getattr(col._tls, "kernels", None)
                    if kernels is not None:
                        kernels.append((str(kernel_name), nodes))
                except Exception as exc:  # noqa: BLE001 - Inductor's codegen must go on
                    col._guard.lost("fusions", exc)
            return out

        set_kernel_post_grad_provenance_tracing.original = original  # type: ignore[attr-defined]
        return set_kernel_post_grad_provenance_tracing

    def _hook_graph_codegen(self, compile_fx: Any) -> None:
        """The kernels generated for one graph, kept by the graph's code key for cache hits."""
        original = compile_fx.fx_codegen_and_compile
        _signature_is(original, ["gm", "example_inputs", "inputs_to_check", "compile_region_name", "graph_kwargs"])
        col = self

        def fx_codegen_and_compile(gm, example_inputs, inputs_to_check, compile_region_name=None, **graph_kwargs):
            if not col._on:
                return original(gm, example_inputs, inputs_to_check, compile_region_name=compile_region_name,
                                **graph_kwargs)
            outer = getattr(col._tls, "kernels", None)
            col._tls.kernels = kernels = []
            try:
                out = original(gm, example_inputs, inputs_to_check, compile_region_name=compile_region_name,
                               **graph_kwargs)
            finally:
                col._tls.kernels = outer
            try:
                col._fusion_record.remember(getattr(out, "cache_key", None), kernels)
            except Exception as exc:  # noqa: BLE001 - the rows are filed; a later process's cache hit lacks them
                col._guard.lost("fusions", exc, n=0)
            return out

        self._patches.replace(compile_fx, "fx_codegen_and_compile", fx_codegen_and_compile)

    def _hook_cache_hits(self, codecache: Any) -> None:
        """A graph loaded from the FX-graph or AOT-autograd cache: its kernels from the record."""
        cache_hit = codecache.FxGraphCache.cache_hit_post_compile
        _signature_is(cache_hit, ["graph", "cache_info", "constants"])
        col = self

        def cache_hit_post_compile(graph, cache_info, constants):
            out = cache_hit(graph, cache_info, constants)
            if col._on:
                try:
                    kernels: Kernels = col._fusion_record.recall(getattr(graph, "cache_key", None))
                    now, tid, cid = time.monotonic_ns(), threading.get_native_id(), _current_compile_id()
                    for kernel in kernels:
                        col._put(("fusion", now, tid, cid, kernel))
                except Exception as exc:  # noqa: BLE001 - the cache hit must go on
                    col._guard.lost("fusions", exc)
            return out

        self._patches.replace(codecache.FxGraphCache, "cache_hit_post_compile", staticmethod(cache_hit_post_compile))

    # ---- what the hooks call
    def _put(self, item: tuple) -> None:
        with self._lock:
            self._raw.append(item)

    def _on_break(self, record: logging.LogRecord) -> None:
        if not self._on:
            return
        cid = _current_compile_id()
        now, tid = time.monotonic_ns(), threading.get_native_id()
        self._put(("backend", now, tid, cid, _backend_name()))
        self._put(("break", now, tid, cid, record.getMessage()))

    def _cache_counts(self) -> tuple[int, ...]:
        c = self._counters
        return tuple(int(c[group][name]) for _, group, name, _ in _CACHE_COUNTERS)

    def _caller_stack(self) -> list[Frame]:
        """The Python stack that called into the frame being compiled, innermost first.

        Walked on the compiling thread when the frame's compile begins: past this collector,
        torch's convert_frame/eval_frame and ``contextlib`` (``dynamo_timed`` is a context
        manager) to the first user frame, then user frames only.
        """
        f = sys._getframe(1)
        skip = self._prefixes + (contextlib.__file__,)
        while f is not None and f.f_code.co_filename.startswith(skip):
            f = f.f_back
        out: list[Frame] = []
        while f is not None and len(out) < 128:
            file = f.f_code.co_filename
            if not file.startswith(self._prefixes):
                out.append((file, f.f_code.co_name, int(f.f_lineno or 0)))
            f = f.f_back
        return out

    def _add_fusion(self, ts: int, cid: str, backend: str, kernel: str, nodes: list[str]) -> None:
        with self._lock:
            self._reported.append(("fusion", ts, cid, backend, kernel, nodes))

    def _add_cache(self, ts: int, cid: str, cache: str, result: str) -> None:
        with self._lock:
            self._reported.append(("cache", ts, cid, cache, result))

    def _teardown(self) -> None:
        global _ACTIVE
        self._on = False
        if _ACTIVE is self:
            _ACTIVE = None
        for cancel in self._cancels:
            cancel()
        self._cancels = []
        with self._hook_lock:
            try:
                self._patches.restore()
            except Exception as exc:  # noqa: BLE001 - a hook left in torch: the process is not as before
                self._teardown_failed(exc)
            self._kernel_hook = None
        for lg, level, propagate in self._loggers:
            try:
                lg.removeHandler(self._handler)
                if level is not None:
                    lg.setLevel(level)
                    lg.propagate = propagate
            except Exception as exc:  # noqa: BLE001 - a logger left as we set it
                self._teardown_failed(exc)
        self._loggers, self._handler = [], None
        self._guard.attach(None)

    def _teardown_failed(self, exc: BaseException) -> None:
        """Something of ours could not be put back: the collector's failure (the rest is still
        put back)."""
        if self._rec is not None:
            self._rec.failure(self.name, exc)

    # ---- parse side (flush)
    def _is_user(self, file: str) -> bool:
        return bool(file) and not file.startswith(self._prefixes)

    def _parse(self, raw: list[tuple], rows: "_Rows") -> None:
        for kind, ts, tid, cid, payload in raw:
            try:
                self._parse_one(kind, ts, tid, cid, payload, rows)
            except Exception as exc:  # noqa: BLE001 - one odd record must not lose the others
                self._guard.lost(_RAW_TABLES[kind], exc)

    def _parse_one(self, kind: str, ts: int, tid: int, cid: str, payload: Any, rows: "_Rows") -> None:
        if kind == "timed":
            self._timed(payload, ts, tid, cid, rows)
        elif kind == "start":
            self._starts[cid] = (ts, tid, payload)
        elif kind == "backend":
            if payload:
                self._backends[cid] = payload
        elif kind == "metrics":
            metrics, delta, start = payload
            for (cache, _, _, result), n in zip(_CACHE_COUNTERS, delta):
                rows.cache.extend([(ts, cid, cache, result)] * max(0, n))
            if getattr(metrics, "is_forward", True) is not False:  # backward compiles: phases only
                self._compile(metrics, start, ts, tid, cid, rows)
        elif kind == "break":
            self._graph_break(payload, ts, cid, rows)
        elif kind == "recompile":
            self._pending_recompiles.setdefault(cid, []).extend((ts, r) for r in payload)
        elif kind == "fusion":
            kernel, nodes = payload
            rows.fusions.append((ts, cid, "inductor", kernel, nodes))

    def _timed(self, ev: dict, t: int, tid: int, rec_cid: str, rows: "_Rows") -> None:
        """One of torch's timed events (``t``: its time on the monotonic clock)."""
        ph, name = ev.get("ph"), str(ev.get("name", ""))
        args = ev.get("args") or {}
        cid = str(args.get("compile_id") or rec_cid or "")
        if cid in ("", "None"):
            return
        key = (tid, cid)
        if ph == "B":
            self._open.setdefault(key, []).append((name, t))
        elif ph == "E":
            stack = self._open.get(key)
            if not stack:
                return
            # pop to the matching begin (torch fixes overlapping events the same way)
            idx = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == name), None)
            if idx is None:
                return
            _, t0 = stack[idx]
            del stack[idx:]
            if not stack:
                self._open.pop(key, None)
            if name == "entire_frame_compile":
                self._spans[cid] = (t0, t)
            if name in _ROOTS or _ATTEMPT.match(name):
                return
            depth = sum(1 for n, _ in stack if n not in _ROOTS and not _ATTEMPT.match(n))
            phase = PHASE_NAMES.get(name, name)
            if name == "entire_backward_compile":
                pass  # the lazy backward compile at the first backward(): outside the frame's compile
            elif args.get("is_backward") or any(n == "entire_backward_compile" for n, _ in stack):
                phase += " (backward)"
            elif not any(n == "entire_frame_compile" for n, _ in stack):
                phase += " (outside frame compile)"
            rows.phases.append((t0, max(0, t - t0), tid, cid, phase, depth))

    def _compile(self, cm: Any, start_ns: int | None, ts: int, tid: int, cid: str, rows: "_Rows") -> None:
        """``start_ns``: the metrics' start time on the monotonic clock, if they have one."""
        def get(key: str) -> Any:
            return getattr(cm, key, None)

        start = self._starts.pop(cid, None)
        span = self._spans.pop(cid, None)
        if span is not None:
            t0, dur = span[0], span[1] - span[0]
        elif start_ns is not None:
            t0 = start_ns
            dur = int(get("duration_us") or 0) * 1000
        else:
            t0, dur = ts, 0
        ctid = start[1] if start else tid
        ops = get("graph_op_count")
        broke = cid in self._break_cids
        self._break_cids.discard(cid)
        status, reason = compile_status(get("fail_type"), get("fail_reason"), ops, broke)
        func, file, line = str(get("co_name") or ""), str(get("co_filename") or ""), int(get("co_firstlineno") or 0)
        for rts, r in self._pending_recompiles.pop(cid, []):
            rows.recompiles.append((rts, cid, f"{func} ({file}:{line})", r))
        rows.compiles.append((
            t0, max(0, dur), ctid, cid, func, file, line, self._backends.pop(cid, ""), status, reason,
            int(ops or 0), int(get("guard_count") or 0), int(get("cache_size") or 0), start[2] if start else [],
        ))
        # a compile over: leftovers of its open spans (e.g. an exception mid-phase) go too
        for key in [k for k in self._open if k[1] == cid]:
            self._open.pop(key, None)

    def _graph_break(self, text: str, ts: int, cid: str, rows: "_Rows") -> None:
        gb_id, reason, frames, code, key = parse_graph_break(text)
        frames = [f for f in frames if self._is_user(f[0])]
        source_line = code.get(frames[0], "") if frames else ""
        if key is not None:
            if frames:
                self._break_sites.setdefault(key, (frames, source_line))
            else:  # a break Dynamo logged before, without its stack: the first one's
                frames, source_line = self._break_sites.get(key, ([(key[0], "", key[1])], ""))
        self._break_cids.add(cid)
        rows.breaks.append((ts, cid, gb_id, reason, reason_class(reason, source_line=source_line), frames))


def compile_status(fail_type: Any, fail_reason: Any, graph_ops: Any, broke: bool) -> tuple[str, str]:
    """A frame compile's ``status`` and failure ``reason`` from its CompilationMetrics fields;
    ``broke``: a graph break was logged in it."""
    if fail_type:
        # a graph break dynamo could not resume from skips the frame (it runs eagerly); the same
        # exception without a logged break (fullgraph=True, a backend error) reached the user
        status = "skipped" if broke and _is_skip(fail_type, fail_reason) else "failed"
    elif not graph_ops:
        status = "no graph"
    else:
        status = "ok"
    reason = f"{fail_type or ''}: {fail_reason or ''}".strip(": ") if fail_type or fail_reason else ""
    return status, reason


def parse_graph_break(text: str) -> tuple[str, str, list[Frame], dict[Frame, str], tuple[str, int] | None]:
    """Dynamo's graph-break text (the ``dynamo_graph_break_reason`` artifact): its GB id, reason,
    the user-code traceback's frames innermost first, each frame's source line as printed, and the
    break's site (file, line) from its first line (a repeated break is logged without its stack)."""
    user_part = text.split("\nTraceback (most recent call last):", 1)[0]
    m = _REASON.search(user_part)
    if m:
        reason = m.group(1).strip()
    else:  # the "cannot resume, frame skipped" form, or anything else: the first lines
        reason = user_part.strip()
    reason = re.sub(r"^Encountered graph break when attempting to trace [^\n]*:\n\n", "", reason)
    gb = _GB_LINK.search(reason)
    gb_id = f"GB{gb.group(1)}" if gb else ""
    # user stack: the "User code traceback:" section (outermost first), else any File lines
    tb = user_part.split("User code traceback:", 1)[1] if "User code traceback:" in user_part else user_part
    frames: list[Frame] = []
    code: dict[Frame, str] = {}
    lines = tb.splitlines()
    for i, ln in enumerate(lines):
        fm = _FILE_LINE.match(ln)
        if fm:
            f = (fm.group("file"), (fm.group("func") or "").strip(), int(fm.group("line")))
            frames.append(f)
            if i + 1 < len(lines) and not _FILE_LINE.match(lines[i + 1]):
                code[f] = lines[i + 1]
    site = _DUP_BREAK.search(user_part)
    return gb_id, reason, frames[::-1], code, (site.group(1), int(site.group(2))) if site else None


def _is_skip(fail_type: str, fail_reason: Any) -> bool:
    s = f"{fail_type} {fail_reason or ''}"
    return any(k in s for k in ("Skip", "skip", "Unsupported", "RecompileLimit", "recompile limit"))


def _backend_name() -> str:
    """Name of the backend of the compile in progress on this thread ("" if unknown)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        fn = getattr(getattr(tx, "output", None), "compiler_fn", None)
        if fn is None:
            return ""
        for attr in ("_compiler_name", "compiler_name", "__name__"):
            v = getattr(fn, attr, None)
            if isinstance(v, str) and v:
                return v
        return type(fn).__name__
    except Exception:  # a probe: no tracer on this thread (or a torch without one) is the answer ""
        return ""


class _Rows:
    """Parsed rows of one flush, turned into the Recorder's columns."""

    def __init__(self) -> None:
        self.compiles: list[tuple] = []
        self.phases: list[tuple] = []
        self.breaks: list[tuple] = []
        self.recompiles: list[tuple] = []
        self.fusions: list[tuple] = []
        self.cache: list[tuple] = []

    def append_to(self, rec: Recorder) -> None:
        s = rec.intern
        if self.compiles:
            c = list(zip(*self.compiles))
            rec.append("compiles", {
                "ts": np.array(c[0], np.int64), "dur": np.array(c[1], np.int64), "tid": np.array(c[2], np.int64),
                "compile_id": _ids(s, c[3]), "func": _ids(s, c[4]), "file": _ids(s, c[5]),
                "line": np.array(c[6], np.int32), "backend": _ids(s, c[7]), "status": _ids(s, c[8]),
                "fail_reason": _ids(s, c[9]), "graph_ops": np.array(c[10], np.int32),
                "guards": np.array(c[11], np.int32), "cache_size": np.array(c[12], np.int32),
                "stack": np.array([rec.intern_stack(f) if f else 0 for f in c[13]], np.int32),
            })
        if self.phases:
            c = list(zip(*self.phases))
            rec.append("compile_phases", {
                "ts": np.array(c[0], np.int64), "dur": np.array(c[1], np.int64), "tid": np.array(c[2], np.int64),
                "compile_id": _ids(s, c[3]), "phase": _ids(s, c[4]), "depth": np.array(c[5], np.int16),
            })
        if self.breaks:
            c = list(zip(*self.breaks))
            rec.append("graph_breaks", {
                "ts": np.array(c[0], np.int64), "compile_id": _ids(s, c[1]), "gb_id": _ids(s, c[2]),
                "reason": _ids(s, c[3]), "reason_class": _ids(s, c[4]),
                "stack": np.array([rec.intern_stack(f) if f else 0 for f in c[5]], np.int32),
            })
        if self.recompiles:
            c = list(zip(*self.recompiles))
            rec.append("recompiles", {
                "ts": np.array(c[0], np.int64), "compile_id": _ids(s, c[1]), "func": _ids(s, c[2]),
                "reason": _ids(s, c[3]),
            })
        if self.fusions:
            c = list(zip(*self.fusions))
            rec.append("fusions", {
                "ts": np.array(c[0], np.int64), "compile_id": _ids(s, c[1]), "backend": _ids(s, c[2]),
                "kernel": _ids(s, c[3]), "nodes": [[s(n) for n in nodes] for nodes in c[4]],
            })
        if self.cache:
            c = list(zip(*self.cache))
            rec.append("compile_cache", {
                "ts": np.array(c[0], np.int64), "compile_id": _ids(s, c[1]), "cache": _ids(s, c[2]),
                "result": _ids(s, c[3]),
            })


def _ids(intern, values: Iterable[str]) -> np.ndarray:
    return np.array([intern(v) for v in values], np.int32)
