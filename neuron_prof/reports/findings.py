"""The headline findings of a run: one line each, most severe first, each naming where to look.

Computed from the run's summary (:func:`neuron_prof.reports.summary.build.summarize`, so every number is
the report's), shown at the top of ``neuron-prof report`` and as cards on the viewer's Overview
page.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Protocol

from neuron_prof.analysis.steps import SLOW_STEP
from neuron_prof.store.schema import went_on
from neuron_prof.store.schema import LEAK_CONFIRMED_BY, MEMORY_FIGURES
from neuron_prof.reports.summary.codec import ABSENT
from neuron_prof.reports.summary.sections import (CollectivesSection, DamagedFile, DetailCut, DeviceGap, DeviceSection,
                                          DumpCollective, DumpQueue, InFlight, MemoryLeak, MemorySection, Stall,
                                          StepStats, Straggler, StragglerSite, Summary, SyncSection)
from neuron_prof.units import format_bytes, format_count

SEVERITIES = ("high", "medium", "info")
PAGES = ("overview", "timeline", "device", "compile", "memory", "collectives", "ops", "compare")
FALLBACK_SHARE = 0.03
"""CPU fallbacks that cost this share of a steady step or more are a finding of their own (medium)."""
STALL_SHARE = 0.10
"""Host waits for the device of this share of a steady step or more are named by line (medium)."""
LAUNCH_SHARE = 0.30
"""Launch cost (at most) of this share of a device's busy time or more says fusing would pay (medium)."""


@dataclass(frozen=True)
class Finding:
    """One line of the findings: how severe (one of :data:`SEVERITIES`), the viewer page that
    shows it (one of :data:`PAGES`), and what was found."""
    severity: str
    page: str
    text: str


class Sited(Protocol):
    """A row that names a source line (a stall, kernel, memory peak, leak, peak site)."""
    source: str
    user_source: str


