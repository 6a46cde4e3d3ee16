"""``render_text(Summary) -> str``: the summary as ``neuron-prof report`` prints it.

Fixed-width tables and one-line facts, section by section, findings first. Long lists show their
largest rows (``--json`` has them all), so a run of thousands of ranks still reads in a terminal.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Callable, Sequence, TypeVar

from neuron_prof.analysis import device as dev
from neuron_prof.analysis.memory import LEAK_MIN_STEPS
from neuron_prof.analysis.steps import PHASES, TIME_KINDS
from neuron_prof.analysis.stragglers import SHARE
from neuron_prof.reports.findings import (LINES_NOTE, Sited, called_from, confirmation_text, device_peak, leak_cost, counted_devices, damage_text, detail_cut_text,
                                  detail_steps_text, device_gap_text, device_straggler_text, dump_collective_text,
                                  dump_queue_text, figures_text, findings, in_flight_text, process_note, ranks_text,
                                  lost_to_damage, stall_site, steps_text, straggler_text, user_line)
from neuron_prof.store.reader import describe_exit
from neuron_prof.reports.table import aligned
from neuron_prof.reports.summary.codec import ABSENT, to_json
from neuron_prof.reports.summary.sections import (ClockOffset, CollectivesSection, CompileSection, DeviceSection, Dump,
                                          EfficiencySection, MemorySection, MetricSummary,
                                          CollectivesNotCaptured, Summary)
from neuron_prof.units import format_bytes

__all__ = ["render_text", "STEPS_SHOWN", "GROUPS_SHOWN", "ROWS_SHOWN"]

STEPS_SHOWN = 12
"""Steps listed in the Device section's text (the --json lists every complete step)."""
GROUPS_SHOWN = 4
ROWS_SHOWN = 12
"""A run of thousands of ranks has as many groups: the text shows the largest rows, --json all."""
_MARKS = {"high": "!!", "medium": "! ", "info": "- "}  # a finding's severity, as its line begins

R = TypeVar("R")
Column = tuple[str, str, Callable[[Any], Any]]
"""A table column: header, format (``""``: the value as text, left-aligned) and the row's cell."""


def _render_precision(summary: Summary, basis: str) -> list[str]:
    """Precision mix and the ops autocast left in fp32; activation checkpointing's re-runs."""
    out: list[str] = []
    p = summary.precision
    if p.mix and any(m.precision in ("bf16", "fp16") for m in p.mix):
        what = "device time" if p.time == "device" else "op self time"
        out += ["", f"Precision ({what} per {basis} step, by the dtype each op computed in; "
                    "cast: casts and copies)"]
        out += _table(p.mix, [("rank", "d", lambda x: x.rank), ("precision", "", lambda x: x.precision),
                              ("ms/step", ".3f", lambda x: x.ms_per_step), ("%", ".1f", lambda x: x.pct)])
        if p.left_in_fp32:
            out += ["", "  Forward ops autocast left in fp32 (costliest)"]
            out += ["  " + line for line in _table(p.left_in_fp32, [
                ("op", "", lambda x: x.name), ("module", "", lambda x: x.module or "-"),
                ("calls", "d", lambda x: x.calls), ("ms/step", ".3f", lambda x: x.ms_per_step),
                ("%", ".1f", lambda x: x.pct), ("called at", "", lambda x: ", ".join(x.user_sources[:2]))])]
    if summary.recompute:
        out += ["", f"Recomputed by activation checkpointing (forward ops re-run in the backward pass; "
                    f"self time per {basis} step)"]
        out += _table(summary.recompute, [
            ("rank", "d", lambda x: x.rank), ("checkpointed module", "", lambda x: x.module or "-"),
            ("re-runs", "d", lambda x: x.reruns), ("ops", "d", lambda x: x.ops),
            ("ms/step", ".3f", lambda x: x.ms_per_step), ("% of backward", ".1f", lambda x: x.pct_of_backward),
            ("called at", "", lambda x: ", ".join(x.user_sources[:2]))])
    return out


def _count(n: float | None) -> str | None:
    """A FLOP or byte count with an SI prefix, three digits: ``88.1 M``; None stays missing."""
    if n is None:
        return None
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n:.3g}"


def _roofline_columns(first: Column) -> list[Column]:
    """The columns an op's and a kernel's roofline rows share, after their name."""
    return [first, ("FLOP/step", "", lambda x: _count(x.flops_per_step)),
            ("bytes/step", "", lambda x: _count(x.bytes_per_step)), ("ms/step", ".3f", lambda x: x.ms_per_step),
            ("TFLOP/s", ".3g", lambda x: x.tflops), ("FLOP/byte", ".3g", lambda x: x.intensity),
            ("bound", "", lambda x: x.bound or "-"), ("% of roof", ".1f", lambda x: x.roof_pct)]


