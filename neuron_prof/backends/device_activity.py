"""What a device did, as PyTorch's profiler (Kineto) reports it, in the run's device tables.

Every backend reports its device's activity to Kineto: CUDA through CUPTI, a PrivateUse1 backend
through a ``libkineto::IActivityProfiler`` it registers (``REGISTER_PRIVATEUSE1_PROFILER``), XPU
through PTI. A capture's device collector runs Kineto for the device's activity types and saves
each session as torch.profiler saves a trace; an import reads a trace someone took with
torch.profiler. Both hand the trace's events here, so a captured run and an imported one hold the
same tables, read by the same analyses:

=====================================================  =============================================
Kineto activity                                        table (``neuron_prof.store.schema``)
=====================================================  =============================================
``kernel``                                             ``device_kernels``, and ``kernel_enqueues``:
                                                       the launches it ran (its correlation, or the
                                                       backend's ``queued ops``)
``gpu_memcpy``, ``gpu_memset``                          ``device_copies`` (direction from the name,
                                                       ``bytes``), with the host call that issued it
a runtime or driver call that launched a kernel        ``device_enqueues`` (id: its correlation)
(metadata ``op``, a kernel's correlation, or an
``ac2g`` flow to work that is not a copy)
a runtime call the host waited in (a ``...Synchronize``  ``queue_flushes`` and ``stream_syncs``
call, a synchronous ``cudaMemcpy``/``cudaMemset``, or
metadata ``wait reason``)
a runtime call with metadata ``cpu fallback``          ``fallbacks``
``...EventRecord`` / ``...StreamWaitEvent`` calls       ``event_enqueues`` (stream and event from its
                                                       metadata or its device activity's)
``gpu_user_annotation`` "Event Record", ``cuda_event``  ``event_completions``
``cuda_sync`` "Stream Wait Event" with ``stream idle``  ``stream_waits``
=====================================================  =============================================

What Kineto's types cannot carry travels as activity metadata (``METADATA``); a backend without it
still gets every row above but those extras. The host side of each row is its thread and time:
the host op and line it ran under are joined at read time (``neuron_prof.store.run``), as they are for an
imported trace, whose runtime calls name nothing else.

Times are the trace's (``ts``/``dur`` in microseconds with nanosecond decimals, read exactly) plus
``shift_ns``: a capture puts them on the run clock, an import keeps the trace's. A capture parses
its traces with orjson (:func:`read_kineto_json`), whose numbers are doubles: a time Kineto wrote
(three decimals) is exact through a double below ``EXACT_FLOAT_US``; a trace with a later time is
parsed again with decimals.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import orjson
import pandas as pd

METADATA = {
    "queued ops": "a kernel's: the correlation ids of the launches whose ops it ran (a fused kernel)",
    "op": "a launch's: the op it put on the device's queue",
    "queue depth": "a launch's: ops queued on its stream with it",
    "wait reason": "a host wait's: sync (the host needs a value), size (a full queue), fallback, "
                   "synchronize, stream_synchronize, event_synchronize, other",
    "ops waited for": "a host wait's: queued ops it waited for",
    "cpu fallback": "a host call's: the op the backend ran on the CPU instead",
    "bytes to host": "a CPU fallback's: input bytes copied off the device",
    "bytes from host": "a CPU fallback's: output bytes copied back",
    "stream idle": "a Stream Wait Event's: its span is the time the stream stood idle on the device",
}
"""Activity metadata (Kineto ``args``) a backend may add for what Kineto's activity types cannot
say, beside Kineto's own (``device``, ``stream``, ``correlation``, ``bytes``, ``event``,
``wait_on_cuda_event_id`` ...)."""

HOST_CATEGORIES = ("cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver", "xpu_runtime",
                   "xpu_driver", "mtia_runtime")
"""Kineto categories of a host thread's calls into a device runtime or driver."""
WORK_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MARK_CATEGORIES = ("gpu_user_annotation", "cuda_sync", "cuda_event")
DEVICE_CATEGORIES = HOST_CATEGORIES + WORK_CATEGORIES + MARK_CATEGORIES
_DEVICE_SET, _HOST_SET = frozenset(DEVICE_CATEGORIES), frozenset(HOST_CATEGORIES)  # one hash, not a scan
HOST_SIDE = ("cpu_op", "user_annotation", "python_function", "cpu_instant_event", "Trace", "ac2g", "fwdbwd",
             "overhead")