def findings(summary: Summary) -> list[Finding]:
    """The findings of a run's summary, most severe first."""
    out: list[Finding] = []

    def add(severity: str, page: str, text: str) -> None:
        out.append(Finding(severity, page, text))

    for d in summary.health.damage:  # first: every section below reads the run without what it lost
        add("high", "overview", damage_text(d))
    for dump in summary.dumps:
        where = ", ".join(f"thread {t.tid} at {t.source}" for t in dump.threads if t.source)
        waiting = "".join(f"; in flight: {dump_collective_text(c)}" for c in dump.collectives)
        routine = dump.reason in ("on demand", "signal SIGUSR1")
        add("info" if routine else "high", "overview",
            f"always-on dump on rank {dump.rank} in step {dump.last_step}: {dump.reason}"
            + (f"; {where}" if where else "") + waiting + f" ({detail_steps_text(dump.detail_steps)})")
    health = summary.health
    for f in health.failures:
        add("high", "overview", f"collector {f.collector} failed on rank {f.rank} and "
                                 + ("lost those events (counted as dropped)" if went_on(f.collector) else "was off")
                                 + f": {f.message}")
    memory = summary.memory if isinstance(summary.memory, MemorySection) else None
    for o in memory.ooms if memory else []:
        add("high", "memory", f"out of memory on rank {o.rank} {o.device} in step {o.step}: {o.message}")
    seen: set[tuple] = set()
    counted = counted_devices(memory) if memory else set()
    for x in memory.leaks if memory else []:
        key = (x.rank, x.device)
        if key in seen:
            continue
        seen.add(key)
        severity, pace = leak_cost(x.growth_per_step, device_peak(memory, x.rank, x.device))
        note = "; ".join(n for n in (pace, confirmation_text(x), LINES_NOTE if key in counted else "",
                                     process_note(x)) if n)
        add(severity, "memory", f"memory grows {format_bytes(x.growth_per_step)} per step on rank {x.rank} "
                                f"{x.device}{leak_where(x)}{keeper_text(x)}, confidence {x.confidence:.2f}"
                                + (f"; {note}" if note else ""))
    for cut in health.detail_cuts:
        add("medium", "overview", f"on rank {cut.rank}, {detail_cut_text(cut)}")
    for gap in health.device_gaps:
        add("medium", "device", device_gap_text(gap))
    colls = summary.collectives if isinstance(summary.collectives, CollectivesSection) else None
    if colls:
        for x in colls.in_flight:
            add("high", "collectives", in_flight_text(x))
        stuck = {(x.group, x.seq) for x in colls.in_flight}
        mism = [x for x in colls.mismatches if not (x.kind == "missing" and (x.group, x.seq) in stuck)]
        for x in mism[:3]:
            add("high", "collectives", f"collective mismatch: group {x.group} seq {x.seq}: {x.detail}"
                + (f" (and {len(mism) - 3} more)" if len(mism) > 3 and x is mism[2] else ""))
        for x in colls.stragglers:
            if x.steps:
                add("medium", "collectives", straggler_text(x))
    compiled = summary.compile
    if compiled.cache_limit_hit:
        add("high", "compile", "the recompile limit was hit: a frame fell back to eager for the rest of the run")
    if compiled.break_sites:
        first = compiled.break_sites[0]
        costs = [b.frame_ms_per_step for b in compiled.break_sites if b.frame_ms_per_step is not None]
        cost = f"cost {sum(costs):.2f} ms per steady step" if costs else "cost unknown (no steady captured step)"
        add("medium", "compile", f"{compiled.graph_breaks} graph break sites ({compiled.graph_break_events} breaks) "
                                 f"{cost}; first: {first.reason_class} at {first.source}")
    if compiled.recompiles:
        frame = compiled.recompiles_by_frame[0]
        add("medium", "compile", f"{compiled.recompiles} recompiles; most in {frame.func}: "
                                 f"{(frame.reasons or ['?'])[0]}")
    device = summary.device if isinstance(summary.device, DeviceSection) else None
    if device:
        _device_findings(device, summary.steps, add)
    sync = summary.sync_points
    if sync.by_source and sync.on_device and not (device and device.stalls):  # no device: nothing waited
        _sync_finding(sync, add)
    for st in summary.steps:
        if st.basis == "steady" and st.steady >= 4 and st.p90_ms > SLOW_STEP * st.median_ms:
            add("medium", "overview", f"step time varies on rank {st.rank}: p90 {st.p90_ms:.1f} ms vs "
                                      f"median {st.median_ms:.1f} ms over {st.steady} steady steps"
                                      + slow_steps_text(st.slow_steps, colls.stragglers if colls else []))
    for b in summary.step_breakdown:
        if (b.outside_ops_pct or 0) > 30:
            add("medium", "timeline", f"{b.outside_ops_pct:.0f}% of a step on rank {b.rank} runs outside "
                                      "any op (Python, data loading, waiting)")
    for dev in memory.devices if memory else []:
        p = dev.peak
        if p:
            add("info", "memory", f"peak memory {format_bytes(p.bytes)} on rank {dev.rank} {dev.device} in step "
                                  f"{p.step}, reached with {format_bytes(p.alloc_bytes)} from {p.op} at "
                                  f"{p.source or '?'}{called_from(p)}")
    if compiled.frames_compiled:
        inside = compiled.compile_in_steps_ms or 0.0
        add("info", "compile", f"torch.compile compiled {compiled.frames_compiled} frames in "
                               f"{compiled.compile_ms / 1e3:.2f} s"
            + (f", {inside / 1e3:.2f} s of it inside steps (warm-up steps, left out of step statistics)"
               if inside else "" if summary.steps else "; no step completed"))
    for x in summary.startup:
        add("info", "overview", f"start-up took {x.ms / 1e3:.2f} s on rank {x.rank} before step 0 (imports, "
                                "model and data set-up): shown apart, not a step")
    ops = summary.ops.top_by_self_time
    if ops:
        o = ops[0]
        add("info", "ops", f"top op {o.name}" + (f" in {o.module}" if o.module else "") +
            f": {o.self_pct:.0f}% of op self time")
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


def damage_text(d: DamagedFile) -> str:
    """A damaged file of a rank and the data it took with it."""
    return (f"{d.file} {d.what}: rank {d.rank}'s {format_bytes(d.bytes)} of tables ({', '.join(d.tables)}) cannot "
            "be read without it; restore it from a copy of the run, or re-record")