def _render_efficiency(e: EfficiencySection, basis: str) -> list[str]:
    """FLOPs per step, achieved FLOP/s and MFU per rank; per op name and device kernel the roofline
    figures; the ops whose FLOPs are not in them."""
    if not e.ranks:
        return []
    p = e.peak
    if p.tflops or p.gbps:
        figures = ", ".join(f"{v:.4g} {unit}" for v, unit in ((p.tflops, "TFLOP/s"), (p.gbps, "GB/s")) if v)
        peak = f"peak {figures} ({p.source})"
    else:
        peak = ("MFU unknown: no peak known (--peak-tflops, --peak-gbps, --peak-device or, on the CPU, --calibrate "
                "give one)")
    out = ["", f"FLOPs and MFU (per {basis} step: forward and backward FLOPs as torch's FlopCounterMode counts them; "
               f"{peak})"]
    out += _table(e.ranks, [("rank", "", lambda x: x.rank), ("FLOP/step", "", lambda x: _count(x.flops_per_step)),
                            ("step ms", ".2f", lambda x: x.step_ms), ("achieved TFLOP/s", ".3g", lambda x: x.tflops),
                            ("MFU %", ".2f", lambda x: x.mfu_pct)])
    if e.ops:
        out.append("  Ops by FLOPs (time: the op's run time; bound and % of roof against the peaks' roofline)")
        out += _table(_most(e.ops, lambda x: x.flops_per_step), [
            ("rank", "", lambda x: x.rank), *_roofline_columns(("op", "", lambda x: x.name)),
            ("calls/step", ".1f", lambda x: x.calls_per_step)])
    if e.kernels:
        out.append("  Device kernels by FLOPs (of the ops each ran; time: device time)")
        out += _table(_most(e.kernels, lambda x: x.flops_per_step), [
            ("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device),
            *_roofline_columns(("kernel", "", lambda x: x.name)),
            ("kernels/step", ".1f", lambda x: x.kernels_per_step)])
    for u in e.unknown[:ROWS_SHOWN]:
        out.append(f"  !  FLOPs left out: rank {u.rank} {u.name} ({u.calls_per_step:g} per step): {u.reason}")
    if len(e.unknown) > ROWS_SHOWN:
        out.append(f"  ({_more(e.unknown).lstrip('; ')})")
    if not any(x.flops_per_step for x in e.ranks) and not e.unknown:
        out.append("  no op with a FLOP formula ran (matmuls, convolutions, attention)")
    return out


def _table(rows: Sequence[R], cols: list[Column]) -> list[str]:
    """``rows`` as a fixed-width table (``table.aligned``): a missing number reads ``-``, missing text
    nothing; numbers right-aligned but in the first and last columns."""
    cells = [[h for h, _, _ in cols]]
    for r in rows:
        line = []
        for _, f, cell in cols:
            v = cell(r)
            line.append("-" if v is None and f else format(v, f) if f else str(v if v is not None else ""))
        cells.append(line)
    numbers = {i for i, (_, f, _) in enumerate(cols) if f and i not in (0, len(cols) - 1)}  # the ends: left
    return aligned(cells[0], cells[1:], right=numbers, indent="  ")


def _most(rows: list[R], key: Callable[[R], float]) -> list[R]:
    return rows if len(rows) <= ROWS_SHOWN else sorted(rows, key=lambda x: -key(x))[:ROWS_SHOWN]


def _more(rows: list[Any]) -> str:
    return f"; {len(rows) - ROWS_SHOWN} more rows in --json" if len(rows) > ROWS_SHOWN else ""


def _called_from(rows: Sequence[Sited]) -> list[Column]:
    """The "called from" column of a table of sites: the user's line that led to a library's
    line, blank where it is the line itself; no column if all are blank."""
    return [("called from", "", user_line)] if any(user_line(r) for r in rows) else []


def _given(value: Any) -> Any:
    """A field that may be absent from its row, as a cell: absent reads as missing."""
    return None if value is ABSENT else value


def _basis_name(basis: str) -> str:
    """How the report names the steps its per-step figures are over (``analysis.steps.basis_steps``)."""
    return {"steady": "steady", "all": "(no steady step: all)"}.get(basis, "no")


def render_text(summary: Summary) -> str:
    facts = summary.run
    cmd = " ".join(facts.command) if isinstance(facts.command, list) else (facts.command or "?")
    out = [f"neuron_prof run {facts.path}",
           f"  command: {cmd}",
           f"  torch {facts.torch_version} on {facts.device}, world size {facts.world_size}, "
           f"ranks {facts.ranks}, started {facts.start_time}", ""]
    found = findings(summary)
    if found:
        out.append("Findings")
        out += [f"  {_MARKS[f.severity]} {f.text}"
                for f in found]
        out.append("")
    out += _render_steps(summary)
    basis = _basis_name(summary.ops.basis)
    if summary.step_breakdown:
        out += ["", f"Where a {basis} step's time goes (mean ms per step)"]
        cols: list[Column] = [("rank", "", lambda x: x.rank), ("step", ".2f", lambda x: x.step_ms)]
        for p in PHASES:
            label = p.replace("_", " ")
            cols += [(label, ".2f", lambda x, p=p: getattr(x, f"{p}_ms")),
                     ("%", ".0f", lambda x, p=p: getattr(x, f"{p}_pct"))]
        out += _table(summary.step_breakdown, cols)
    for t in summary.time_split:
        out.append(f"  rank {t.rank}: " + ", ".join(f"{k} {getattr(t, f'{k}_ms'):.2f} ms" for k in TIME_KINDS))
    ops = summary.ops
    out += ["", f"Top ops by self time ({ops.captured_steps} {basis} captured steps, "
                f"{ops.events} op events; the {ops.compile_events} ops run while compiling are left out)"]
    if isinstance(summary.device, DeviceSection):
        out.append("  (host time: on an asynchronous device an op's time is queueing its work; the device's own "
                   "time is under Device, Top kernels)")
    if ops.top_by_self_time:
        op_cols: list[Column] = [("op", "", lambda x: x.name), ("module", "", lambda x: x.module or "-"),
                                 ("calls", "d", lambda x: x.calls), ("self ms", ".2f", lambda x: x.self_ms),
                                 ("%", ".1f", lambda x: x.self_pct), ("total ms", ".2f", lambda x: x.total_ms)]
        if ops.top_by_self_time[0].self_ms_per_step is not ABSENT:
            op_cols.insert(4, ("ms/step", ".3f", lambda x: _given(x.self_ms_per_step)))
        op_cols.append(("pass", "", lambda x: "recompute" if x.recompute else "bwd" if x.backward else ""))
        out += _table(ops.top_by_self_time, op_cols)
    else:
        out += _lost_lines(summary, ["ops"]) or ["  no op events captured"]
    out += _render_precision(summary, basis)
    out += _render_efficiency(summary.efficiency, basis)
    sync = summary.sync_points
    stalls = _given(sync.stalls)
    out += ["", f"Sync points ({sync.events} events: " + (
        "reads of tensor values; on an asynchronous device the host waits for the device here)" if stalls is None
        else f"reads of device values; the host waited for the device in {stalls}: the device's activity shows it)")
        if sync.on_device else f"Sync points (none: the run has no device; {sync.events} host reads of tensor values, "
                               "each of which would wait on an accelerator: a porting note)"]
    if sync.by_source:
        out += _table(sync.by_source,
                      [("source line", "", lambda x: x.source or "?"), ("op", "", lambda x: x.name),
                       ("count", "d", lambda x: x.count), (f"/{basis} step", ".1f", lambda x: x.per_step),
                       ("elsewhere", "d", lambda x: x.count - x.in_steps), ("total ms", ".3f", lambda x: x.total_ms),
                       *([("stalled", "d", lambda x: _given(x.stalls))] if stalls is not None else []),
                       *([("waited ms/step", ".3f", lambda x: _given(x.wait_ms_per_step)),
                          ("waited ms", ".3f", lambda x: _given(x.wait_ms))] if sync.waits_measured else []),
                       ("why" if sync.on_device else "why (on a device)", "", lambda x: x.kind)])
        out.append("  (elsewhere: in start-up, warm-up steps or set-up, never a per-step rate"
                   + ("; stalled: the host waited for the device in it (a wait the backend reported, or a kernel "
                      "still running at the read); the others read a value the device had ready"
                      if stalls is not None else "")
                   + ("; waited: the host's measured wait for the device inside them" if sync.waits_measured else "")
                   + ")")
    else:
        out += _lost_lines(summary, ["ops"]) or ["  none"]
    if isinstance(summary.device, DeviceSection):
        out += _render_device(summary.device)
    out += _render_compile(summary.compile, bool(summary.steps))
    out += _render_memory(summary)
    out += _render_collectives(summary.collectives, facts.world_size)
    out += _render_metrics(summary.metrics)
    out += _render_dumps(summary.dumps)
    out += _render_health(summary)
    return "\n".join(out) + "\n"


def _render_steps(summary: Summary) -> list[str]:
    out = ["Steps (" + summary.run.step_numbering + ")"]
    for x in summary.startup:
        out.append(f"  start-up of rank {x.rank}: {x.ms / 1e3:.2f} s before step 0 (from capture start to the "
                   "first module call: imports, model and data set-up); not a step")
    if not summary.steps:
        out.append("  no completed step (call prof.step() each iteration, or use an optimizer under `record`); "
                   "no per-step figures")
        return out
    out += _table(summary.steps, [("rank", "", lambda x: x.rank), ("steps", "d", lambda x: x.steps),
                                  ("warm-up", "d", lambda x: x.warmup), ("steady", "d", lambda x: x.steady),
                                  ("captured", "d", lambda x: x.captured), ("mean ms", ".2f", lambda x: x.mean_ms),
                                  ("median", ".2f", lambda x: x.median_ms), ("p90", ".2f", lambda x: x.p90_ms),
                                  ("min", ".2f", lambda x: x.min_ms), ("max", ".2f", lambda x: x.max_ms)])
    bases = {x.basis for x in summary.steps}
    out.append("  statistics over the steady steps: not a rank's first step, nor steps in which torch.compile "
               "compiled" if bases == {"steady"} else
               "  no steady step on some rank: its statistics are over all its steps, warm-up included")
    shown = summary.warmup_steps[:8]
    if shown:
        out.append("  warm-up steps: " + "; ".join(
            f"rank {w.rank} step {w.step} {w.step_ms:.1f} ms"
            + (f" ({w.compile_ms:.1f} ms compiling)" if w.compile_ms else "") for w in shown)
            + ("; ..." if len(summary.warmup_steps) > len(shown) else ""))
    return out


def _render_streams(device: DeviceSection) -> list[str]:
    """Streams of a device that ran more than one, or waited: use, overlap, waits by line."""
    if len({(s.rank, s.device, s.stream) for s in device.streams}) < 2 and not device.stream_waits:
        return []
    out = [f"  Streams (mean per {device.basis} step)"]
    out += _table(device.streams, [("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device),
                                   ("stream", "d", lambda x: x.stream),
                                   ("kernels", ".1f", lambda x: x.kernels_per_step),
                                   ("busy ms", ".3f", lambda x: x.busy_ms), ("busy %", ".1f", lambda x: x.busy_pct),
                                   ("idle waiting on another stream ms", ".3f", lambda x: x.waiting_ms)])
    for o in device.stream_overlap:
        out.append(f"  rank {o.rank} {o.device}: streams ran kernels at once {o.overlap_ms:.3f} ms a step "
                   f"({o.overlap_pct:.1f}% of its {o.busy_ms:.3f} ms busy)")
    if device.stream_waits:
        out.append("  Stream waits: a stream idle on the device until another stream's event, by the line that "
                   "queued the wait")
        out += _table(_most(device.stream_waits, lambda x: x.total_ms), [
            ("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device),
            ("stream", "d", lambda x: x.stream), ("waited for", "", lambda x: x.waited_for if x.waited_for >= 0 else "?"),
            ("wait queued at", "", lambda x: x.user_source or x.source or "?"), ("waits", "d", lambda x: x.count),
            ("idle ms/step", ".3f", lambda x: x.per_step_ms), ("total ms", ".3f", lambda x: x.total_ms),
            ("longest ms", ".3f", lambda x: x.max_ms)])
    return out


def _render_device_collectives(device: DeviceSection) -> list[str]:
    """Collectives that ran as device kernels: communication hidden or exposed, streams that
    waited for a collective, the rank whose device reached collectives last."""
    if not device.collectives and not device.collective_waits:
        return []
    out = [f"  Collectives on the device (mean per {device.basis} step; overlapped = other kernels of the "
           "device ran meanwhile, exposed = nothing else did)"]
    out += _table(device.collectives, [
        ("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device),
        ("kernels", ".1f", lambda x: x.kernels_per_step), ("communication ms", ".3f", lambda x: x.comm_ms),
        ("overlapped ms", ".3f", lambda x: x.overlapped_ms), ("exposed ms", ".3f", lambda x: x.exposed_ms),
        ("overlapped %", ".1f", lambda x: x.overlapped_pct)])
    if device.collective_waits:
        out.append("  Streams waiting for a collective (the event its issue recorded), by the lines that issued it "
                   "and queued the wait")
        out += _table(_most(device.collective_waits, lambda x: x.total_ms), [
            ("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device), ("stream", "d", lambda x: x.stream),
            ("collective", "", lambda x: x.op), ("group", "", lambda x: x.group),
            ("issued at", "", lambda x: x.user_source), ("waited at", "", lambda x: x.waited_at),
            ("waits", "d", lambda x: x.count), ("idle ms/step", ".3f", lambda x: x.per_step_ms),
            ("longest ms", ".3f", lambda x: x.max_ms)])
    for s in device.stragglers:
        if s.steps:
            out.append("  " + device_straggler_text(s))
    return out


def _render_device(device: DeviceSection) -> list[str]:
    """The Device section (a run on a device that reports its queue)."""
    over = f"{device.basis_steps} {_basis_name(device.basis)} captured steps"
    heads = ", ".join(f"rank {f.rank} {f.device}: {f.kernels} kernels running {f.ops} ops"
                      + (f" and {f.collective_kernels} collective kernels" if f.collective_kernels else "")
                      for f in device.fusion) or "no kernel reported"
    out = ["", f"Device ({heads}; per-step figures over {over})"]
    t = device.thresholds
    for v in device.verdict:
        out.append(f"  rank {v.rank}: {v.steps} {v.verdict} step{'s' if v.steps != 1 else ''} ({100 * v.share:.0f}%): "
                   f"step {v.step_ms:.2f} ms, {v.device} busy {v.busy_ms:.2f} ms ({v.busy_pct:.0f}%), idle "
                   f"{v.idle_ms:.2f} ms, the host waiting for it {v.wait_ms:.2f} ms ({v.wait_pct:.0f}%)")
    out.append(f"  (device-bound: the busiest device runs kernels {t.device_bound_busy_pct:.0f}% of the step or "
               f"more; host-bound: it is busy under {t.host_bound_busy_pct:.0f}% while the host waits under "
               f"{t.host_bound_wait_pct:.0f}%: the device waits for work; else balanced)")
    shown = device.steps if len(device.steps) <= STEPS_SHOWN else \
        sorted(device.steps, key=lambda x: -x.dur_ms)[:STEPS_SHOWN]
    if shown:
        out += _table(sorted(shown, key=lambda x: (x.rank, x.step)),
                      [("rank", "", lambda x: x.rank), ("step", "", lambda x: x.step),
                       ("", "", lambda x: "warm-up" if x.warmup else ""), ("device", "", lambda x: x.device),
                       ("verdict", "", lambda x: x.verdict), ("step ms", ".2f", lambda x: x.dur_ms),
                       ("busy ms", ".2f", lambda x: x.busy_ms), ("%", ".0f", lambda x: x.busy_pct),
                       ("idle ms", ".2f", lambda x: x.idle_ms), ("host waits ms", ".2f", lambda x: x.wait_ms),
                       ("%", ".0f", lambda x: x.wait_pct)])
        if len(device.steps) > len(shown):
            out.append(f"  (the {len(shown)} longest of {len(device.steps)} steps; --json lists all)")
    out.append("  Stalls: the host waiting for the device, by the line that waited")
    if device.stalls:
        rows = _most(device.stalls, lambda x: x.total_ms)
        out += _table(rows, [("rank", "", lambda x: x.rank), ("source line", "", stall_site),
                             *_called_from(rows), ("op", "", lambda x: x.host_op), ("why", "", lambda x: x.reason),
                             ("device", "", lambda x: x.device), ("waits", "d", lambda x: x.count),
                             ("ms/step", ".3f", lambda x: x.per_step_ms), ("mean ms", ".3f", lambda x: x.mean_ms),
                             ("max ms", ".3f", lambda x: x.max_ms), ("total ms", ".3f", lambda x: x.total_ms),
                             ("ops waited for", "d", lambda x: x.ops)])
        out.append("  (why: sync = the host needs a value; size = the queue was full; fallback = a CPU fallback "
                   "needs the inputs; synchronize = torch.<device>.synchronize(); stream_/event_synchronize = "
                   "Stream./Event.synchronize()" + _more(device.stalls) + ")")
    else:
        out.append("  none: the host never waited for a queued op")
    if device.top_kernels:
        out.append("  Top kernels by device time (source: the line that queued most of its device time)")
        out += _table(device.top_kernels, [("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device),
                                           ("kernel", "", lambda x: x.name), ("runs", "d", lambda x: x.kernels),
                                           ("ops", "d", lambda x: x.ops), ("ms/step", ".3f", lambda x: x.per_step_ms),
                                           ("mean us", ".1f", lambda x: x.mean_us), ("% busy", ".1f", lambda x: x.pct),
                                           ("total ms", ".2f", lambda x: x.total_ms),
                                           ("source line", "", lambda x: x.source)])
    for f in device.fusion:
        out.append(f"  Fusion on rank {f.rank} {f.device}: {f.ops_per_kernel:.2f} ops per kernel, "
                   f"{f.one_op_pct:.0f}% of kernels ran one op; launch cost at most {f.launch_pct:.0f}% of "
                   f"{f.busy_ms:.1f} ms busy ({f.kernels} kernels x the shortest, {f.launch_floor_us:.1f} us)")
    if device.unfused:
        out.append(f"  Unfused runs ({dev.UNFUSED_MIN_RUN}+ one-op kernels in a row; where torch.compile(backend=...) "
                   "or a custom kernel would save launches)")
        out += _table(device.unfused,
                      [("source lines", "", lambda x: x.source + (f" .. {x.last_source}" if x.last_source != x.source
                                                                  else "")),
                       ("kernels", "", lambda x: x.kernels), ("times", "d", lambda x: x.occurrences),
                       ("/step", ".1f", lambda x: x.per_step), ("kernels", "d", lambda x: x.total_kernels),
                       ("device ms", ".2f", lambda x: x.total_ms), ("launch ms (at most)", ".2f", lambda x: x.launch_ms)])
    if device.custom_kernels:
        shares: dict[tuple[int, str], float] = {}  # (rank, device) -> the custom kernels' share of its busy time
        for c in device.custom_kernels:
            shares[(c.rank, c.device)] = shares.get((c.rank, c.device), 0.0) + c.pct
        cov = ", ".join(f"rank {r} {d} {pct:.1f}%" for (r, d), pct in shares.items())
        out.append(f"  Custom kernels (custom-kernel coverage: the share of device busy time in them: {cov})")
        out += _table(device.custom_kernels,
                      [("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device), ("kernel", "", lambda x: x.name),
                       ("calls fwd/bwd", "", lambda x: f"{x.forward_calls}/{x.backward_calls}"),
                       ("ms/step", ".3f", lambda x: x.per_step_ms), ("mean us", ".1f", lambda x: x.mean_us),
                       ("fwd ms", ".2f", lambda x: x.forward_ms), ("bwd ms", ".2f", lambda x: x.backward_ms),
                       ("% busy", ".1f", lambda x: x.pct),
                       ("called at", "", lambda x: ", ".join(x.user_sources[:3])
                        + (" ..." if len(x.user_sources) > 3 else "")),
                       *([("in compiled graphs", "", lambda x: ", ".join(x.graphs) or "-")]
                         if any(k.graphs for k in device.custom_kernels) else [])])
    out += _render_streams(device)
    out += _render_device_collectives(device)
    if device.copies:
        out.append("  Copies (by direction and the line that issued them)")
        out += _table(_most(device.copies, lambda x: x.bytes),
                      [("rank", "", lambda x: x.rank), ("device", "", lambda x: x.device), ("kind", "", lambda x: x.kind),
                       ("line", "", lambda x: x.user_source or "-"), ("copies", "d", lambda x: x.copies),
                       ("bytes/step", "", lambda x: format_bytes(x.bytes_per_step) if x.bytes_per_step is not None
                        else "-"),
                       ("ms/step", ".3f", lambda x: x.per_step_ms), ("bytes", "", lambda x: format_bytes(x.bytes)),
                       ("GB/s", ".2f", lambda x: x.gbps)])
        if _more(device.copies):
            out.append("  (" + _more(device.copies).lstrip("; ") + ")")
    cov = ", ".join(f"rank {c.rank} {c.device} {c.coverage_pct:.1f}% of {c.native_ops + c.fallback_ops}"
                    for c in device.coverage)
    out.append(f"  CPU fallbacks (coverage: the share of device ops run natively: {cov})")
    if device.fallbacks:
        out += _table(_most(device.fallbacks, lambda x: x.total_ms),
                      [("rank", "", lambda x: x.rank), ("op", "", lambda x: x.op), ("device", "", lambda x: x.device),
                       ("source lines", "", lambda x: ", ".join(x.sources[:3]) + (" ..." if len(x.sources) > 3 else "")),
                       ("calls", "d", lambda x: x.calls), ("/step", ".1f", lambda x: x.calls_per_step),
                       ("to host", "", lambda x: format_bytes(x.bytes_to_host)),
                       ("from host", "", lambda x: format_bytes(x.bytes_from_host)),
                       ("ms/step", ".3f", lambda x: x.per_step_ms), ("total ms", ".3f", lambda x: x.total_ms)])
        out.append("  (bytes over the run: inputs copied off the device, results copied back; time includes the copies"
                   + _more(device.fallbacks) + ")")
    else:
        out.append("  none: every op ran on the device")
    return out


def _render_compile(compiled: CompileSection, stepped: bool) -> list[str]:
    """``stepped``: whether any step completed (compile time "inside steps" needs steps)."""
    if not compiled.frames_compiled and not compiled.graph_runs:
        return ["", "Compile", "  no torch.compile activity captured"]
    inside = f"{compiled.compile_in_steps_ms:.0f} ms of compiling inside steps" if stepped else "no step completed"
    out = ["", f"Compile ({compiled.frames_compiled} frame compiles, {compiled.compile_ms:.0f} ms, "
               f"{inside}; {compiled.graph_breaks} graph break sites, {compiled.recompiles} recompiles)"]
    if compiled.cache_limit_hit:
        out.append("  !! the recompile (cache size) limit was hit: a frame fell back to eager for good")
    if compiled.break_sites:
        out.append("  Graph breaks by site")
        out += _table(compiled.break_sites, [("source line", "", lambda x: x.source),
                                             ("class", "", lambda x: x.reason_class), ("breaks", "d", lambda x: x.breaks),
                                             ("hits/step", ".1f", lambda x: x.hits_per_step),
                                             ("frame ms/step", ".3f", lambda x: x.frame_ms_per_step),
                                             ("gb", "", lambda x: x.gb_id)])
        out.append("  (per steady step; frame ms: the graph before the break plus the break's eager code, until the "
                   "resumed frame, compiling left out)")
    for r in compiled.recompiles_by_frame:
        out.append(f"  recompiles of {r.func}: {r.recompiles}" + ("  (CACHE LIMIT HIT)" if r.cache_limit_hit else ""))
        out += [f"    - {reason}" for reason in r.reasons[:5]]
    if compiled.compile_time:
        out.append("  Compile time by frame")
        out += _table(compiled.compile_time, [("id", "", lambda x: x.compile_id), ("frame", "", lambda x: x.func),
                                              ("backend", "", lambda x: x.backend), ("ops", "d", lambda x: x.graph_ops),
                                              ("ms", ".1f", lambda x: x.total_ms), ("status", "", lambda x: x.status)])
    for x in compiled.cache:
        rate = "n/a" if x.hit_rate is None else f"{100 * x.hit_rate:.0f}%"
        out.append(f"  cache {x.cache}: {x.hit} hits, {x.miss} misses, {x.bypass} bypasses ({rate})")
    if compiled.graph_runs:
        out.append("  Compiled graphs at run time")
        out += _table(compiled.graph_runs, [("id", "", lambda x: x.compile_id), ("runs", "d", lambda x: x.runs),
                                            ("runs/step", ".1f", lambda x: x.runs_per_step),
                                            ("self ms/step", ".3f", lambda x: x.self_ms_per_step),
                                            ("total ms", ".3f", lambda x: x.total_ms)])
    if compiled.top_fusions:
        out.append("  Top fused kernels")
        out += [f"  {f.kernel} ({f.compile_id}): {f.fused} nodes: {', '.join(f.nodes[:8])}"
                for f in compiled.top_fusions]
    return out


def _lost_lines(summary: Summary, tables: list[str]) -> list[str]:
    """Why a section that has none of ``tables`` is empty, where damage took them (else none)."""
    return [f"  lost to damage: {d.file} {d.what} (see Capture health)" for d in lost_to_damage(summary, tables)]


def _render_memory(summary: Summary) -> list[str]:
    memory = summary.memory
    if not isinstance(memory, MemorySection):
        lost = _lost_lines(summary, ["memory_steps", "memory_events", "process_memory"])  # build._memory's
        return ["", "Memory", *(lost or ["  not captured (the `memory` collector was off; it is on by default)"])]
    counted = counted_devices(memory)
    out = ["", "Memory (bytes allocated since capture began, per device"
           + ("; a backend's counters count all of its device's" if counted else "") + ")"]
    for d in memory.devices:
        mine = (d.rank, d.device) in counted
        out.append(f"  rank {d.rank} {d.device} ({figures_text(d.figures_from, d.counters_api)}): "
                   + ("allocated" if mine else "live") + f" {format_bytes(d.live_first)} -> "
                   f"{format_bytes(d.live_last)} over "
                   f"{d.boundaries} step boundaries ({format_bytes(d.growth_per_step)}/step), "
                   + ("high-water mark" if mine else "highest peak between boundaries")
                   + f" {format_bytes(d.peak_between_boundaries)}")
        if d.unseen_steps:
            out.append(f"  rank {d.rank} {d.device}: no live bytes at the boundaries of steps {ranks_text(d.unseen_steps)} "
                       "(not seen; Capture health says why): growth and leaks are judged without them")
        p = d.peak
        if p:
            out.append(f"  peak of the captured steps: {format_bytes(p.bytes)} in step {p.step}, reached with "
                       f"{format_bytes(p.alloc_bytes)} from {p.op or '?'} at {p.source or '?'}"
                       + called_from(p) + (f" ({p.module})" if p.module else "") + f" [{p.category}]")
            out.append("    by category: " + ", ".join(f"{c.category} {format_bytes(c.bytes)}"
                                                   for c in d.peak_by_category))
            sites = d.peak_sites
            cols: list[Column] = [("live at the peak: source line", "", lambda x: x.source or "?"),
                                  *_called_from(sites), ("module", "", lambda x: x.module or "-"),
                                  ("op", "", lambda x: x.op), ("category", "", lambda x: x.category),
                                  ("blocks", "d", lambda x: x.blocks), ("bytes", "", lambda x: format_bytes(x.bytes))]
            out += ["  " + line for line in _table(sites, cols)]
    for x in memory.process:
        per_step = (f"{format_bytes(x.growth_per_step)}/step over {x.judged} boundaries of steps not captured"
                    if x.growth_per_step is not None else
                    "growth not judged: the capture's own buffers move it in captured steps; capture fewer steps "
                    "(--schedule) to judge it")
        out.append(f"  rank {x.rank} process resident memory (RSS): {format_bytes(x.first)} -> "
                   f"{format_bytes(x.last)} over {x.boundaries} step boundaries, {per_step}")
    if memory.leaks:
        by_dev: dict[tuple, list] = {}
        for x in memory.leaks:
            by_dev.setdefault((x.rank, x.device), []).append(x)
        for (rank, device), rows in by_dev.items():
            x = rows[0]
            severity, pace = leak_cost(x.growth_per_step, device_peak(memory, rank, device))
            out.append(f"  {_MARKS[severity]} LEAK on rank {rank} {device}: +{format_bytes(x.growth_per_step)} per step "
                       f"(grew in {x.steps_growing} of the step boundaries checked), confidence {x.confidence:.2f}")
            out += [f"     {n}" for n in (pace, confirmation_text(x)) if n]
            sited = next((r for r in rows if r.source or r.op), None)
            if sited is not None:
                out.append(f"     made from {sited.made_at or '? (no line in the step loop)'}; "
                           + (f"kept alive by {sited.keeper} (via {sited.keeper_via})" if sited.keeper
                              else f"keeper {sited.keeper_note}"))
            if (rank, device) in counted:
                out.append(f"     {LINES_NOTE}")
            if process_note(x):
                out.append(f"     {process_note(x)}")
            sites = [r for r in rows if r.source or r.op]
            cols = [("made from (step loop)", "", lambda r: r.made_at or "-"),
                    ("surviving allocations from", "", lambda r: r.source), *_called_from(sites),
                    ("module", "", lambda r: r.module or "-"), ("op", "", lambda r: r.op),
                    ("category", "", lambda r: r.category), ("autograd graph", "", lambda r: "yes" if r.grad else ""),
                    ("bytes/step", "", lambda r: format_bytes(r.bytes_per_step)),
                    ("blocks/step", "d", lambda r: r.blocks_per_step),
                    ("steps", "", lambda r: f"{r.steps_seen}/{r.steps_checked}"),
                    ("kept alive by", "", lambda r: r.keeper or r.keeper_note)]
            out += ["  " + line for line in _table(sites, cols)] if sites or (rank, device) not in counted else []
    elif not any(d.checked >= LEAK_MIN_STEPS for d in memory.devices):
        out.append(f"  leaks not judged: no device has {LEAK_MIN_STEPS} step-to-step differences of live bytes seen")
    elif any(d.unseen_steps for d in memory.devices):
        out.append("  no leak over the step boundaries seen: live memory does not grow step over step there")
    else:
        out.append("  no leak: live memory does not grow step over step")
    for o in memory.ooms:
        out.append(f"  !! OUT OF MEMORY on rank {o.rank} {o.device} in step {o.step}: {o.message}")
    return out


def _render_collectives(colls: CollectivesSection | CollectivesNotCaptured, world_size: int | None) -> list[str]:
    """The Collectives section: nothing for a single-process run without collectives."""
    if not isinstance(colls, CollectivesSection):
        if max(colls.ranks, world_size or 1) < 2:
            return []
        return ["", "Collectives", "  not captured (the `collectives` collector records them once "
                "torch.distributed's process group is initialised; it is on by default)"]
    shown = colls.groups[:GROUPS_SHOWN]
    groups = "; ".join(f"group {g.group} {g.desc} ({g.backend}, ranks {ranks_text(g.ranks)})" for g in shown)
    if len(colls.groups) > len(shown):
        groups += f"; {len(colls.groups) - len(shown)} more groups (--json lists them)"
    out = ["", f"Collectives ({colls.collectives} collectives, {colls.calls} calls on {colls.ranks} ranks; {groups})"]
    out.append("  " + _clock_text(colls.clock))
    out += _table(_most(colls.by_op, lambda x: x.time_ms_per_rank),
                  [("group", "", lambda x: x.group), ("op", "", lambda x: x.op),
                   ("collectives", "d", lambda x: x.collectives), ("/steady step", ".1f", lambda x: x.per_step),
                   ("bytes/rank", "", lambda x: format_bytes(x.bytes)),
                   ("ms/rank", ".2f", lambda x: x.time_ms_per_rank), ("wait ms/rank", ".2f", lambda x: x.wait_ms_per_rank)])
    out.append("  (ms/rank: issue to completion, over the run, mean over ranks; wait: waiting for the last rank "
               "to arrive; each moment of a rank once, however many collectives were under way" + _more(colls.by_op)
               + ")")
    out.append(f"  Stragglers over {colls.steady_steps} steady steps (significant: a step's straggler made the "
               f"others wait {colls.threshold_ms:.1f} ms or more: at least {SHARE:.0%} of the median step, and "
               "above the run's noise unless late in every step)")
    if colls.stragglers:
        out += _table(colls.stragglers[:ROWS_SHOWN],
                      [("rank", "", lambda x: x.rank), ("last (significant)", "d", lambda x: x.times_last),
                       ("made others wait ms", ".1f", lambda x: x.wait_caused_ns / 1e6),
                       ("%", ".0f", lambda x: 100 * (x.share or 0)),
                       ("waited itself ms", ".1f", lambda x: x.waited_ns / 1e6),
                       ("significant in", "", lambda x: steps_text(x.steps) if x.steps else "-")])
        if len(colls.stragglers) > ROWS_SHOWN:
            out.append(f"  ({_more(colls.stragglers).lstrip('; ')})")
        named = [x for x in colls.stragglers if x.steps]
        out += [f"  {straggler_text(x)}" for x in named] or ["  no significant straggler: the ranks arrive "
                                                             "together within the run's noise"]
    else:
        out.append("  no collective of a steady step seen on more than one rank")
    out += [f"  !! mismatch: group {m.group} seq {m.seq} ({m.kind}): {m.detail}" for m in colls.mismatches]
    out += [f"  !! in flight: {in_flight_text(x)}" for x in colls.in_flight]
    if colls.overlap:
        out.append("  Communication and compute (mean per steady step; exposed: in a collective with no compute "
                   "running on the rank)")
        out += _table(colls.overlap, [("rank", "", lambda x: x.rank), ("in collectives ms", ".2f", lambda x: x.comm_ms),
                                      ("overlapped ms", ".2f", lambda x: x.overlapped_ms),
                                      ("exposed ms", ".2f", lambda x: x.exposed_ms),
                                      ("% of step", ".1f", lambda x: x.exposed_pct)])
    if colls.bandwidth:
        out.append("  Bandwidth (transfer: from the last arrival to completion; busbw as NCCL-tests)")
        out += _table(_most(colls.bandwidth, lambda x: x.transfer_ns),
                      [("group", "", lambda x: x.group), ("op", "", lambda x: x.op), ("calls", "d", lambda x: x.calls),
                       ("bytes", "", lambda x: format_bytes(x.bytes)),
                       ("transfer ms", ".2f", lambda x: x.transfer_ns / 1e6),
                       ("algbw GB/s", ".3f", lambda x: x.algbw), ("busbw GB/s", ".3f", lambda x: x.busbw)])
        if len(colls.bandwidth) > ROWS_SHOWN:
            out.append(f"  ({_more(colls.bandwidth).lstrip('; ')})")
    return out


def _clock_text(clock: list[ClockOffset]) -> str:
    """One line on how the ranks' clocks were aligned to rank 0's."""
    others = [x for x in clock if x.rank != 0]
    if all(x.same_clock for x in others):
        return "clocks: every rank reads rank 0's clock (one host): no offset applied"
    apart = [x for x in others if x.measured and not x.same_clock]
    parts = [f"rank {x.rank} {x.offset_start / 1e6:+.3f} -> {x.offset_end / 1e6:+.3f} ms "
             f"(+-{x.rtt / 2e6:.3f})" for x in apart]
    if len(apart) > GROUPS_SHOWN:
        starts, ends = [x.offset_start / 1e6 for x in apart], [x.offset_end / 1e6 for x in apart]
        drift = max(abs(b - a) for a, b in zip(starts, ends))
        parts = [f"{len(apart)} ranks on other hosts, offsets {min(starts):+.3f} to {max(starts):+.3f} ms at start, "
                 f"drift up to {drift:.3f} ms, within +-{max(x.rtt for x in apart) / 2e6:.3f} ms"]
    unmeasured = [x.rank for x in others if not x.measured]
    if unmeasured:
        parts.append(f"ranks {ranks_text(unmeasured)} not measured: their clocks are taken as rank 0's")
    return "clocks aligned to rank 0 (offset at start -> end): " + "; ".join(parts)


def _render_metrics(metrics: list[MetricSummary]) -> list[str]:
    if not metrics:
        return []
    out = ["", "Training scalars (per step: loss is the scalar backward() ran on; neuron_prof.log adds more)"]
    out += _table(metrics, [("rank", "", lambda x: x.rank), ("name", "", lambda x: x.name),
                            ("steps", "d", lambda x: x.steps), ("first", ".6g", lambda x: x.first),
                            ("last", ".6g", lambda x: x.last), ("min", ".6g", lambda x: x.min),
                            ("max", ".6g", lambda x: x.max)])
    return out


def _render_dumps(dumps: list[Dump]) -> list[str]:
    if not dumps:
        return []
    out = ["", "Always-on dumps (the detail of these steps is in the run)"]
    for dump in dumps:
        out.append(f"  rank {dump.rank}, step {dump.last_step}: {dump.reason}; {detail_steps_text(dump.detail_steps)}")
        for t in dump.threads:
            out.append(f"    thread {t.tid} at {t.source or '(no Python frame of yours)'}")
        out += [f"    in flight: {dump_collective_text(c)}" for c in dump.collectives]
        out += [f"    device queue {dump_queue_text(q)}" for q in dump.queues]
    return out


def _render_health(summary: Summary) -> list[str]:
    health = summary.health
    out = ["", "Capture health"]
    out += [f"  DAMAGED: {damage_text(d)}" for d in health.damage]
    damaged = {d.rank for d in health.damage}
    for x in health.ranks:
        how = ("closed cleanly" if x.closed else "damaged (see above), not known to have closed" if x.rank in damaged
               else "did NOT close (killed or crashed)")
        bits = [f"rank {x.rank}: {how}", f"{x.events_written} events", f"{x.events_dropped} dropped"]
        if x.ignored_bytes and x.rank in damaged:
            bits.append(f"{x.ignored_bytes} bytes of tables unreadable")
        elif x.ignored_bytes:
            bits.append(f"{x.ignored_bytes} bytes after the last completed step ignored")
        cut = next((c for c in health.detail_cuts if c.rank == x.rank), None)
        if x.cap_reached_at_step is not None:
            what = "disk budget" if cut is not None and cut.by == "max_bytes" else "event cap"
            bits.append(f"{what} reached at step {x.cap_reached_at_step}")
        out.append("  " + ", ".join(bits))
        if cut is not None:
            out.append(f"  rank {x.rank}: {detail_cut_text(cut)}")
    for f in health.failures:
        out.append(f"  rank {f.rank}: collector {f.collector} failed: {f.message}")
    for g in health.device_gaps:
        out.append(f"  {device_gap_text(g)}")
    for rank in health.missing_ranks:
        out.append(f"  rank {rank}: no folder: the process was killed or crashed before its first step "
                   "(or never started)")
    for c in health.conflicts:
        when = _dt.datetime.fromtimestamp(c.time_ns / 1e9).strftime("%H:%M:%S") if c.time_ns else "?"
        owner = f"pid {c.holder_pid} {'was writing it' if c.live else 'had written it'}"
        out.append(f"  rank {c.rank}: also claimed by pid {c.pid} ({' '.join(map(str, c.argv))[:80]}) "
                   f"at {when}, which wrote nothing ({owner})")
    for d in health.stale_rank_dirs:
        out.append(f"  ignored {d}: not this run's, left by an earlier capture into the same directory")
    if health.command_exit is not None:
        out.append(f"  the command {describe_exit(to_json(health.command_exit))}")
    return out
