"""``neuron-prof compare``'s document: two runs opened, compared (``analysis.compare``) and
written as text, JSON (a CI gate) or Markdown (a pull request, a migration report)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from neuron_prof.analysis.compare import LOSS_RTOL, TOLERANCE, Checklist, Figures, Side, checklist
from neuron_prof.analysis.flops import PeakRequest
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.markdown import md
from neuron_prof.reports.stored import run_summary
from neuron_prof.reports.summary.build import read_against
from neuron_prof.reports.summary.codec import to_json as summary_json
from neuron_prof.reports.summary.sections import BreakSite, DeviceSection, MemoryDevice, MemorySection, Summary
from neuron_prof.reports.table import aligned, markdown
from neuron_prof.store.run import Run
from neuron_prof.units import format_bytes

if TYPE_CHECKING:
    from neuron_prof.backends.op_support import Target


@dataclass(frozen=True)
class Comparison:
    """``neuron-prof compare``'s result: the two runs (paths), their checklist, and the graph break
    sites of one run only as their summaries hold them."""

    runs: tuple[str, str]
    checklist: Checklist
    breaks_a_only: list[BreakSite]
    breaks_b_only: list[BreakSite]


def _break_sites(summary: Summary) -> dict[str, BreakSite]:
    """A summary's graph break sites by ``Figures.break_sites``' key."""
    return {f"{x.source} ({x.reason_class})": x for x in summary.compile.break_sites}


def _memory(summary: Summary) -> list[MemoryDevice]:
    return summary.memory.devices if isinstance(summary.memory, MemorySection) else []


def _step_median(summary: Summary) -> float | None:
    """Median step time: the median over ranks of each rank's median (the Overview's number)."""
    vals = [x.median_ms for x in summary.steps if x.median_ms is not None]
    return float(np.median(vals)) if vals else None


def _p90(summary: Summary) -> float | None:
    vals = [x.p90_ms for x in summary.steps if x.p90_ms is not None]
    return float(np.median(vals)) if vals else None


def _memory_peak(summary: Summary) -> float | None:
    if not isinstance(summary.memory, MemorySection):
        return None
    vals = [v for d in _memory(summary)
            for v in (d.peak_between_boundaries or 0, (d.peak.bytes if d.peak else 0) or 0)]
    return float(max(vals)) if vals else None


def _leak_growth(summary: Summary) -> float | None:
    if not isinstance(summary.memory, MemorySection):
        return None
    vals = [float(d.growth_per_step) for d in _memory(summary) if d.growth_per_step is not None]
    return max(vals) if vals else None


def _device_sum(device: DeviceSection | None, rows: Callable[[DeviceSection], list],
                value: Callable[[Any], float | None]) -> float | None:
    """``value`` summed over a Device section's ``rows`` (a row without one counts 0); None without a device."""
    return None if device is None else float(sum(value(x) or 0 for x in rows(device)))


def _coverage(device: DeviceSection | None) -> float | None:
    vals = [x.coverage_pct for x in device.coverage if x.coverage_pct is not None] if device else []
    return float(min(vals)) if vals else None


def _device_busy(device: DeviceSection | None) -> float | None:
    rows = device.verdict if device else []
    steps = sum(v.steps for v in rows)
    return sum(v.busy_pct * v.steps for v in rows) / steps if steps else None


def _launch_pct(device: DeviceSection | None) -> float | None:
    busy = sum(f.busy_ms for f in device.fusion) if device else 0.0
    return 100 * sum(f.launch_ms for f in device.fusion) / busy if device and busy else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def figures(summary: Summary) -> Figures:
    """The checklist's numbers of a run, read from its report summary."""
    device = summary.device if isinstance(summary.device, DeviceSection) else None
    compiled, ranks = summary.compile, summary.efficiency.ranks
    return Figures(
        step_median_ms=_step_median(summary), step_p90_ms=_p90(summary),
        complete_steps=max((x.steps or 0 for x in summary.steps), default=0),
        compile_ms=compiled.compile_ms, frames_compiled=compiled.frames_compiled,
        graph_break_sites=compiled.graph_breaks, graph_break_events=compiled.graph_break_events,
        recompiles=compiled.recompiles, break_sites=list(_break_sites(summary)),
        fallbacks_per_step=_device_sum(device, lambda d: d.fallbacks, lambda x: x.calls_per_step),
        coverage_pct=_coverage(device), device_busy_pct=_device_busy(device),
        copy_bytes_per_step=_device_sum(device, lambda d: d.copies, lambda x: x.bytes_per_step),
        launch_pct=_launch_pct(device),
        sync_ms=_mean([x.sync_ms for x in summary.time_split if x.sync_ms is not None]),
        tflops=_mean([r.tflops for r in ranks]), mfu_pct=_mean([r.mfu_pct for r in ranks if r.mfu_pct is not None]),
        peak_tflops=summary.efficiency.peak.tflops, peak_source=summary.efficiency.peak.source,
        memory_peak=_memory_peak(summary), leak_growth=_leak_growth(summary),
        memory_devices=[str(d.device) for d in _memory(summary)],
        world_size=summary.run.world_size, device=summary.run.device)