def lost_to_damage(summary: Summary, tables: Collection[str]) -> list[DamagedFile]:
    """The damage that took any of ``tables`` (a section's): why the section is empty, if it is."""
    return [d for d in summary.health.damage if set(d.tables) & set(tables)]


def _sync_finding(sync: SyncSection, add: Callable[[str, str, str], None]) -> None:
    """Sync points of a run on a device: a stall ("!") only where the device's activity showed the
    host waiting; reads of values the device had ready, or reads the device did not measure, are
    said as such. A run without a device gets none: its reads are the Sync points section's
    porting note."""
    stalls = None if sync.stalls is ABSENT else sync.stalls
    stalled = [x for x in sync.by_source if x.stalls is not ABSENT and x.stalls]
    site = stalled[0] if stalled else sync.by_source[0]
    rate = f"{site.per_step:.1f}/step" if site.per_step is not None else "one-off"
    where = f"most at {site.source or '?'} ({site.name}, {rate})"
    if stalls:
        add("medium", "timeline", f"{stalls} sync points where the host waited for the device (of {sync.events} "
                                  f"reads of device values); {where}")
    elif stalls is None:
        add("info", "timeline", f"{sync.events} reads of tensor values (.item(), a copy to the host ...): on an "
                                f"asynchronous device the host waits for the device there; {where}")
    else:
        add("info", "timeline", f"{sync.events} reads of device values, none waiting for the device (it had the "
                                f"values ready); {where}")


def _device_findings(device: DeviceSection, steps: list[StepStats], add: Callable[[str, str, str], None]) -> None:
    """What bounds the steps, where the host waits, what fell back to the CPU, whether fusing
    pays: from the report's Device section; shares are of the rank's median steady step."""
    median = {x.rank: x.median_ms for x in steps}
    for rank in sorted({v.rank for v in device.verdict}):
        kinds = [v for v in device.verdict if v.rank == rank]
        total = sum(v.steps for v in kinds)
        parts = "; ".join(f"{v.steps} {v.verdict} ({v.device} busy {v.busy_pct:.0f}%, the host waiting "
                          f"{v.wait_pct:.0f}%)" for v in kinds)
        host = sum(v.steps for v in kinds if v.verdict == "host-bound")
        add("medium" if 2 * host >= total else "info", "device",
            f"of {total} steady steps on rank {rank}: {parts}"
            + ("; host-bound: the device waits for the host to queue work" if host else ""))
    for rank, step_ms in sorted(median.items()):
        mine = [x for x in device.stalls if x.rank == rank and x.per_step_ms]
        wait = sum(x.per_step_ms for x in mine)
        if step_ms and mine and wait >= STALL_SHARE * step_ms:
            top = max(mine, key=lambda x: x.per_step_ms)
            kinds = {v.verdict: v.steps for v in device.verdict if v.rank == rank}
            bound = 2 * kinds.get("device-bound", 0) > sum(kinds.values())
            add("info" if bound else "medium", "device",
                f"the host waits {wait:.2f} ms per steady step for the device on rank {rank} "
                f"({100 * wait / step_ms:.0f}% of a step); most at {stall_site(top)}"
                f"{called_from(top)} ({top.host_op or '-'}, {top.reason}: {top.per_step_ms:.2f} ms per step)"
                + ("; the steps are device-bound, so this is the device's own time showing on the host: a faster "
                   "device side (fusion, compiling), not fewer syncs, shortens them" if bound else
                   "; the host could run ahead of the device there instead: move or drop the sync"))
    cov = {(c.rank, c.device): c for c in device.coverage}
    for rank, dev_name in sorted({(f.rank, f.device) for f in device.fallbacks}):
        rows = [f for f in device.fallbacks if (f.rank, f.device) == (rank, dev_name)]
        cost = sum(f.per_step_ms or 0 for f in rows)
        top, step_ms = rows[0], median.get(rank)
        share = cost / step_ms if step_ms else 0.0
        c = cov.get((rank, dev_name))
        native = f"; {c.coverage_pct:.1f}% of its ops ran natively" if c else ""
        add("medium" if share >= FALLBACK_SHARE else "info", "device",
            f"{sum(f.calls for f in rows)} ops ({len(rows)} kind{'s' if len(rows) > 1 else ''}) fell back from "
            f"{dev_name} to the CPU on rank {rank}, {cost:.2f} ms per steady step ({100 * share:.1f}% of a step); "
            f"most: {top.op} at {', '.join(top.sources[:2]) or '?'}, copying "
            f"{format_bytes(top.bytes_to_host)} to the host and {format_bytes(top.bytes_from_host)} back{native}")
    for f in device.fusion:
        if f.launch_pct >= 100 * LAUNCH_SHARE:
            run = next((u for u in device.unfused if u.device == f.device and u.rank == f.rank), None)
            where = f"; most at {run.source} ({run.kernels})" if run else ""
            add("medium", "device", f"launches cost up to {f.launch_pct:.0f}% of {f.device}'s busy time on rank "
                                    f"{f.rank}: {f.ops_per_kernel:.2f} ops per kernel, {f.one_op_pct:.0f}% of "
                                    f"kernels run one op{where}: fusing (torch.compile) would pay")


