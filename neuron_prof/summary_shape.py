"""What a stored summary (``summary_store``) may hold: the shape of ``report.summarize``'s dict,
field by field, and the check that a document read back from a run has it.

A stored summary is a file of the run, so it is someone else's data like every other run file.
Its freshness key says which data it was computed from, but whoever made the run can write a key
that matches and any JSON beside it. The report, the findings and the viewer's pages index and
format the summary as ``summarize`` builds it (``f"{x['median_ms']:.1f}"``, ``format(n, "d")``,
``for v in d["verdict"]``), so a string where a number belongs, a missing key or a list where a
dict belongs would be a traceback, and a value in a place no consumer escapes would be shown as
given. So the stored dict is used only if it has exactly the keys and JSON types written here;
anything else is read as no stored summary and the summary is computed again.

Types: ``i`` an int (never a bool), ``f`` a number (int or float), ``s`` a string, ``b`` a bool,
``[x]`` a list of ``x``; alternatives joined by ``|``; a trailing ``?`` also allows null (what
``analysis.records`` makes of NaN). A key written ``~name`` may be absent. A field ``summarize``
adds must be added here too (tests/test_summary_store.py checks real runs' summaries against
this); until it is, stored summaries are not used, never misread.
"""
from __future__ import annotations

from typing import Any, Union

from neuron_prof.analysis.steps import PHASES, TIME_KINDS

__all__ = ["SHAPE", "conforms"]


