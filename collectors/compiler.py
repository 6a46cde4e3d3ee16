"""The compiler collector: what ``torch.compile`` did, from torch's own structured trace.

Mechanism (DESIGN.md, "Mechanisms"): a ``logging.Handler`` on the structured trace logger
``torch._logging._internal.trace_log``. torch builds a structured record (metadata + payload)
only when that logger has a handler, so installing ours is what switches the records on; no
``TORCH_TRACE`` file is written (torch's own lazy file handler, when no trace dir is configured,
removes itself on the first record, as it would without us). Records used (torch 2.13):

================================================  =============================================
record                                            table(s)
================================================  =============================================
``dynamo_start`` (user stack, interned files)     ``compiles.stack``, ``tid``, ``recompiles.func``
``compilation_metrics``                           ``compiles`` (one row per frame compile)
``chromium_event`` (``dynamo_timed`` B/E pairs)   ``compile_phases``; ``compiles.ts/dur`` from
                                                  ``entire_frame_compile``
artifact ``dynamo_graph_break_reason``            ``graph_breaks``
artifact ``recompile_reasons``                    ``recompiles`` (one row per failed guard entry)
artifact ``inductor_provenance_tracking_node_``   ``fusions`` (kernel -> FX nodes, with
``mappings`` (``cppCodeToPost``, ``postToPre``)   ``trace.provenance_tracking_level=1``)
artifacts ``fx_graph_cache_{hit,miss,bypass}``,   ``compile_cache``
``fx_graph_bundled_cache_hit``,
``aotautograd_cache_{hit,miss,bypass}``
``str`` (torch's string interning)                file names of ``dynamo_start`` stacks
================================================  =============================================

Beyond the records: the backend's name is read off the tracer
(``InstructionTranslator.current_tx().output.compiler_fn``) while a graph is handed over, and the
Python stack that called into a compiled frame is walked in the handler at ``dynamo_start`` (the
record's own stack drops caller frames on some paths).

Columns worth knowing: ``compiles.status`` is ``ok``, ``no graph`` (nothing to compile),
``skipped`` (a graph break dynamo could not resume from: the frame runs eagerly) or ``failed``
(the error reached the user: backend error, ``fullgraph=True``...). ``compiles.stack`` is the
user's stack *calling into* the frame (innermost first, torch frames left out); the frame itself
is ``func/file/line`` (its ``def`` line). ``graph_breaks.reason`` is torch's message (graph-break
type, explanation, hints, GBxxxx link) without the internal traceback; ``reason_class`` is
:func:`reason_class` of it. ``compile_phases.depth`` is the nesting among phases (the compile
itself and ``compile_attempt_N`` are not phases), so the depth-0 phases of a frame lie inside its
``compiles`` span; the lazy backward compile (at the first ``backward()``) is ``backward compile``
with ``(backward)`` phases under it. ``fusions.nodes`` are the names of the nodes of the graph
dynamo handed to Inductor (pre-grad names via ``postToPre``; post-grad names where there is none,
e.g. nodes made by the joint graph); extern kernels (``extern_kernels.addmm``) are one-node rows.

Cost: compile time only. With a handler on ``trace_log`` torch builds every structured record
(graphs printed, guards, FX repro scripts...): about 3% of a cold Inductor compile and 10-20% of
an ``aot_eager`` compile here. Compiled code that runs without recompiling logs nothing.

The handler only files away the few records it needs (a tuple each); everything is parsed in
``flush``. All rows are kept whatever ``keep`` says: compiles are rare and usually happen in the
first, uncaptured steps. ``compile_id`` strings are torch's ``frame_id/frame_compile_id`` (with
``!<compiled_autograd_id>/`` in front under compiled autograd) without the ``_attempt`` suffix:
a compile that restarts (every graph break restarts tracing once) is one compile.

Backends other than Inductor report their own fusion groups and cache results through
:func:`report_fusion` and :func:`report_cache`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, Iterable

import numpy as np

from neuron_prof.recording import Frame, Recorder, framework_prefixes

__all__ = ["CompilerCollector", "report_fusion", "report_cache", "reason_class"]

# record names / artifact names the handler keeps; everything else is dropped at once
_KEEP = frozenset({"dynamo_start", "compilation_metrics", "chromium_event", "str", "dynamo_output_graph"})
_ARTIFACTS = frozenset({"dynamo_graph_break_reason", "recompile_reasons",
                        "inductor_provenance_tracking_node_mappings"})
_CACHE_ARTIFACT = re.compile(r"^(fx_graph_bundled|fx_graph|aotautograd)_cache_(hit|miss|bypass)$")
_CACHE_NAMES = {"fx_graph": "fx_graph", "fx_graph_bundled": "fx_graph", "aotautograd": "aot_autograd"}
_IDS = ("frame_id", "frame_compile_id", "attempt", "compiled_autograd_id", "has_payload", "rank",
        "stack", "subgraph_name")

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
_ROOTS = frozenset({"dynamo", "entire_frame_compile"})  # the compile itself, not a phase of it
_ATTEMPT = re.compile(r"^compile_attempt_(\d+)$")

_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_GB_LINK = re.compile(r"/gb/gb(\d+)\.html")
_REASON = re.compile(
    r"Graph Break Reason: (.*?)(?:\n\nStack variable source attribution:|\n\nUser code traceback:|\Z)", re.S)


# ---------------------------------------------------------------- public reporting functions
_ACTIVE: "CompilerCollector | None" = None


def _current_compile_id() -> str:
    try:
        import torch._guards

        cid = torch._guards.CompileContext.current_compile_id()
        return "" if cid is None else str(cid)
    except Exception:
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
    except Exception:
        pass


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
    except Exception:
        pass


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


# ---------------------------------------------------------------- stack helpers
def _cid(meta: dict) -> str:
    """torch's CompileId string (without attempt) from a record's metadata."""
    fid, fcid, ca = meta.get("frame_id"), meta.get("frame_compile_id"), meta.get("compiled_autograd_id")
    frame = f"{fid}/{fcid}" if fid is not None and fcid is not None else ""
    if ca is not None:
        return f"!{ca}/{frame}" if frame else f"!{ca}"
    return frame


class _Handler(logging.Handler):
    """Files away the structured records the collector needs; never raises, never parses."""

    def __init__(self, sink: "CompilerCollector") -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def handle(self, record: logging.LogRecord) -> bool:  # skip Handler's lock/filters: cheap
        try:
            meta = getattr(record, "metadata", None)
            if not isinstance(meta, dict):
                return False
            for key in meta:
                if key in _IDS:
                    continue
                if key == "artifact":
                    name = meta[key].get("name", "") if isinstance(meta[key], dict) else ""
                    if name in _ARTIFACTS:
                        if name == "dynamo_graph_break_reason":
                            self.sink._put(("backend", 0, 0, meta, _backend_name()))
                        self.sink._put((key + ":" + name, time.monotonic_ns(), threading.get_native_id(),
                                        meta, record.payload))
                    elif _CACHE_ARTIFACT.match(name):
                        self.sink._put(("cache:" + name, time.monotonic_ns(), threading.get_native_id(), meta, None))
                elif key in _KEEP:
                    self.sink._on_record(key, meta, record)
                return True
        except Exception:
            pass
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it
        self.handle(record)


class CompilerCollector:
    """Collector (neuron_prof.recording) of ``torch.compile`` events.

    Tables: ``compiles``, ``compile_phases``, ``graph_breaks``, ``recompiles``, ``fusions``,
    ``compile_cache`` (see ``neuron_prof.schema``).

    ``provenance``: turn on Inductor's provenance tracking (``trace.provenance_tracking_level=1``)
    while installed, for the ``fusions`` table (set at the first compile, restored at uninstall).
    """

    name = "compiler"

    def __init__(self, provenance: bool = True) -> None:
        self.provenance = provenance
        self._handler: _Handler | None = None
        self._raw: list[tuple] = []  # (kind, mono ns, tid, metadata, payload)
        self._reported: list[tuple] = []  # report_fusion / report_cache rows
        self._lock = threading.Lock()
        self._saved: dict[str, Any] = {}
        self._wall_to_mono = time.monotonic_ns() - time.time_ns()
        self._prefixes: tuple[str, ...] = ()
        self._strings: dict[int, str] = {}
        # parse state kept across flushes (a compile may be in flight during a flush)
        self._open: dict[tuple[int, str], list[tuple[str, int]]] = {}  # (tid, cid) -> [(name, ts)]
        self._spans: dict[str, tuple[int, int]] = {}  # cid -> entire_frame_compile (ts, end)
        self._starts: dict[str, tuple[int, int, list]] = {}  # cid -> (ts, tid, stack frames)
        self._backends: dict[str, str] = {}  # cid -> backend name
        self._pending_recompiles: dict[str, list[tuple[int, str]]] = {}
        self._break_cids: set[str] = set()  # compiles that logged a graph break (skip vs. error)
        self._provenance_set = False

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        global _ACTIVE
        try:
            from torch._logging._internal import trace_log

            self._wall_to_mono = time.monotonic_ns() - time.time_ns()
            self._prefixes = tuple(framework_prefixes())
            self._saved = {"level": trace_log.level, "disabled": trace_log.disabled,
                           "handlers": list(trace_log.handlers)}
            self._handler = _Handler(self)
            if trace_log.level == logging.NOTSET or trace_log.level > logging.DEBUG:
                trace_log.setLevel(logging.DEBUG)
            trace_log.disabled = False
            trace_log.addHandler(self._handler)
            self._hook_chromium_events()
            if self.provenance and "torch._inductor.config" in sys.modules:
                self._set_provenance()
            _ACTIVE = self
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

    def _hook_chromium_events(self) -> None:
        """Take Dynamo's timed compile events (the phases) straight from its chromium event
        logger instead of the structured log: they are ~3/4 of all structured records, and
        torch builds each record (JSON payload, md5, log record) once anyone listens, which
        costs more compile time than everything else here. Skipped if the method changed shape."""
        import inspect

        import torch._guards
        from torch._dynamo import utils as dynamo_utils

        cls = dynamo_utils.ChromiumEventLogger
        original = cls._log_timed_event
        if list(inspect.signature(original).parameters) != ["self", "event_name", "time_ns", "phase", "metadata"]:
            return
        put, record_internal = self._put, dynamo_utils.record_chromium_event_internal
        current_trace_id = torch._guards.CompileContext.current_trace_id

        def _log_timed_event(logger, event_name, time_ns, phase, metadata=None):  # torch's, minus the log
            event = {"name": event_name, "ts": time_ns / 1000, "args": metadata, "ph": phase,
                     "cat": "dynamo_timed", "tid": 0, "pid": 0}
            try:
                trace_id, meta = current_trace_id(), {}
                if trace_id is not None and trace_id.compile_id is not None:
                    cid = trace_id.compile_id
                    for key in ("compiled_autograd_id", "frame_id", "frame_compile_id"):
                        if getattr(cid, key, None) is not None:
                            meta[key] = getattr(cid, key)
                put(("chromium_event", time.monotonic_ns(), threading.get_native_id(), meta, event))
            except Exception:
                pass
            record_internal(event)
            return event

        self._saved["chromium"] = original
        cls._log_timed_event = _log_timed_event

    # ---- capture side
    def _on_record(self, key: str, meta: dict, record: logging.LogRecord) -> None:
        now, tid = time.monotonic_ns(), threading.get_native_id()
        if key == "str":
            s = meta.get("str")
            if isinstance(s, (tuple, list)) and len(s) == 2:
                self._strings[int(s[1])] = str(s[0])
            return
        if key == "dynamo_start":
            if self.provenance and not self._provenance_set:
                self._set_provenance()
            self._put((key, now, tid, meta, self._caller_stack()))
        elif key == "dynamo_output_graph":
            # the backend of this compile: read off the tracer (only reachable while compiling)
            self._put(("backend", now, tid, meta, _backend_name()))
        elif key == "chromium_event":
            self._put((key, now, tid, meta, record.payload))
        else:  # compilation_metrics
            self._put((key, now, tid, meta, None))

    def _put(self, item: tuple) -> None:
        with self._lock:
            self._raw.append(item)

    def _caller_stack(self) -> list[Frame]:
        """The Python stack that called into the frame being compiled, innermost first.

        Walked here (the handler runs on the compiling thread) rather than read off
        ``dynamo_start``, whose stack loses caller frames on some paths (skip counts vary).
        """
        try:
            f = sys._getframe(1)
            skip = self._prefixes + (os.path.dirname(logging.__file__),)
            while f is not None and f.f_code.co_filename.startswith(skip):
                f = f.f_back  # this handler, logging, torch's trace/convert_frame/eval_frame
            out: list[Frame] = []
            while f is not None and len(out) < 128:
                file = f.f_code.co_filename
                if not file.startswith(self._prefixes):
                    out.append((file, f.f_code.co_name, int(f.f_lineno or 0)))
                f = f.f_back
            return out
        except Exception:
            return []

    def _add_fusion(self, ts: int, cid: str, backend: str, kernel: str, nodes: list[str]) -> None:
        with self._lock:
            self._reported.append(("fusion", ts, cid, backend, kernel, nodes))

    def _add_cache(self, ts: int, cid: str, cache: str, result: str) -> None:
        with self._lock:
            self._reported.append(("cache", ts, cid, cache, result))

    def _set_provenance(self) -> None:
        try:
            import torch._inductor.config as inductor_config

            if inductor_config.trace.provenance_tracking_level == 0 and "provenance" not in self._saved:
                self._saved["provenance"] = 0
                inductor_config.trace.provenance_tracking_level = 1
            self._provenance_set = True
        except Exception:
            self._provenance_set = True  # do not try again on every compile

    def _teardown(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        saved, self._saved = self._saved, {}
        if "chromium" in saved:
            try:
                from torch._dynamo.utils import ChromiumEventLogger
                ChromiumEventLogger._log_timed_event = saved["chromium"]
            except Exception:
                pass
        try:
            from torch._logging._internal import trace_log

            if self._handler is not None:
                trace_log.removeHandler(self._handler)
            if "level" in saved:
                trace_log.setLevel(saved["level"])
                trace_log.disabled = saved["disabled"]
                for h in saved["handlers"]:  # torch's lazy trace handler may have removed itself
                    if h not in trace_log.handlers:
                        trace_log.addHandler(h)
        except Exception:
            pass
        finally:
            self._handler = None
        if "provenance" in saved:
            try:
                import torch._inductor.config as inductor_config

                if inductor_config.trace.provenance_tracking_level == 1:  # unless changed since
                    inductor_config.trace.provenance_tracking_level = saved["provenance"]
            except Exception:
                pass
        self._provenance_set = False

    # ---- parse side (flush)
    def _mono(self, wall_us: float) -> int:
        return int(round(wall_us * 1000.0)) + self._wall_to_mono

    def _filename(self, f: Any) -> str:
        if isinstance(f, str):
            return f
        try:
            i = int(f)
        except (TypeError, ValueError):
            return ""
        s = self._strings.get(i)
        if s is None:
            try:
                from torch._logging.structured import INTERN_TABLE

                self._strings.update({v: k for k, v in INTERN_TABLE.items()})
            except Exception:
                pass
            s = self._strings.get(i, "")
        return s

    def _is_user(self, file: str) -> bool:
        return bool(file) and not file.startswith(self._prefixes)

    def _parse(self, raw: list[tuple], rows: "_Rows") -> None:
        for kind, ts, tid, meta, payload in raw:
            try:
                self._parse_one(kind, ts, tid, meta, payload, rows)
            except Exception:
                continue  # one odd record must not lose the others

    def _parse_one(self, kind: str, ts: int, tid: int, meta: dict, payload: Any, rows: "_Rows") -> None:
        cid = _cid(meta)
        if kind == "chromium_event":
            self._chromium(payload if isinstance(payload, dict) else json.loads(payload), ts, tid, cid, rows)
        elif kind == "dynamo_start":
            frames = [(self._filename(f.get("filename")), str(f.get("name", "")), int(f.get("line") or 0))
                      for f in (meta["dynamo_start"] or {}).get("stack", [])]
            self._starts[cid] = (ts, tid, payload if payload else
                                 [f for f in reversed(frames[:-1]) if self._is_user(f[0])])
            func = ""
            if frames:
                file, name, line = frames[-1]
                func = f"{name} ({file}:{line})"
            for rts, reason in self._pending_recompiles.pop(cid, []):
                rows.recompiles.append((rts, cid, func, reason))
        elif kind == "backend":
            if payload:
                self._backends[cid] = payload
        elif kind == "compilation_metrics":
            self._compile(meta["compilation_metrics"] or {}, ts, tid, cid, rows)
        elif kind == "artifact:dynamo_graph_break_reason":
            self._graph_break(payload or "", ts, cid, rows)
        elif kind == "artifact:recompile_reasons":
            reasons = json.loads(payload) if payload and payload.lstrip().startswith(("[", '"')) else payload
            if isinstance(reasons, str):
                reasons = [reasons]
            for r in reasons or []:
                self._pending_recompiles.setdefault(cid, []).append((ts, str(r)))
        elif kind == "artifact:inductor_provenance_tracking_node_mappings":
            self._fusions(payload, ts, cid, rows)
        elif kind.startswith("cache:"):
            m = _CACHE_ARTIFACT.match(kind[len("cache:"):])
            if m:
                rows.cache.append((ts, cid, _CACHE_NAMES.get(m.group(1), m.group(1)), m.group(2)))

    def _chromium(self, ev: dict, ts: int, tid: int, rec_cid: str, rows: "_Rows") -> None:
        ph, name = ev.get("ph"), str(ev.get("name", ""))
        args = ev.get("args") or {}
        cid = str(args.get("compile_id") or rec_cid or "")
        if cid in ("", "None"):
            return
        t = self._mono(float(ev.get("ts", 0.0))) if "ts" in ev else ts
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

    def _compile(self, cm: dict, ts: int, tid: int, cid: str, rows: "_Rows") -> None:
        cid = str(cm.get("compile_id") or cid)
        start = self._starts.pop(cid, None)
        span = self._spans.pop(cid, None)
        if span is not None:
            t0, dur = span[0], span[1] - span[0]
        elif cm.get("start_time_us") is not None:
            t0 = self._mono(float(cm["start_time_us"]))
            dur = int(cm.get("duration_us") or 0) * 1000
        elif cm.get("start_time") is not None:
            t0 = self._mono(float(cm["start_time"]) * 1e6)
            dur = int(float(cm.get("entire_frame_compile_time_s") or 0.0) * 1e9)
        else:
            t0, dur = ts, 0
        ctid = start[1] if start else tid
        fail_type, fail_reason = cm.get("fail_type"), cm.get("fail_reason")
        ops = cm.get("graph_op_count")
        broke = cid in self._break_cids
        self._break_cids.discard(cid)
        if fail_type:
            # a graph break dynamo could not resume from skips the frame (it runs eagerly); the same
            # exception without a logged break (fullgraph=True, a backend error) reached the user
            status = "skipped" if broke and _is_skip(fail_type, fail_reason) else "failed"
        elif not ops:
            status = "no graph"
        else:
            status = "ok"
        reason = ""
        if fail_type or fail_reason:
            reason = f"{fail_type or ''}: {fail_reason or ''}".strip(": ")
        callers = start[2] if start else []
        rows.compiles.append((
            t0, max(0, dur), ctid, cid, str(cm.get("co_name") or ""), str(cm.get("co_filename") or ""),
            int(cm.get("co_firstlineno") or 0), self._backends.pop(cid, ""), status, reason,
            int(ops or 0), int(cm.get("guard_count") or 0), int(cm.get("cache_size") or 0), callers,
        ))
        # a compile over: leftovers of its open spans (e.g. an exception mid-phase) go too
        for key in [k for k in self._open if k[1] == cid]:
            self._open.pop(key, None)

    def _graph_break(self, text: str, ts: int, cid: str, rows: "_Rows") -> None:
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
        code: dict[Frame, str] = {}  # frame -> its source line, as the traceback prints it
        lines = tb.splitlines()
        for i, ln in enumerate(lines):
            fm = _FILE_LINE.match(ln)
            if fm:
                f = (fm.group("file"), (fm.group("func") or "").strip(), int(fm.group("line")))
                frames.append(f)
                if i + 1 < len(lines) and not _FILE_LINE.match(lines[i + 1]):
                    code[f] = lines[i + 1]
        frames = [f for f in reversed(frames) if self._is_user(f[0])]
        if not frames:
            lm = re.search(r"Graph break in user code at (.+):(\d+)", user_part)
            if lm:
                frames = [(lm.group(1), "", int(lm.group(2)))]
        self._break_cids.add(cid)
        source_line = code.get(frames[0], "") if frames else ""
        rows.breaks.append((ts, cid, gb_id, reason, reason_class(reason, source_line=source_line), frames))

    def _fusions(self, payload: Any, ts: int, cid: str, rows: "_Rows") -> None:
        if not payload:
            return
        data = json.loads(payload) if isinstance(payload, str) else payload
        if not isinstance(data, dict):
            return
        post_to_pre = data.get("postToPre") or {}
        kernels: dict[str, list[str]] = {}
        for key in ("cppCodeToPost", "tritonCodeToPost"):
            for kernel, post_nodes in (data.get(key) or {}).items():
                name = re.sub(r":\d+$", "", str(kernel))
                nodes = kernels.setdefault(name, [])
                for post in post_nodes or []:
                    for n in (post_to_pre.get(post) or [post]):
                        if n not in nodes:
                            nodes.append(str(n))
        for kernel, nodes in kernels.items():
            rows.fusions.append((ts, cid, "inductor", kernel, nodes))


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
    except Exception:
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