def steps_text(steps: list[int]) -> str:
    """``step 3``, ``steps 3 and 5``, ``steps 1, 3 and 5``."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    return "steps " + ", ".join(map(str, steps[:-1])) + f" and {steps[-1]}"


def ranks_text(ranks: list[int]) -> str:
    """Ranks as runs: ``0-255``, ``0, 2, 4-7``."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


SLOW_SHOWN = 6
"""Slow steps named by number in the "step time varies" finding; more are counted."""


def slow_steps_text(slow: list[int], stragglers: list[Straggler]) -> str:
    """The slow steps of a "step time varies" finding, and the significant straggler that explains
    them where one does (its finding comes first: the same severity, added before): ``; slow in
    steps 5, 10 and 15: the straggler above (rank 1)``."""
    if not slow:
        return ""
    named = steps_text(slow) if len(slow) <= SLOW_SHOWN else f"{len(slow)} steps ({steps_text(slow[:3])} first)"
    why = [(x.rank, sorted(set(slow) & set(x.steps))) for x in stragglers if set(slow) & set(x.steps)]
    if not why:
        return f"; slow in {named}"
    if len(why) == 1 and len(why[0][1]) == len(slow):
        return f"; slow in {named}: the straggler above (rank {why[0][0]})"
    return f"; slow in {named}; " + "; ".join(
        f"{steps_text(s) if len(s) <= SLOW_SHOWN else f'{len(s)} of them'}: the straggler above (rank {r})"
        for r, s in why)


def device_straggler_text(x: Straggler) -> str:
    """A significant straggler on device time (a ``device.stragglers`` row of the report): the rank
    whose device reached collectives last, when, and how long the others' kernels waited."""
    return (f"rank {x.rank} reached collectives last on the device in {steps_text(x.steps)} (others' kernels "
            f"waited {x.wait_in_steps_ns / 1e6:.3f} ms in those steps)")


def straggler_text(x: Straggler) -> str:
    """A significant straggler (a ``collectives.stragglers`` row of the report) in one sentence:
    who, how long the others waited for it, when, and at which collective."""
    at = ""
    if isinstance(x.where, StragglerSite):
        w = x.where
        line = w.user_source or w.source
        at = (f" ({w.op} of {format_bytes(w.bytes)}" + (f" from {line}" if line else "")
              + (", backward" if w.bwd else "") + ")")
    return (f"rank {x.rank} made the others wait {x.wait_in_steps_ns / 1e6:.0f} ms in "
            f"{steps_text(x.steps)}{at}")


def in_flight_text(x: InFlight) -> str:
    """A collective a rank issued and never completed (a ``collectives.in_flight`` row): still in
    flight when the capture ended (a hang), or failed (the group timed out or was aborted)."""
    what = f"{x.op} (group {x.group}, seq {x.seq})"
    missing = x.missing or []
    who = (f"; rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never arrived" if missing
           else "; every rank of the group arrived")
    if x.status == "in_flight":
        return f"rank {x.rank} was stuck in {what}{who}"
    return f"rank {x.rank}'s {what} failed{who}"