class Rec:
    """A JSON object: every field of ``spec`` present (but those marked ``~``), no other key
    unless ``extra`` gives the type of the values of keys named by the run (compile phases)."""

    def __init__(self, spec: str = "", *, extra: str | None = None, **nested: "Shape | Maybe") -> None:
        self.fields: dict[str, Shape] = {}
        self.optional: set[str] = set()
        for token in spec.split():
            name, _, kind = token.partition(":")
            self._add(name, kind)
        for name, shape in nested.items():
            self._add(f"~{name}" if isinstance(shape, Maybe) else name,
                      shape.shape if isinstance(shape, Maybe) else shape)
        self.extra = extra

    def _add(self, name: str, shape: "Shape") -> None:
        if name.startswith("~"):
            name = name[1:]
            self.optional.add(name)
        self.fields[name] = shape

    def check(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        for name, shape in self.fields.items():
            if name in value:
                if not conforms(value[name], shape):
                    return False
            elif name not in self.optional:
                return False
        return all(name in self.fields or (self.extra is not None and conforms(v, self.extra))
                   for name, v in value.items())


class Maybe:
    """A nested field of a :class:`Rec` that may be absent (a device's peak, when no step was captured)."""

    def __init__(self, shape: "Shape") -> None:
        self.shape = shape


class OneOf:
    """Any of ``shapes`` (a section that is ``{"captured": False}`` when the run has none of it)."""

    def __init__(self, *shapes: "Shape") -> None:
        self.shapes = shapes


Shape = Union[str, list, Rec, OneOf]

_SCALARS = {
    "i": lambda v: type(v) is int,
    "f": lambda v: type(v) in (int, float),
    "s": lambda v: type(v) is str,
    "b": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def _kind(code: str, value: Any) -> bool:
    if code.startswith("["):
        return type(value) is list and all(_kind(code[1:-1], v) for v in value)
    return _SCALARS[code](value)


def conforms(value: Any, shape: Shape) -> bool:
    """Whether ``value`` (parsed JSON) has ``shape``: only what ``summarize`` could have made."""
    if isinstance(shape, str):
        codes = shape[:-1].split("|") + ["null"] if shape.endswith("?") else shape.split("|")
        return any(_kind(c, value) for c in codes)
    if isinstance(shape, list):
        return type(value) is list and all(conforms(v, shape[0]) for v in value)
    if isinstance(shape, OneOf):
        return any(conforms(value, s) for s in shape.shapes)
    return shape.check(value)


def _rows(spec: str, **nested: "Shape | Maybe") -> list:
    """A list of records (``analysis.records`` of a DataFrame)."""
    return [Rec(spec, **nested)]


_DEVICE = Rec(
    "captured:b basis:s basis_steps:i",
    thresholds=Rec("device_bound_busy_pct:f host_bound_busy_pct:f host_bound_wait_pct:f"),
    verdict=_rows("rank:i verdict:s device:s steps:i share:f step_ms:f busy_ms:f idle_ms:f wait_ms:f busy_pct:f "
                  "wait_pct:f"),
    steps=_rows("rank:i step:i device:s busy_pct:f wait_pct:f verdict:s ~warmup:b? ~steady:b? dur_ms:f busy_ms:f "
                "idle_ms:f wait_ms:f"),
    stalls=_rows("rank:i source:s user_source:s host_op:s reason:s device:s count:i total_ms:f in_steps:i "
                 "per_step_ms:f? mean_ms:f max_ms:f ops:i"),
    top_kernels=_rows("rank:i device:s name:s kernels:i ops:i total_ms:f per_step_ms:f? mean_us:f pct:f source:s "
                      "user_source:s"),
    fusion=_rows("rank:i device:s kernels:i ops:i ops_per_kernel:f one_op_kernels:i one_op_pct:f busy_ms:f "
                 "launch_floor_us:f launch_ms:f launch_pct:f"),
    unfused=_rows("rank:i device:s kernels:s source:s user_source:s last_source:s occurrences:i total_kernels:i "
                  "total_ms:f launch_ms:f per_step:f? first_step:i"),
    fallbacks=_rows("rank:i device:s op:s calls:i sources:[s] user_sources:[s] bytes_to_host:i bytes_from_host:i "
                    "total_ms:f in_steps:i per_step_ms:f? calls_per_step:f?"),
    coverage=_rows("rank:i device:s native_ops:i fallback_ops:i coverage_pct:f? fallback_op_kinds:i"),
)

_COMPILE = Rec(
    "frames_compiled:i compile_ms:f compile_in_steps_ms:f graph_breaks:i graph_break_events:i recompiles:i "
    "cache_limit_hit:b",
    break_sites=_rows("source:s reason_class:s reason:s gb_id:s breaks:i compile_ids:[s] hits:i hits_per_step:f? "
                      "frame_ms_per_step:f?"),
    recompiles_by_frame=_rows("func:s recompiles:i reasons:[s] cache_limit_hit:b"),
    # one column per top-level compile phase, named as the run names it
    compile_time=[Rec("compile_id:s func:s backend:s status:s graph_ops:i total_ms:f", extra="f?")],
    cache=_rows("cache:s hit:i miss:i bypass:i hit_rate:f?"),
    top_fusions=_rows("compile_id:s backend:s kernel:s fused:i nodes:[s]"),
    graph_runs=_rows("compile_id:s runs:i total_ms:f self_ms:f runs_per_step:f? self_ms_per_step:f?"),
)

_MEMORY = Rec(
    "captured:b",
    devices=_rows("rank:i device:s live_first:i live_last:i growth_per_step:f boundaries:i peak_between_boundaries:i",
                  peak=Maybe(Rec("step:i bytes:i op:s source:s user_source:s module:s alloc_bytes:i category:s")),
                  peak_by_category=Maybe(_rows("category:s bytes:i blocks:i")),
                  peak_sites=Maybe(_rows("source:s user_source:s module:s op:s category:s bytes:i blocks:i"))),
    process=_rows("rank:i boundaries:i first:i last:i judged:i growth_per_step:f?"),
    leaks=_rows("rank:i device:s growth_per_step:f steps_growing:i steps_checked:i confidence:f source:s "
                "user_source:s module:s op:s category:s grad:b bytes_per_step:i blocks_per_step:i steps_seen:i "
                "process_growth_per_step:f? process_outgrows:b kept_graph:b"),
    ooms=_rows("rank:i step:i device:s bytes:i message:s"),
)

_COLLECTIVES = Rec(
    "captured:b ranks:i collectives:i calls:i steady_steps:i median_step_ms:f threshold_ms:f?",
    status=Rec(extra="i"),
    groups=_rows("group:s desc:s backend:s size:i ranks:[i]"),
    by_op=_rows("group:s op:s collectives:i calls:i bytes:i time_ms_per_rank:f wait_ms_per_rank:f per_step:f?"),
    stragglers=_rows("rank:i times_last:i wait_caused_ns:i share:f? steps:[i] waited_ns:i wait_in_steps_ns:i",
                     where=OneOf(Rec(), Rec("group:s seq:i op:s bytes:i source:s user_source:s module:s bwd:b"))),
    straggler_steps=_rows("step:i rank:i wait_caused_ns:i significant:b threshold_ns:f"),
    mismatches=_rows("group:s seq:i kind:s ranks:[i] detail:s"),
    in_flight=_rows("rank:i group:s seq:i op:s bytes:i dtype:s status:s ts:i step:i source:s arrived:[i]? "
                    "missing:[i]?"),
    overlap=_rows("rank:i steps:i comm_ms:f overlapped_ms:f exposed_ms:f step_ms:f exposed_pct:f?"),
    bandwidth=_rows("group:s op:s group_size:i calls:i bytes:i transfer_ns:i algbw:f? busbw:f?"),
    clock=_rows("rank:i offset_start:i offset_end:i ts_start:i ts_end:i rtt:i same_clock:b measured:b"),
)

_HEALTH = Rec(
    "stale_rank_dirs:[s] missing_ranks:[i]",
    ranks=_rows("rank:i closed:b committed:b events_written:i events_dropped:i cap_reached_at_step:i? "
                "ignored_bytes:i failures:i"),
    detail_cuts=_rows("rank:i step:i bytes:i by:s limit:i tables:[s] later_steps:i t_s:f?"),
    failures=_rows("rank:i collector:s message:s"),
    conflicts=_rows("rank:i pid:i|f hostname:s? argv:[s] time_ns:f? holder_pid:f? live:b?"),
    command_exit=OneOf("null", Rec("~code:i ~signal:i")),
)

SHAPE: Shape = Rec(
    run=Rec("path:s command:s|[s]? torch_version:s? device:s? world_size:i? ranks:[i] start_time:s? "
            "step_numbering:s"),
    startup=_rows("rank:i ms:f"),
    steps=_rows("rank:i steps:i warmup:i steady:i captured:i compile_ms:f basis:s mean_ms:f median_ms:f p90_ms:f "
                "min_ms:f max_ms:f std_ms:f?"),
    warmup_steps=_rows("rank:i step:i step_ms:f compile_ms:f"),
    step_breakdown=_rows("rank:i steps:i step_ms:f " + " ".join(f"{p}_ms:f {p}_pct:f?" for p in PHASES)),
    time_split=_rows("rank:i steps:i step_ms:f " + " ".join(f"{k}_ms:f" for k in TIME_KINDS)),
    ops=Rec("captured_steps:i basis:s events:i compile_events:i",
            top_by_self_time=_rows("name:s module:s calls:i total_ms:f self_ms:f self_pct:f? mean_us:f backward:b "
                                   "~self_ms_per_step:f")),
    sync_points=Rec("events:i waits_measured:b",
                    by_source=_rows("source:s name:s kind:s count:i total_ms:f in_steps:i per_step:f? ~wait_ms:f? "
                                    "~wait_ms_per_step:f?")),
    device=OneOf(Rec("captured:b"), _DEVICE),
    compile=_COMPILE,
    memory=OneOf(Rec("captured:b"), _MEMORY),
    collectives=OneOf(Rec("captured:b ranks:i"), _COLLECTIVES),
    metrics=Maybe(_rows("rank:i name:s steps:i first:f? last:f? min:f? max:f? mean:f?")),
    dumps=Maybe(_rows("rank:i reason:s first_step:i last_step:i", threads=_rows("tid:i source:s stack:s"))),
    health=_HEALTH,
)
"""The whole summary, as ``report.summarize`` returns it."""
