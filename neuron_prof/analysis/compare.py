"""The migration verdict: the same job on two devices, or two runs of it, one checklist row each
(step time, throughput, cost per token, compile stability, coverage, sync stalls, memory, loss
agreement), and the ops whose time changed most.

Built on the runs' summaries (``summary.build.summarize``: every number is the report's) and on
what a summary does not keep: each step's loss (``analysis.metrics``) and the time of every
(op, module path) rather than the top few. ``a`` is the baseline, ``b`` the run compared with it;
``ratio`` is b / a; a row's ``verdict`` says whether b is better, worse or the same (measured
numbers within ``tolerance`` are the same), by the row's own sense (``higher``: throughput).

Throughput counts each rank's own ``tokens``/``samples`` (``prof.step(tokens=...)``,
``--tokens-per-step``): a run's tokens/s adds up its ranks' (each rank's tokens over its steady
steps' time). Cost per million tokens: ``price`` per instance-hour (one instance per host the run's
ranks ran on) over those tokens.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from neuron_prof.analysis.metrics import per_step, step_values
from neuron_prof.reports.summary.sections import BreakSite, DeviceSection, MemoryDevice, MemorySection, Summary

TOLERANCE = 0.05
"""Relative change of a measured (continuous) number still called the same."""
LOSS_RTOL = 1e-3
"""Relative difference of a step's loss beyond which two runs have diverged there (float32
arithmetic on different hardware agrees to about this in the first steps)."""
TOP_OPS = 10
COLUMNS = ["item", "unit", "better", "a", "b", "ratio", "verdict", "detail"]


@dataclass
class Side:
    """One run of the comparison: its label, summary, per-step scalars and op times."""

    label: str
    summary: Summary
    metrics: pd.DataFrame
    """``Run.metrics``."""
    steps: pd.DataFrame
    """``RunAnalysis.step_kinds``."""
    ops: pd.DataFrame
    """``summary.build.run_op_stats(run)``: self time per (name, module) with ``self_ms_per_step``."""
    hosts: int = 1
    price_per_hour: float | None = None
    target_fallback_pct: float | None = None
    """% of its op time in ops that fall back to the CPU on the comparison's target backend
    (``port_report.port_check``); None without a target."""
    notes: list[str] = field(default_factory=list)

    @functools.cached_property
    def per_step(self) -> pd.DataFrame:
        """``analysis.metrics.per_step`` of its metrics (throughput, the loss and the notes read it)."""
        return per_step(self.metrics)


def verdict(a: float | None, b: float | None, measured: bool = True, tolerance: float = TOLERANCE) -> str:
    """``better`` / ``worse`` / ``same`` for b against a, lower being better; ``n/a`` when one is
    missing. A measured number within ``tolerance`` (relative to the larger of the two) is ``same``.
    For a higher-is-better number, ask ``verdict(b, a)``."""
    if a is None or b is None or (isinstance(a, float) and np.isnan(a)) or (isinstance(b, float) and np.isnan(b)):
        return "n/a"
    if a == b:
        return "same"
    if measured and abs(b - a) <= tolerance * max(abs(a), abs(b)):
        return "same"
    return "better" if b < a else "worse"


def throughput(side: Side, name: str) -> float | None:
    """``name`` (tokens, samples) per second: each rank's sum over its steady steps over their
    time, added up over the ranks that logged it. None when no rank did."""
    p = side.per_step
    p = p[p["name"] == name]
    steady = side.steps[side.steps["steady"]] if "steady" in side.steps.columns else side.steps.iloc[0:0]
    if p.empty or steady.empty:
        return None
    joined = steady.merge(p, on=["rank", "step"])
    if joined.empty:
        return None
    per_rank = joined.groupby("rank").agg(n=("value", "sum"), ns=("dur", "sum"))
    return float((per_rank["n"] / (per_rank["ns"] / 1e9)).sum())


def cost_per_million(side: Side, tokens_per_s: float | None) -> float | None:
    if side.price_per_hour is None or not tokens_per_s:
        return None
    return side.price_per_hour * side.hosts / 3600 / tokens_per_s * 1e6


def loss_agreement(a: pd.Series, b: pd.Series, rtol: float = LOSS_RTOL) -> dict[str, Any]:
    """Over the steps both runs have a loss for: the largest absolute and relative difference,
    whether they are identical, and the first step where they differ by more than ``rtol``
    (relative to the baseline's loss; None: never)."""
    common = a.index.intersection(b.index).sort_values()
    if not len(common):
        return {"common_steps": 0, "max_abs_diff": None, "max_rel_diff": None, "identical": None,
                "first_divergent_step": None, "rtol": rtol}
    va, vb = a.loc[common].to_numpy(float), b.loc[common].to_numpy(float)
    diff = np.abs(vb - va)
    rel = diff / np.maximum(np.abs(va), np.finfo(float).tiny)
    over = np.flatnonzero(rel > rtol)
    return {"common_steps": int(len(common)), "max_abs_diff": float(diff.max()), "max_rel_diff": float(rel.max()),
            "identical": bool((va == vb).all()), "first_divergent_step": int(common[over[0]]) if len(over) else None,
            "rtol": rtol}


def _step_median(summary: Summary) -> float | None:
    """Median step time: the median over ranks of each rank's median (the Overview's number)."""
    vals = [x.median_ms for x in summary.steps if x.median_ms is not None]
    return float(np.median(vals)) if vals else None


def _memory(summary: Summary) -> list[MemoryDevice]:
    return summary.memory.devices if isinstance(summary.memory, MemorySection) else []


def _memory_peak(summary: Summary) -> float | None:
    """The highest memory peak of any device (bytes allocated since capture began)."""
    if not isinstance(summary.memory, MemorySection):
        return None
    vals = [v for d in _memory(summary)
            for v in (d.peak_between_boundaries or 0, (d.peak.bytes if d.peak else 0) or 0)]
    return float(max(vals)) if vals else None


def _leak_growth(summary: Summary) -> float | None:
    """Live-memory growth per step of the fastest-growing device (0: no growth)."""
    if not isinstance(summary.memory, MemorySection):
        return None
    vals = [float(d.growth_per_step) for d in _memory(summary) if d.growth_per_step is not None]
    return max(vals) if vals else None


def _break_sites(summary: Summary) -> dict[str, BreakSite]:
    return {f"{x.source} ({x.reason_class})": x for x in summary.compile.break_sites}


def _device(summary: Summary) -> DeviceSection | None:
    return summary.device if isinstance(summary.device, DeviceSection) else None


def _device_sum(summary: Summary, rows: Callable[[DeviceSection], list], value: Callable[[Any], float | None]
                ) -> float | None:
    """``value`` summed over a Device section's ``rows`` (a row without one counts 0); None without a device."""
    device = _device(summary)
    return None if device is None else float(sum(value(x) or 0 for x in rows(device)))


def _fallbacks_per_step(summary: Summary) -> float | None:
    return _device_sum(summary, lambda d: d.fallbacks, lambda x: x.calls_per_step)


def _coverage(summary: Summary) -> float | None:
    device = _device(summary)
    vals = [x.coverage_pct for x in device.coverage if x.coverage_pct is not None] if device else []
    return float(min(vals)) if vals else None


def _device_busy(summary: Summary) -> float | None:
    """The busiest device's busy share of a steady step (%), over every rank's steady steps with a
    device trace; None without a device."""
    device = _device(summary)
    rows = device.verdict if device else []
    steps = sum(v.steps for v in rows)
    return sum(v.busy_pct * v.steps for v in rows) / steps if steps else None


def _copy_bytes(summary: Summary) -> float | None:
    """Bytes copied between host and device per steady step, every rank and direction summed."""
    return _device_sum(summary, lambda d: d.copies, lambda x: x.bytes_per_step)


def _launch_pct(summary: Summary) -> float | None:
    """The launch cost's bound as a share of device busy time (%), over every rank and device."""
    device = _device(summary)
    busy = sum(f.busy_ms for f in device.fusion) if device else 0.0
    return 100 * sum(f.launch_ms for f in device.fusion) / busy if device and busy else None


def _sync_ms(summary: Summary) -> float | None:
    vals = [x.sync_ms for x in summary.time_split if x.sync_ms is not None]
    return float(np.mean(vals)) if vals else None


def _p90(summary: Summary) -> float | None:
    vals = [x.p90_ms for x in summary.steps if x.p90_ms is not None]
    return float(np.median(vals)) if vals else None


def _per_frame(summary: Summary) -> float | None:
    compiled = summary.compile
    return float(compiled.compile_ms) / compiled.frames_compiled if compiled.frames_compiled else None


def _tflops(summary: Summary) -> float | None:
    """Model TFLOP/s achieved per rank (``summary.efficiency``), the mean over ranks."""
    ranks = summary.efficiency.ranks
    return float(np.mean([r.tflops for r in ranks])) if ranks else None


def _mfu(summary: Summary) -> float | None:
    """MFU per rank against the summary's peak, the mean over ranks (None without a peak)."""
    values = [r.mfu_pct for r in summary.efficiency.ranks if r.mfu_pct is not None]
    return float(np.mean(values)) if values else None


def _peak_text(side: Side) -> str:
    p = side.summary.efficiency.peak
    return f"{side.label}: {p.tflops:g} TFLOP/s ({p.source})" if p.tflops else f"{side.label}: no peak"


def _devices(summary: Summary) -> str:
    return ", ".join(sorted({str(d.device) for d in _memory(summary)}))


def checklist(a: Side, b: Side, tolerance: float = TOLERANCE, loss_rtol: float = LOSS_RTOL) -> dict[str, Any]:
    """The comparison: ``rows`` (a DataFrame of ``COLUMNS``), ``loss`` (``loss_agreement``),
    ``graph_breaks`` (break sites of one run only), ``ops`` (the ops whose time per step changed
    most) and ``notes`` (what is not comparable, and why)."""
    sa, sb = a.summary, b.summary
    tp = {(side.label, n): throughput(side, n) for side in (a, b) for n in ("samples", "tokens")}
    cost = {side.label: cost_per_million(side, tp[(side.label, "tokens")]) for side in (a, b)}
    ca, cb = sa.compile, sb.compile
    loss = loss_agreement(step_values(a.per_step, "loss"), step_values(b.per_step, "loss"), loss_rtol)
    # (item, unit, better, a, b, measured, detail)
    items = [
        ("step time (median)", "ms", "lower", _step_median(sa), _step_median(sb), True, ""),
        ("step time (p90)", "ms", "lower", _p90(sa), _p90(sb), True, ""),
        ("samples/s", "1/s", "higher", tp[(a.label, "samples")], tp[(b.label, "samples")], True, ""),
        ("tokens/s", "1/s", "higher", tp[(a.label, "tokens")], tp[(b.label, "tokens")], True, ""),
        ("cost per million tokens", "USD", "lower", cost[a.label], cost[b.label], True,
         f"{a.label}: {a.price_per_hour} USD/h x {a.hosts} host(s); {b.label}: {b.price_per_hour} USD/h x "
         f"{b.hosts} host(s)" if a.price_per_hour is not None or b.price_per_hour is not None else ""),
        ("model TFLOP/s", "TFLOP/s", "higher", _tflops(sa), _tflops(sb), True,
         "FLOPs per step as torch's FlopCounterMode counts them, over the step time"),
        ("MFU", "%", "higher", _mfu(sa), _mfu(sb), True, f"{_peak_text(a)}; {_peak_text(b)}"),
        ("compile time (total)", "ms", "lower", ca.compile_ms, cb.compile_ms, True, ""),
        ("compile time per frame", "ms", "lower", _per_frame(sa), _per_frame(sb), True,
         f"{ca.frames_compiled} vs {cb.frames_compiled} frames"),
        ("graph break sites", "", "lower", ca.graph_breaks, cb.graph_breaks, False, ""),
        ("graph breaks", "", "lower", ca.graph_break_events, cb.graph_break_events, False, ""),
        ("recompiles", "", "lower", ca.recompiles, cb.recompiles, False, ""),
        ("CPU fallbacks per step", "", "lower", _fallbacks_per_step(sa), _fallbacks_per_step(sb), False, ""),
        ("falls back on the target", "% of op time", "lower", a.target_fallback_pct, b.target_fallback_pct, True,
         "ops the target backend leaves to the CPU (port-check's prediction), their share of each run's op time"
         if a.target_fallback_pct is not None else ""),
        ("op coverage", "%", "higher", _coverage(sa), _coverage(sb), False, ""),
        ("sync-point stall per step", "ms", "lower", _sync_ms(sa), _sync_ms(sb), True, ""),
        ("device busy (busiest device)", "% of step", "higher", _device_busy(sa), _device_busy(sb), True,
         "kernels' time on the device as its backend reports it to PyTorch's profiler"),
        ("host-device copies per step", "bytes", "lower", _copy_bytes(sa), _copy_bytes(sb), False, ""),
        ("launch cost (at most)", "% of device busy", "lower", _launch_pct(sa), _launch_pct(sb), True,
         "kernels x the shortest kernel: what fusing could save"),
        ("peak memory (busiest device)", "bytes", "lower", _memory_peak(sa), _memory_peak(sb), True,
         f"{_devices(sa) or '-'} vs {_devices(sb) or '-'}"),
        ("leak growth", "bytes/step", "lower", _leak_growth(sa), _leak_growth(sb), True, ""),
        ("loss: max relative difference", "", "lower", None, loss["max_rel_diff"], False, _loss_text(loss)),
    ]
    rows = []
    for item, unit, better, va, vb, measured, detail in items:
        va = None if va is None else float(va)
        vb = None if vb is None else float(vb)
        if item.startswith("loss"):
            v = ("n/a" if loss["common_steps"] == 0 else "same" if loss["first_divergent_step"] is None
                 else "diverged")
        else:
            # verdict() answers for lower-is-better numbers; swapped, for higher-is-better ones
            v = verdict(va, vb, measured, tolerance) if better == "lower" else verdict(vb, va, measured, tolerance)
        ratio = vb / va if va and vb is not None else np.nan
        rows.append({"item": item, "unit": unit, "better": better, "a": np.nan if va is None else va,
                     "b": np.nan if vb is None else vb, "ratio": ratio, "verdict": v, "detail": detail})
    sites_a, sites_b = _break_sites(sa), _break_sites(sb)
    return {
        "labels": {"a": a.label, "b": b.label},
        "rows": pd.DataFrame(rows, columns=COLUMNS),
        "loss": loss,
        "graph_breaks": {"a_only": [sites_a[k] for k in sorted(set(sites_a) - set(sites_b))],
                         "b_only": [sites_b[k] for k in sorted(set(sites_b) - set(sites_a))]},
        "ops": ops_changed(a.ops, b.ops),
        "notes": _notes(a, b, loss),
    }


def _loss_text(loss: dict[str, Any]) -> str:
    if not loss["common_steps"]:
        return "no step has a loss in both runs"
    if loss["identical"]:
        return f"identical over {loss['common_steps']} common steps"
    first = loss["first_divergent_step"]
    return (f"max |diff| {loss['max_abs_diff']:.3g} over {loss['common_steps']} common steps; "
            + (f"first beyond {loss['rtol']:g} relative at step {first}" if first is not None
               else f"within {loss['rtol']:g} relative at every step"))


def ops_changed(a: pd.DataFrame, b: pd.DataFrame, top: int = TOP_OPS) -> pd.DataFrame:
    """The (op, module path) pairs whose self time per steady captured step changed most, in
    either direction; an op of one run only counts 0 in the other."""
    cols = ["name", "module", "a_ms_per_step", "b_ms_per_step", "change_ms", "ratio"]
    if "self_ms_per_step" not in a.columns or "self_ms_per_step" not in b.columns:
        return pd.DataFrame(columns=cols)

    def per_step_ms(s: pd.DataFrame) -> pd.Series:
        return s.assign(name=s["name"].astype(str), module=s["module"].astype(str)).groupby(
            ["name", "module"])["self_ms_per_step"].sum()

    both = pd.concat([per_step_ms(a).rename("a_ms_per_step"), per_step_ms(b).rename("b_ms_per_step")],
                     axis=1).fillna(0.0)
    both["change_ms"] = both["b_ms_per_step"] - both["a_ms_per_step"]
    both["ratio"] = both["b_ms_per_step"] / both["a_ms_per_step"].where(both["a_ms_per_step"] > 0)
    order = both["change_ms"].abs().sort_values(ascending=False, kind="stable").index[:top]
    return both.loc[order].reset_index()[cols]


def _notes(a: Side, b: Side, loss: dict[str, Any]) -> list[str]:
    notes = [*a.notes, *b.notes]
    ra, rb = a.summary.run, b.summary.run
    if ra.world_size != rb.world_size:
        notes.append(f"world sizes differ ({ra.world_size} vs {rb.world_size}): step times compare "
                     "as they are, throughput adds up each run's ranks")
    na, nb = (max((x.steps or 0 for x in side.summary.steps), default=0) for side in (a, b))
    if na != nb:
        notes.append(f"{a.label} has {na} complete steps, {b.label} {nb}: step figures are each run's own, the loss "
                     "compares the steps both have")
    if ra.device != rb.device:
        notes.append(f"devices differ ({ra.device} vs {rb.device})")
    for name in ("tokens", "samples"):
        has = [s.label for s in (a, b) if (s.per_step["name"] == name).any()]
        if len(has) == 1:
            notes.append(f"only {has[0]} records {name} per step: {name}/s is not comparable "
                         f"(prof.step({name}=...) or --{name}-per-step)")
    if loss["common_steps"] == 0:
        notes.append("no loss in both runs at the same steps: loss agreement not compared")
    return notes
