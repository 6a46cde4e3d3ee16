"""The migration verdict: the same job on two devices, or two runs of it, one checklist row each
(step time, throughput, cost per token, compile stability, coverage, sync stalls, memory, loss
agreement), and the ops whose time changed most: typed rows (:class:`Checklist`).

Built on each run's :class:`Figures` (the report's numbers: ``reports.compare`` reads them from
the run's summary) and on what those do not keep: each step's loss (``analysis.metrics``) and the
time of every (op, module path) rather than the top few. ``a`` is the baseline, ``b`` the run
compared with it; ``ratio`` is b / a; a row's ``verdict`` says whether b is better, worse or the
same (measured numbers within ``tolerance`` are the same), by the row's own sense (``higher``:
throughput).

Throughput counts each rank's own ``tokens``/``samples`` (``prof.step(tokens=...)``,
``--tokens-per-step``): a run's tokens/s adds up its ranks' (each rank's tokens over its steady
steps' time). Cost per million tokens: ``price`` per instance-hour (one instance per host the run's
ranks ran on) over those tokens.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from neuron_prof.analysis.metrics import per_step, step_values

TOLERANCE = 0.05
"""Relative change of a measured (continuous) number still called the same."""
LOSS_RTOL = 1e-3
"""Relative difference of a step's loss beyond which two runs have diverged there (float32
arithmetic on different hardware agrees to about this in the first steps)."""
TOP_OPS = 10


@dataclass(frozen=True)
class Figures:
    """The numbers of one run the checklist reads, each the report's own (None: the run has none)."""

    step_median_ms: float | None
    """The median over ranks of each rank's median step time (the Overview's number)."""
    step_p90_ms: float | None
    """The median over ranks of each rank's p90 step time."""
    complete_steps: int
    """The most complete steps of any rank."""
    compile_ms: float
    frames_compiled: int
    graph_break_sites: int
    graph_break_events: int
    recompiles: int
    break_sites: list[str]
    """Each graph break site as ``source (reason class)``: what tells one run's sites from the other's."""
    fallbacks_per_step: float | None
    coverage_pct: float | None
    """The lowest op coverage of any rank and device."""
    device_busy_pct: float | None
    """The busiest device's busy share of a steady step, over every rank's steady steps with a trace."""
    copy_bytes_per_step: float | None
    """Bytes copied between host and device per steady step, every rank and direction summed."""
    launch_pct: float | None
    """The launch cost's bound as a share of device busy time, over every rank and device."""
    sync_ms: float | None
    """Sync-point stall per step, the mean over ranks."""
    tflops: float | None
    """Model TFLOP/s achieved per rank, the mean over ranks."""
    mfu_pct: float | None
    """MFU per rank against the peak, the mean over ranks (None without a peak)."""
    peak_tflops: float | None
    peak_source: str
    memory_peak: float | None
    """The highest memory peak of any device (bytes allocated since capture began)."""
    leak_growth: float | None
    """Live-memory growth per step of the fastest-growing device (0: no growth)."""
    memory_devices: list[str]
    world_size: int | None
    device: str | None


@dataclass
class Side:
    """One run of the comparison: its label, figures, per-step scalars and op times."""

    label: str
    figures: Figures
    metrics: pd.DataFrame
    """``Run.metrics``."""
    steps: pd.DataFrame
    """``RunAnalysis.step_kinds``."""
    ops: pd.DataFrame
    """``RunAnalysis.op_time.stats``: self time per (name, module) with ``self_ms_per_step``."""
    hosts: int = 1
    price_per_hour: float | None = None
    target_fallback_pct: float | None = None
    """% of its op time in ops that fall back to the CPU on the comparison's target backend
    (``reports.port.port_check``); None without a target."""
    notes: list[str] = field(default_factory=list)

    @functools.cached_property
    def per_step(self) -> pd.DataFrame:
        """``analysis.metrics.per_step`` of its metrics (throughput, the loss and the notes read it)."""
        return per_step(self.metrics)


@dataclass(frozen=True)
class CheckRow:
    """One check: b against a in ``unit`` (``better``: lower or higher), with its verdict."""

    item: str
    unit: str
    better: str
    a: float | None
    b: float | None
    ratio: float | None
    verdict: str
    detail: str


@dataclass(frozen=True)
class LossAgreement:
    """Over the steps both runs have a loss for: the largest absolute and relative difference,
    whether they are identical, and the first step where they differ by more than ``rtol``
    (relative to the baseline's loss; None: never)."""

    common_steps: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    identical: bool | None
    first_divergent_step: int | None
    rtol: float


@dataclass(frozen=True)
class OpChange:
    """An (op, module path) pair's self time per steady captured step in each run."""

    name: str
    module: str
    a_ms_per_step: float
    b_ms_per_step: float
    change_ms: float
    ratio: float | None
    """b / a; None where a never ran it."""