def detail_steps_text(steps: list[int]) -> str:
    """The sampled steps an always-on dump wrote whole: ``steps 13, 15, 17, 19 in detail``."""
    if not steps:
        return "no sampled step in detail"
    shown = ", ".join(map(str, steps[:8])) + (f", ... {steps[-1]}" if len(steps) > 8 else "")
    return f"step{'s' if len(steps) > 1 else ''} {shown} in detail"


def dump_collective_text(c: DumpCollective) -> str:
    """A collective in flight at an always-on dump: ``all_reduce (group 0, seq 4) for 3.1 s``."""
    return f"{c.op} (group {c.group}, seq {c.seq}) for {c.for_s:.1f} s"


def dump_queue_text(q: DumpQueue) -> str:
    """A device queue at an always-on dump, with how old what the device last reported is."""
    depth = f"{q.depth} op{'s' if q.depth != 1 else ''} queued"
    if q.depth_age_s is not None:
        depth += f" ({q.depth_age_s:.1f} s before the dump)"
    if q.flush_reason is None:
        return f"{q.device}: {depth}; no flush seen"
    return (f"{q.device}: {depth}; last flush: {q.flush_reason}, {q.flush_ops} ops, {q.flush_ms:.1f} ms wait, "
            f"{q.flush_age_s:.1f} s before the dump")


_LIMITS = {"max_bytes": ("disk budget", "--max-bytes (record) or profile(max_bytes=...)"),
           "max_events": ("event cap", "--max-events (record) or profile(max_events=...)")}


def detail_cut_text(cut: DetailCut) -> str:
    """Where a rank's budget ended detail capture (a ``health.detail_cuts`` row of the report), in
    one sentence that says what is missing and what to raise."""
    what, flag = _LIMITS[cut.by]  # one of the two: checked where the run is read
    limit = format_bytes(cut.limit) if cut.by == "max_bytes" else f"{cut.limit:,} events"
    when = f", {cut.t_s:.1f} s into the capture" if cut.t_s is not None else ""
    tables = ", ".join(t.replace("_", " ") for t in cut.tables) or "detail"
    return (f"detail stopped after step {cut.step}{when}, with {format_bytes(cut.bytes)} on disk ({what} "
            f"{limit}): {tables} of the {cut.later_steps} later steps were not captured (their step times and "
            f"per-step memory were); raise with {flag}")


def device_gap_text(gap: DeviceGap) -> str:
    """Steps of a capture without a device trace, and why (a ``health.device_gaps`` row): their
    device figures are unknown, so every device figure of the report leaves them out."""
    steps = f"step {gap.first_step}" if gap.first_step == gap.last_step else f"steps {gap.first_step}-{gap.last_step}"
    return f"rank {gap.rank}: no device trace in {steps} (device figures leave them out): {gap.reason}"


def stall_site(x: Stall) -> str:
    """Where the host waited (a ``device.stalls`` row): its line; else, in an op the capture or
    trace has no stack for (a torch.profiler trace recorded without ``with_stack=True``), that it
    has no line; else that no op was open."""
    return x.source or ("(no line recorded)" if x.host_op else "(outside any op)")


def user_line(x: Sited) -> str:
    """The user's own line that led to ``x.source`` (a site, peak or leak) when that is another
    line, i.e. the source is in a library; else ""."""
    user = x.user_source or ""
    return user if user != x.source else ""


def called_from(x: Sited) -> str:
    """``", called from LINE"`` with :func:`user_line`, or nothing."""
    return f", called from {user_line(x)}" if user_line(x) else ""


def leak_where(x: MemoryLeak) -> str:
    """Where a leak's blocks were made: the user's line in the step loop, the model's line that
    allocated after it (`` from train.py:40 via model.py:35 aten::relu``); without a loop line (a run
    without a keeper walk), the allocating line as before; "" without a line."""
    if x.made_at and x.made_at != x.source:
        return f" from {x.made_at} via {x.source} {x.op}" if x.source else f" from {x.made_at}"
    return f" from {x.source} ({x.op}){called_from(x)}" if x.source else ""


def keeper_text(x: MemoryLeak) -> str:
    """What keeps a leak's blocks alive (``MemoryLeak.keeper``), or why that is not known; "" for a
    leak without a site (a device read from its backend's counters)."""
    if x.keeper:
        graph = " (through the autograd graph of the tensors it holds)" if x.keeper_via == "autograd graph" else ""
        return f", kept alive by {x.keeper}{graph}"
    return f", keeper {x.keeper_note}" if x.keeper_note else ""