"""Categories that are no device activity (the host's ops, spans, flows): never counted as left out."""

WAIT_REASONS = ("sync", "size", "fallback", "synchronize", "other", "stream_synchronize", "event_synchronize")
_WAIT_CALLS = (  # a host call that returns once the device got this far: (name pattern, reason)
    (re.compile(r"(Device|Ctx|Context|Thread)Synchroni[sz]e$", re.I), "synchronize"),
    (re.compile(r"StreamSynchroni[sz]e$", re.I), "stream_synchronize"),
    (re.compile(r"EventSynchroni[sz]e$", re.I), "event_synchronize"),
    (re.compile(r"^(cuda|hip|cu|hsa)Memcpy(2D|3D)?(_v\d+)?$", re.I), "sync"),  # the synchronous copies
    (re.compile(r"^(cuda|hip)Memset(2D|3D)?$", re.I), "sync"),
)
_EVENT_RECORD = re.compile(r"EventRecord", re.I)
_STREAM_WAIT = re.compile(r"StreamWaitEvent", re.I)
_COPY_KIND = re.compile(r"^Memcpy\s+(\w+)")

ENQUEUE_COLUMNS = ["ts", "tid", "id", "device", "stream", "op", "queue_depth"]
KERNEL_COLUMNS = ["ts", "dur", "tid", "id", "device", "stream", "name", "n_ops"]
COPY_COLUMNS = ["ts", "dur", "device", "stream", "kind", "bytes", "name", "tid", "host_ts"]
WAIT_COLUMNS = ["ts", "dur", "tid", "device", "stream", "event", "reason", "ops"]
FALLBACK_COLUMNS = ["ts", "dur", "tid", "device", "op", "bytes_to_host", "bytes_from_host"]
EVENT_CALL_COLUMNS = ["ts", "tid", "device", "stream", "event", "kind"]
COMPLETION_COLUMNS = ["ts", "device", "stream", "event"]
STREAM_WAIT_COLUMNS = ["ts", "dur", "device", "stream", "event"]
HOST_CONTEXT = {"host_op": "", "module": "", "stack": 0, "bwd": False}
"""The host op, module, stack and pass of a row with a host side: not in a Kineto trace; the reader
joins them from the run's ops by thread and time."""


@dataclass
class DeviceTables:
    """A trace's device activity as rows of the run's device tables (strings not yet interned;
    ``with_host_context`` adds the columns the reader joins) and what it left out."""

    kernels: pd.DataFrame
    kernel_enqueues: pd.DataFrame
    enqueues: pd.DataFrame
    copies: pd.DataFrame
    waits: pd.DataFrame
    fallbacks: pd.DataFrame
    event_calls: pd.DataFrame
    completions: pd.DataFrame
    stream_waits: pd.DataFrame
    left_out: dict[str, int] = field(default_factory=dict)
    """What the trace held that no table takes, by what it is: one line each for the user."""

    def tables(self) -> dict[str, pd.DataFrame]:
        """Table name -> its rows, the host-side ones with the host context columns (empty)."""
        wait = self.waits
        return {
            "device_kernels": self.kernels, "kernel_enqueues": self.kernel_enqueues,
            "device_enqueues": with_host_context(self.enqueues), "device_copies": with_host_context(self.copies),
            "queue_flushes": with_host_context(wait.drop(columns=["stream", "event"])),
            "stream_syncs": with_host_context(wait), "fallbacks": with_host_context(self.fallbacks),
            "event_enqueues": with_host_context(self.event_calls), "event_completions": self.completions,
            "stream_waits": self.stream_waits}

    def __len__(self) -> int:
        return sum(len(df) for df in (self.kernels, self.enqueues, self.copies, self.waits, self.fallbacks,
                                      self.event_calls, self.completions, self.stream_waits))