@dataclass(frozen=True)
class Checklist:
    """The comparison: one row per check, the loss agreement, the graph break sites of one run
    only (``Figures.break_sites``' keys), the ops whose time per step changed most, and what is not
    comparable, and why."""

    labels: tuple[str, str]
    rows: list[CheckRow]
    loss: LossAgreement
    breaks_a_only: list[str]
    breaks_b_only: list[str]
    ops: list[OpChange]
    notes: list[str]


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


def loss_agreement(a: pd.Series, b: pd.Series, rtol: float = LOSS_RTOL) -> LossAgreement:
    """The agreement of two runs' losses per step (:class:`LossAgreement`)."""
    common = a.index.intersection(b.index).sort_values()
    if not len(common):
        return LossAgreement(0, None, None, None, None, rtol)
    va, vb = a.loc[common].to_numpy(float), b.loc[common].to_numpy(float)
    diff = np.abs(vb - va)
    rel = diff / np.maximum(np.abs(va), np.finfo(float).tiny)
    over = np.flatnonzero(rel > rtol)
    return LossAgreement(int(len(common)), float(diff.max()), float(rel.max()), bool((va == vb).all()),
                         int(common[over[0]]) if len(over) else None, rtol)


def _number(v: float | None) -> float | None:
    """A figure as a float, a missing one (None, NaN) as None."""
    return None if v is None or math.isnan(float(v)) else float(v)


def _per_frame(f: Figures) -> float | None:
    return float(f.compile_ms) / f.frames_compiled if f.frames_compiled else None


def _peak_text(side: Side) -> str:
    f = side.figures
    return f"{side.label}: {f.peak_tflops:g} TFLOP/s ({f.peak_source})" if f.peak_tflops else f"{side.label}: no peak"


def _devices(f: Figures) -> str:
    return ", ".join(sorted(set(f.memory_devices)))


def _row(item: str, unit: str, better: str, va: float | None, vb: float | None, measured: bool, detail: str,
         tolerance: float, loss: LossAgreement) -> CheckRow:
    va, vb = _number(va), _number(vb)
    if item.startswith("loss"):
        v = "n/a" if loss.common_steps == 0 else "same" if loss.first_divergent_step is None else "diverged"
    else:
        # verdict() answers for lower-is-better numbers; swapped, for higher-is-better ones
        v = verdict(va, vb, measured, tolerance) if better == "lower" else verdict(vb, va, measured, tolerance)
    return CheckRow(item, unit, better, va, vb, vb / va if va and vb is not None else None, v, detail)


def checklist(a: Side, b: Side, tolerance: float = TOLERANCE, loss_rtol: float = LOSS_RTOL) -> Checklist:
    """The comparison of ``b`` against the baseline ``a`` (:class:`Checklist`)."""
    fa, fb = a.figures, b.figures
    tp = {(side.label, n): throughput(side, n) for side in (a, b) for n in ("samples", "tokens")}
    cost = {side.label: cost_per_million(side, tp[(side.label, "tokens")]) for side in (a, b)}
    loss = loss_agreement(step_values(a.per_step, "loss"), step_values(b.per_step, "loss"), loss_rtol)
    # (item, unit, better, a, b, measured, detail)
    items = [
        ("step time (median)", "ms", "lower", fa.step_median_ms, fb.step_median_ms, True, ""),
        ("step time (p90)", "ms", "lower", fa.step_p90_ms, fb.step_p90_ms, True, ""),
        ("samples/s", "1/s", "higher", tp[(a.label, "samples")], tp[(b.label, "samples")], True, ""),
        ("tokens/s", "1/s", "higher", tp[(a.label, "tokens")], tp[(b.label, "tokens")], True, ""),
        ("cost per million tokens", "USD", "lower", cost[a.label], cost[b.label], True,
         f"{a.label}: {a.price_per_hour} USD/h x {a.hosts} host(s); {b.label}: {b.price_per_hour} USD/h x "
         f"{b.hosts} host(s)" if a.price_per_hour is not None or b.price_per_hour is not None else ""),
        ("model TFLOP/s", "TFLOP/s", "higher", fa.tflops, fb.tflops, True,
         "FLOPs per step as torch's FlopCounterMode counts them, over the step time"),
        ("MFU", "%", "higher", fa.mfu_pct, fb.mfu_pct, True, f"{_peak_text(a)}; {_peak_text(b)}"),
        ("compile time (total)", "ms", "lower", fa.compile_ms, fb.compile_ms, True, ""),
        ("compile time per frame", "ms", "lower", _per_frame(fa), _per_frame(fb), True,
         f"{fa.frames_compiled} vs {fb.frames_compiled} frames"),
        ("graph break sites", "", "lower", fa.graph_break_sites, fb.graph_break_sites, False, ""),
        ("graph breaks", "", "lower", fa.graph_break_events, fb.graph_break_events, False, ""),
        ("recompiles", "", "lower", fa.recompiles, fb.recompiles, False, ""),
        ("CPU fallbacks per step", "", "lower", fa.fallbacks_per_step, fb.fallbacks_per_step, False, ""),
        ("falls back on the target", "% of op time", "lower", a.target_fallback_pct, b.target_fallback_pct, True,
         "ops the target backend leaves to the CPU (port-check's prediction), their share of each run's op time"
         if a.target_fallback_pct is not None else ""),
        ("op coverage", "%", "higher", fa.coverage_pct, fb.coverage_pct, False, ""),
        ("sync-point stall per step", "ms", "lower", fa.sync_ms, fb.sync_ms, True, ""),
        ("device busy (busiest device)", "% of step", "higher", fa.device_busy_pct, fb.device_busy_pct, True,
         "kernels' time on the device as its backend reports it to PyTorch's profiler"),
        ("host-device copies per step", "bytes", "lower", fa.copy_bytes_per_step, fb.copy_bytes_per_step, False, ""),
        ("launch cost (at most)", "% of device busy", "lower", fa.launch_pct, fb.launch_pct, True,
         "kernels x the shortest kernel: what fusing could save"),
        ("peak memory (busiest device)", "bytes", "lower", fa.memory_peak, fb.memory_peak, True,
         f"{_devices(fa) or '-'} vs {_devices(fb) or '-'}"),
        ("leak growth", "bytes/step", "lower", fa.leak_growth, fb.leak_growth, True, ""),
        ("loss: max relative difference", "", "lower", None, loss.max_rel_diff, False, _loss_text(loss)),
    ]
    sites_a, sites_b = set(fa.break_sites), set(fb.break_sites)
    return Checklist(labels=(a.label, b.label), rows=[_row(*item, tolerance, loss) for item in items], loss=loss,
                     breaks_a_only=sorted(sites_a - sites_b), breaks_b_only=sorted(sites_b - sites_a),
                     ops=ops_changed(a.ops, b.ops), notes=_notes(a, b, loss))