LINES_NOTE = ("its figures are the backend's counters: naming the lines needs the device's allocator to report to "
              "the profiler (c10::reportMemoryUsageToProfiler)")
"""Said of a leak on a device read from its backend's counters (no allocation seen, so no site)."""


def figures_text(figures_from: str, api: str) -> str:
    """Where a device's memory figures come from (``MemoryDevice.figures_from``, ``counters_api``),
    as the report and the viewer say it."""
    if figures_from == MEMORY_FIGURES[1]:
        return f"the backend's counters: totals only, no lines ({api})"
    return figures_from


def counted_devices(memory: MemorySection) -> set[tuple[int, str]]:
    """(rank, device) of the devices read from their backend's counters."""
    return {(d.rank, d.device) for d in memory.devices if d.figures_from == MEMORY_FIGURES[1]}


LEAK_HIGH_STEPS = 10_000
"""A leak that adds the device's peak again within this many steps is "!!": a run of that length
doubles what the device needs."""
LEAK_MEDIUM_STEPS = 1_000_000
"""... within this many, "!"; slower, "-": a run would need to be longer than most to feel it."""


def device_peak(memory: MemorySection, rank: int, device: str) -> int:
    """The most a device held between any two step boundaries (0: not known)."""
    return next((d.peak_between_boundaries for d in memory.devices if (d.rank, d.device) == (rank, device)), 0)


def leak_cost(growth_per_step: float, peak: int) -> tuple[str, str]:
    """How severe a leak is by what it costs, not by its kind: the steps it takes to add the
    device's peak (:func:`device_peak`: the most it held at once, the only capacity figure a run
    has) again, against :data:`LEAK_HIGH_STEPS` and :data:`LEAK_MEDIUM_STEPS`; and that pace in words."""
    if peak <= 0 or growth_per_step <= 0:
        return "high", ""
    steps = peak / growth_per_step
    severity = "high" if steps <= LEAK_HIGH_STEPS else "medium" if steps <= LEAK_MEDIUM_STEPS else "info"
    return severity, f"it adds the device's peak ({format_bytes(peak)}) again every {format_count(steps)} steps"


def confirmation_text(x: MemoryLeak) -> str:
    """What confirms a leak's growth (``MemoryLeak.confirmed_by``) or that nothing could."""
    if x.confirmed_by == LEAK_CONFIRMED_BY[1]:
        return ""  # the figures are the counters themselves (LINES_NOTE says so)
    if x.confirmed_by:
        return f"{x.confirmed_by} grows {format_bytes(x.allocator_growth_per_step or 0)} per step too"
    return "not confirmed: the device's allocator keeps no count of its own to check the growth against"


def process_note(x: MemoryLeak) -> str:
    """What the process's resident memory says about a leak (a row of ``RunAnalysis.memory_leaks``): the
    likely cause when it grows much faster than the leaking device's tracked bytes; when its growth
    was not judged (every step captured) and the leaking tensors were made with a grad_fn, what
    that may mean; else nothing."""
    if not x.process_outgrows:
        growth = x.process_growth_per_step
        if x.grad and (growth is None or growth != growth):  # NaN: the process was not judged
            return ("the leaking tensors were made with a grad_fn: if what is kept is the loss or output itself, "
                    "each keeps its whole autograd graph, far more host memory than its tensors (keep "
                    "`loss.item()` or `loss.detach()`; capture with --schedule to see the process's growth)")
        return ""
    rate = f"the process grows {format_bytes(x.process_growth_per_step)} per step"
    ratio = x.process_growth_per_step / max(x.growth_per_step, 1)
    if x.kept_graph:
        return (f"{rate}, {ratio:,.0f}x the tracked tensors: likely a kept autograd graph (the leaking tensors "
                "were made with a grad_fn, and a kept loss or output keeps every node of its graph: keep "
                "`loss.item()` or `loss.detach()`)")
    return (f"{rate}, {ratio:,.0f}x the tracked tensors: memory the allocators do not see grows too (Python "
            "objects, native libraries)")