def with_host_context(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the ``HOST_CONTEXT`` columns at their defaults."""
    return df.assign(**{c: np.full(len(df), v, dtype=object if isinstance(v, str) else type(v))
                        for c, v in HOST_CONTEXT.items()})


EXACT_FLOAT_US = float(1 << 43)
"""Below this many microseconds (~100 days) a double is within 0.49 ns of the three-decimal time
it was parsed from, so that time is recovered exactly (``trace_ns``)."""


class InexactTime(ValueError):
    """A time parsed as a double at or above ``EXACT_FLOAT_US``: its nanoseconds are not known
    exactly; the trace is parsed again with decimals (``read_kineto_json``)."""


def read_kineto_json(data: bytes, *, exact: bool = False) -> Any:
    """A saved Kineto trace's JSON, parsed with orjson (a fraction of ``json``'s time with
    ``parse_float=Decimal`` on a capture's traces), or, ``exact`` or where orjson refuses what
    ``json`` reads (``NaN``, an integer past 64 bits), with decimals: ``exact`` for a trace whose
    times raised :class:`InexactTime`."""
    if not exact:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data, parse_float=Decimal)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a trace is parsed and turned into tables: the
    hundreds of thousands of dicts and rows they make (none in a cycle, all freed by reference
    counts) would otherwise set off collections that walk every object of the training process."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def trace_ns(value: Any) -> int | None:
    """A trace's microseconds (``1234.567``, as Kineto writes them: ns decimals) as integer
    nanoseconds, exactly: a float would round the last digits of a timestamp away. A double (an
    orjson parse) is taken as a three-decimal time and recovered exactly below ``EXACT_FLOAT_US``;
    above, :class:`InexactTime`. None for anything that is no number."""
    kind = type(value)
    if kind is float:
        return _float_ns(value)
    if kind is int:
        return value * 1000
    if kind is Decimal:  # json's parse_float=Decimal: no str round trip
        return int((value * 1000).to_integral_value()) if value.is_finite() else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    try:
        d = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    if not d.is_finite():
        return None
    return int((d * 1000).to_integral_value())


def _float_ns(value: float) -> int | None:
    """A double's microseconds as the integer ns of the three-decimal time it was parsed from:
    its whole microseconds exactly, its fraction (exact too) times 1000 rounded; it is within
    0.49 ns of that time below ``EXACT_FLOAT_US``, so the rounding finds it."""
    if -EXACT_FLOAT_US < value < EXACT_FLOAT_US:
        whole = math.floor(value)
        return whole * 1000 + round((value - whole) * 1000)
    if math.isfinite(value):
        raise InexactTime(f"a time of {value!r} us is past what a double holds to the nanosecond")
    return None


def _int(value: Any, default: int = 0) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return n if -(1 << 62) <= n < (1 << 62) else default


def _ids(value: Any) -> list[int]:
    """A ``queued ops`` list of correlation ids (a list, or one id)."""
    if isinstance(value, list):
        return [i for i in (_int(v, 0) for v in value) if i > 0]
    one = _int(value, 0)
    return [one] if one > 0 else []


@functools.lru_cache(maxsize=4096)
def wait_reason(name: str) -> str | None:
    """Why a host call named ``name`` waited for the device, if it is a call that waits (cached:
    a trace repeats a few names thousands of times)."""
    for pattern, reason in _WAIT_CALLS:
        if pattern.search(name):
            return reason
    return None


@functools.lru_cache(maxsize=4096)
def _event_call(name: str) -> str | None:
    """``record`` or ``wait`` for a host call that records an event or makes a stream wait on
    one, None for any other (cached as ``wait_reason``)."""
    if _EVENT_RECORD.search(name):
        return "record"
    return "wait" if _STREAM_WAIT.search(name) else None


@dataclass(slots=True)
class _Activity:
    cat: str
    name: str
    ts: int
    dur: int
    pid: int
    tid: int
    args: Mapping[str, Any]
    correlation: int
    flow_start: bool


def _activities(events: Iterable[Mapping[str, Any]], shift_ns: int, left_out: dict[str, int],
                threads: Mapping[int, int]) -> list[_Activity]:
    """The trace's device activities (complete events of ``DEVICE_CATEGORIES``), with their
    correlation id (``args.correlation``, or the ``ac2g`` flow bound to them) and whether an
    ``ac2g`` flow starts at them; what else the trace holds is counted in ``left_out``. A host
    call's thread is renamed by ``threads`` where it names it."""
    flows: dict[tuple[Any, Any, int], tuple[int, bool]] = {}
    out: list[_Activity] = []
    for e in events:
        if type(e) is not dict and not isinstance(e, Mapping):  # a dict skips the slow ABC check
            continue
        get = e.get
        ph, cat = get("ph"), get("cat")
        if ph != "X":
            if (ph == "s" or ph == "f") and cat == "ac2g":
                ts = trace_ns(get("ts"))
                if ts is not None:
                    flows[(get("pid"), get("tid"), ts)] = (_int(get("id"), 0), ph == "s")
            continue
        if not isinstance(cat, str):
            continue
        if cat not in _DEVICE_SET:
            if cat not in HOST_SIDE:
                left_out[f"{cat} events (an activity kind neuron_prof does not read)"] = \
                    left_out.get(f"{cat} events (an activity kind neuron_prof does not read)", 0) + 1
            continue
        ts, dur = trace_ns(get("ts")), trace_ns(get("dur", 0))
        name = get("name")
        pid, tid = get("pid"), get("tid")
        if ts is None or dur is None or not isinstance(name, str) or not isinstance(pid, int) or not isinstance(tid, int):
            key = f"{cat} events without a name, a numeric pid and tid, or a time"
            left_out[key] = left_out.get(key, 0) + 1
            continue
        args = get("args")
        if type(args) is not dict and not isinstance(args, Mapping):
            args = {}
        if cat == "gpu_user_annotation":  # Kineto writes these 1 ns early and 2 ns long (to draw them)
            ts, dur = ts + 1, max(dur - 2, 0)
        out.append(_Activity(cat, name, ts + shift_ns, max(dur, 0), pid,
                             threads.get(tid, tid) if cat in _HOST_SET else tid, args,
                             _int(args.get("correlation"), 0), False))
    for a in out:  # flows name their slice by its track and start
        bound = flows.get((a.pid, a.tid, a.ts - shift_ns - (1 if a.cat == "gpu_user_annotation" else 0)))
        if bound is not None:
            if not a.correlation:
                a.correlation = bound[0]
            a.flow_start = bound[1]
    return out


def device_tables(events: Iterable[Mapping[str, Any]], *, label: Callable[[int], str], shift_ns: int = 0,
                  first_kernel_id: int = 1, threads: Mapping[int, int] | None = None) -> DeviceTables:
    """The device tables of a trace's ``events`` (its ``traceEvents``). ``label(index)``: a device
    index's name in the run (``"neuron:0"``; index -1: the device not known, the backend alone);
    ``shift_ns``: added to every time; kernel ids count from ``first_kernel_id`` (unique per rank:
    a capture continues where its last drain ended). ``threads``: OS thread ids by the id a host
    call's event may carry instead: a trace without CPU ops names CUDA's runtime calls by
    ``libkineto::threadId()`` (pthread_self's low 32 bits, CUPTI's thread id), which Kineto maps
    to OS tids only for threads it traced ops on."""
    left_out: dict[str, int] = {}
    acts = _activities(events, shift_ns, left_out, threads or {})
    work = [a for a in acts if a.cat in WORK_CATEGORIES]
    host = [a for a in acts if a.cat in HOST_CATEGORIES]
    marks = [a for a in acts if a.cat in MARK_CATEGORIES]
    # what each correlation id launched: a kernel, a copy, or a device mark (event record or wait)
    launched: dict[int, _Activity] = {}
    for a in work:
        if a.correlation:
            launched.setdefault(a.correlation, a)
    kernels = [a for a in work if a.cat == "kernel"]
    listed = [_ids(a.args.get("queued ops")) for a in kernels]  # read once: queued, links, n_ops
    ran = [ops or ([a.correlation] if a.correlation else []) for a, ops in zip(kernels, listed)]
    queued: set[int] = set().union(*ran)  # launches a kernel ran, its first and the ones it lists
    marked = {a.correlation: a for a in marks if a.correlation}
    devices = {a.pid for a in work}
    only = next(iter(devices)) if len(devices) == 1 else -1

    def device_of(a: _Activity, linked: _Activity | None = None) -> int:
        if "device" in a.args:
            return _int(a.args["device"], -1)
        return linked.pid if linked is not None else only

    kernel_ids = np.arange(first_kernel_id, first_kernel_id + len(kernels), dtype=np.int64)
    n_ran = np.array([len(r) for r in ran], np.int64)
    kernel_df = pd.DataFrame({
        "ts": np.array([a.ts for a in kernels], np.int64), "dur": np.array([a.dur for a in kernels], np.int64),
        "tid": np.zeros(len(kernels), np.int64), "id": kernel_ids,
        "device": np.array([label(_int(a.args.get("device"), a.pid)) for a in kernels], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), a.tid) for a in kernels], np.int32),
        "name": np.array([a.name for a in kernels], dtype=object),
        "n_ops": np.array([len(ops) or 1 for ops in listed], np.int32)},
        columns=KERNEL_COLUMNS)
    links = pd.DataFrame({"kernel": np.repeat(kernel_ids, n_ran),
                          "enqueue": np.fromiter(itertools.chain.from_iterable(ran), np.int64, int(n_ran.sum()))})

    enq, waits, fallbacks, event_calls, other = [], [], [], [], {}
    copy_host: dict[int, _Activity] = {}
    for a in host:
        target = launched.get(a.correlation) if a.correlation else None
        if "cpu fallback" in a.args:
            fallbacks.append(a)
        elif "wait reason" in a.args or wait_reason(a.name):
            waits.append(a)
        elif _event_call(a.name):
            event_calls.append(a)
        elif target is not None and target.cat != "kernel":
            copy_host[a.correlation] = a
        elif "op" in a.args or a.correlation in queued or (a.flow_start and target is None):
            enq.append(a)
        else:
            other[a.name] = other.get(a.name, 0) + 1
    if other:
        names = ", ".join(sorted(other, key=lambda n: -other[n])[:3])
        left_out[f"other runtime calls ({names}{', ...' if len(other) > 3 else ''})"] = sum(other.values())

    enq_work = [launched.get(a.correlation) if a.correlation else None for a in enq]
    enqueue_df = pd.DataFrame({
        "ts": np.array([a.ts for a in enq], np.int64), "tid": np.array([a.tid for a in enq], np.int64),
        "id": np.array([a.correlation for a in enq], np.int64),
        "device": np.array([label(device_of(a, w)) for a, w in zip(enq, enq_work)], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), w.tid if w else -1) for a, w in zip(enq, enq_work)],
                           np.int32),
        "op": np.array([str(a.args.get("op", a.name)) for a in enq], dtype=object),
        "queue_depth": np.array([_int(a.args.get("queue depth"), -1) for a in enq], np.int32)},
        columns=ENQUEUE_COLUMNS)

    copies = [a for a in work if a.cat != "kernel"]
    hosts = [copy_host.get(a.correlation) for a in copies]
    copy_df = pd.DataFrame({
        "ts": np.array([a.ts for a in copies], np.int64), "dur": np.array([a.dur for a in copies], np.int64),
        "device": np.array([label(_int(a.args.get("device"), a.pid)) for a in copies], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), a.tid) for a in copies], np.int32),
        "kind": np.array([_copy_kind(a) for a in copies], dtype=object),
        "bytes": np.array([_int(a.args.get("bytes"), -1) for a in copies], np.int64),
        "name": np.array([a.name for a in copies], dtype=object),
        "tid": np.array([h.tid if h else 0 for h in hosts], np.int64),
        "host_ts": np.array([h.ts if h else -1 for h in hosts], np.int64)}, columns=COPY_COLUMNS)

    wait_marks = [marked.get(a.correlation) for a in waits]
    wait_df = pd.DataFrame({
        "ts": np.array([a.ts for a in waits], np.int64), "dur": np.array([a.dur for a in waits], np.int64),
        "tid": np.array([a.tid for a in waits], np.int64),
        "device": np.array([label(device_of(a, m)) for a, m in zip(waits, wait_marks)], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), _int(m.args.get("stream"), -1) if m else -1)
                            for a, m in zip(waits, wait_marks)], np.int32),
        "event": np.array([_int(a.args.get("event"), 0) for a in waits], np.int64),
        "reason": np.array([_reason(a) for a in waits], dtype=object),
        "ops": np.array([_int(a.args.get("ops waited for"), 0) for a in waits], np.int32)}, columns=WAIT_COLUMNS)

    fallback_df = pd.DataFrame({
        "ts": np.array([a.ts for a in fallbacks], np.int64), "dur": np.array([a.dur for a in fallbacks], np.int64),
        "tid": np.array([a.tid for a in fallbacks], np.int64),
        "device": np.array([label(device_of(a)) for a in fallbacks], dtype=object),
        "op": np.array([str(a.args["cpu fallback"]) for a in fallbacks], dtype=object),
        "bytes_to_host": np.array([_int(a.args.get("bytes to host"), 0) for a in fallbacks], np.int64),
        "bytes_from_host": np.array([_int(a.args.get("bytes from host"), 0) for a in fallbacks], np.int64)},
        columns=FALLBACK_COLUMNS)

    call_marks = [marked.get(a.correlation) for a in event_calls]
    event_df = pd.DataFrame({
        "ts": np.array([a.ts for a in event_calls], np.int64), "tid": np.array([a.tid for a in event_calls], np.int64),
        "device": np.array([label(device_of(a, m)) for a, m in zip(event_calls, call_marks)], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), m.tid if m else -1) for a, m in zip(event_calls, call_marks)],
                           np.int32),
        "event": np.array([_int(a.args.get("event"), _mark_event(m)) for a, m in zip(event_calls, call_marks)],
                          np.int64),
        "kind": np.array([_event_call(a.name) for a in event_calls], dtype=object)},
        columns=EVENT_CALL_COLUMNS)

    done = [a for a in marks if (a.cat == "gpu_user_annotation" and a.name == "Event Record") or a.cat == "cuda_event"]
    completion_df = pd.DataFrame({
        "ts": np.array([a.ts for a in done], np.int64),
        "device": np.array([label(_int(a.args.get("device"), a.pid)) for a in done], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), a.tid) for a in done], np.int32),
        "event": np.array([_mark_event(a) for a in done], np.int64)}, columns=COMPLETION_COLUMNS)
    idle = [a for a in marks if a.cat == "cuda_sync" and a.name == "Stream Wait Event" and _int(a.args.get("stream idle"))]
    stream_wait_df = pd.DataFrame({
        "ts": np.array([a.ts for a in idle], np.int64), "dur": np.array([a.dur for a in idle], np.int64),
        "device": np.array([label(_int(a.args.get("device"), a.pid)) for a in idle], dtype=object),
        "stream": np.array([_int(a.args.get("stream"), a.tid) for a in idle], np.int32),
        "event": np.array([_mark_event(a) for a in idle], np.int64)}, columns=STREAM_WAIT_COLUMNS)
    annotations = sum(1 for a in marks if a.cat == "gpu_user_annotation" and a.name != "Event Record")
    if annotations:
        left_out["device ranges of user annotations (gpu_user_annotation: the host's ranges, drawn on the device)"] = \
            annotations
    return DeviceTables(kernel_df, links, enqueue_df, copy_df, wait_df, fallback_df, event_df, completion_df,
                        stream_wait_df, left_out)


def _copy_kind(a: _Activity) -> str:
    """A copy's direction as its name says (``Memcpy HtoD (Pinned -> Device)``), or ``memset``."""
    if a.cat == "gpu_memset":
        return "memset"
    m = _COPY_KIND.match(a.name)
    return m.group(1) if m else "unknown"


def _reason(a: _Activity) -> str:
    reason = a.args.get("wait reason")
    if isinstance(reason, str) and reason in WAIT_REASONS:
        return reason
    return wait_reason(a.name) or "other"


def _mark_event(a: _Activity | None) -> int:
    """The event a device mark names: the backend's ``event``, CUPTI's ``event_id`` or, for a
    stream's wait, ``wait_on_cuda_event_id``; 0 when none."""
    if a is None:
        return 0
    for key in ("event", "event_id", "wait_on_cuda_event_id"):
        if key in a.args:
            return _int(a.args[key], 0)
    return 0