def _loss_text(loss: LossAgreement) -> str:
    if not loss.common_steps:
        return "no step has a loss in both runs"
    if loss.identical:
        return f"identical over {loss.common_steps} common steps"
    first = loss.first_divergent_step
    return (f"max |diff| {loss.max_abs_diff:.3g} over {loss.common_steps} common steps; "
            + (f"first beyond {loss.rtol:g} relative at step {first}" if first is not None
               else f"within {loss.rtol:g} relative at every step"))


def ops_changed(a: pd.DataFrame, b: pd.DataFrame, top: int = TOP_OPS) -> list[OpChange]:
    """The (op, module path) pairs whose self time per steady captured step changed most, in
    either direction; an op of one run only counts 0 in the other."""
    if "self_ms_per_step" not in a.columns or "self_ms_per_step" not in b.columns:
        return []

    def per_step_ms(s: pd.DataFrame) -> pd.Series:
        return s.assign(name=s["name"].astype(str), module=s["module"].astype(str)).groupby(
            ["name", "module"])["self_ms_per_step"].sum()

    both = pd.concat([per_step_ms(a).rename("a_ms_per_step"), per_step_ms(b).rename("b_ms_per_step")],
                     axis=1).fillna(0.0)
    both["change_ms"] = both["b_ms_per_step"] - both["a_ms_per_step"]
    both["ratio"] = both["b_ms_per_step"] / both["a_ms_per_step"].where(both["a_ms_per_step"] > 0)
    order = both["change_ms"].abs().sort_values(ascending=False, kind="stable").index[:top]
    return [OpChange(str(name), str(module), float(r.a_ms_per_step), float(r.b_ms_per_step), float(r.change_ms),
                     _number(r.ratio)) for (name, module), r in zip(order, both.loc[order].itertuples(index=False))]


def _notes(a: Side, b: Side, loss: LossAgreement) -> list[str]:
    notes = [*a.notes, *b.notes]
    fa, fb = a.figures, b.figures
    if fa.world_size != fb.world_size:
        notes.append(f"world sizes differ ({fa.world_size} vs {fb.world_size}): step times compare "
                     "as they are, throughput adds up each run's ranks")
    if fa.complete_steps != fb.complete_steps:
        notes.append(f"{a.label} has {fa.complete_steps} complete steps, {b.label} {fb.complete_steps}: step figures "
                     "are each run's own, the loss compares the steps both have")
    if fa.device != fb.device:
        notes.append(f"devices differ ({fa.device} vs {fb.device})")
    for name in ("tokens", "samples"):
        has = [s.label for s in (a, b) if (s.per_step["name"] == name).any()]
        if len(has) == 1:
            notes.append(f"only {has[0]} records {name} per step: {name}/s is not comparable "
                         f"(prof.step({name}=...) or --{name}-per-step)")
    if loss.common_steps == 0:
        notes.append("no loss in both runs at the same steps: loss agreement not compared")
    return notes