def side(run: Run, label: str, price_per_hour: float | None = None, summary: Summary | None = None,
         peak: PeakRequest = PeakRequest(), target: Target | None = None) -> Side:
    """What the comparison needs of ``run``; ``summary``: its report summary if at hand (default:
    the stored one when fresh, else computed); ``peak``: what its MFU is against; ``target``: a
    backend registered in this process, to price the ops that fall back there."""
    hosts = {str(rd.meta.get("hostname")) for rd in run.rank_data if rd.meta.get("hostname")}
    summary = summary if summary is not None else run_summary(run)
    summary = read_against(summary, peak)
    fallback_pct = None
    if target is not None:
        from neuron_prof.reports.port import port_check  # asks torch's dispatcher: only with a target
        fallback_pct = float(port_check(run, target).fallbacks["pct"].sum())
    return Side(label=label, figures=figures(summary), metrics=run.metrics, steps=analyze(run).step_kinds,
                ops=analyze(run).op_time.stats, hosts=max(1, len(hosts)), price_per_hour=price_per_hour,
                target_fallback_pct=fallback_pct)


PHASES = ("a: summary and ops", "b: summary and ops", "comparing")
"""What ``compare_runs`` reports to its ``progress`` callback, in order."""


def compare_runs(a: Run, b: Run, labels: tuple[str, str] = ("a", "b"),
                 prices: tuple[float | None, float | None] = (None, None), tolerance: float = TOLERANCE,
                 loss_rtol: float = LOSS_RTOL, progress: Callable[[str], None] = lambda phase: None,
                 peaks: tuple[PeakRequest, PeakRequest] = (PeakRequest(), PeakRequest()), target: Target | None = None,
                 summaries: tuple[Summary | None, Summary | None] = (None, None)) -> Comparison:
    """The comparison of ``b`` against the baseline ``a``; ``summaries``: their report summaries if
    at hand (the viewer's); ``progress`` is told each of ``PHASES`` as it begins."""
    sides, sites = [], []
    for phase, run, label, price, summary, peak in zip(PHASES, (a, b), labels, prices, summaries, peaks):
        progress(phase)
        summary = summary if summary is not None else run_summary(run)
        sides.append(side(run, label, price, summary, peak, target))
        sites.append(_break_sites(summary))
    progress(PHASES[2])
    result = checklist(*sides, tolerance, loss_rtol)
    return Comparison((str(a.path), str(b.path)), result, [sites[0][k] for k in result.breaks_a_only],
                      [sites[1][k] for k in result.breaks_b_only])


def to_json(c: Comparison) -> dict[str, Any]:
    """The comparison as JSON-ready values (``compare --json``, a CI gate)."""
    result = c.checklist
    (ra, rb), (la, lb) = c.runs, result.labels
    return {"runs": {"a": ra, "b": rb}, "labels": {"a": la, "b": lb},
            "rows": summary_json(result.rows), "loss": summary_json(result.loss),
            "graph_breaks": {"a_only": summary_json(c.breaks_a_only), "b_only": summary_json(c.breaks_b_only)},
            "ops": summary_json(result.ops), "notes": result.notes}


def format_value(v: Any, unit: str) -> str:
    """A checklist value with its unit, as the text, the Markdown and the viewer show it."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit.startswith("bytes"):
        return format_bytes(v, 2) + unit[5:]
    if unit == "ms":
        return f"{v:.3f} ms"
    if unit == "USD":
        return f"${v:.4g}"
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:,.1f}" if unit == "1/s" else f"{v:g}"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _check_table(c: Comparison) -> tuple[list[str], list[list[str]]]:
    la, lb = c.checklist.labels
    head = ["check", la, lb, f"{lb}/{la}", "verdict", "detail"]
    body = [[r.item + (f" ({r.better} is better)" if r.better == "higher" else ""), format_value(r.a, r.unit),
             format_value(r.b, r.unit), _ratio(r.ratio), r.verdict, r.detail] for r in c.checklist.rows]
    return head, body


def _ops_table(c: Comparison) -> tuple[list[str], list[list[str]]]:
    la, lb = c.checklist.labels
    head = ["op", "module", f"{la} ms/step", f"{lb} ms/step", "change ms/step"]
    return head, [[o.name, o.module or "-", f"{o.a_ms_per_step:.3f}", f"{o.b_ms_per_step:.3f}", f"{o.change_ms:+.3f}"]
                  for o in c.checklist.ops]


def _sites(c: Comparison) -> list[str]:
    return [f"graph break only in {label}: {s.source} ({s.reason_class}): {s.reason}"
            for label, sites in zip(c.checklist.labels, (c.breaks_a_only, c.breaks_b_only)) for s in sites]


def render_text(c: Comparison) -> str:
    """The comparison as ``compare`` prints it."""
    la, lb = c.checklist.labels
    lines = [f"neuron_prof compare: {lb} ({c.runs[1]}) against {la} ({c.runs[0]})", ""]
    lines += aligned(*_check_table(c))
    sites = _sites(c)
    if sites:
        lines += ["", *sites]
    if c.checklist.ops:
        lines += ["", "ops whose time changed most (self time per steady step, by op and module path):"]
        lines += aligned(*_ops_table(c))
    if c.checklist.notes:
        lines += ["", *(f"note: {n}" for n in c.checklist.notes)]
    return "\n".join(lines) + "\n"


def render_markdown(c: Comparison) -> str:
    """The comparison as ``compare --markdown`` prints it (a pull request, a migration report)."""
    la, lb = c.checklist.labels
    lines = [f"## Migration check: {md(lb)} against {md(la)}", ""]
    lines += markdown(*_check_table(c)) + [""]
    sites = _sites(c)
    if sites:
        lines += [f"- {md(s)}" for s in sites] + [""]
    if c.checklist.ops:
        lines += ["### Ops whose time changed most", ""] + markdown(*_ops_table(c)) + [""]
    if c.checklist.notes:
        lines += [f"> {md(n)}" for n in c.checklist.notes] + [""]
    return "\n".join(lines)
