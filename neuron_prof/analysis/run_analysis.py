"""``neuron_prof.analyze(run) -> RunAnalysis``: the analyses of one run, each computed once.

``Run`` reads (tables, strings resolved, ranks merged); this facade computes, like Holistic Trace
Analysis's ``TraceAnalysis``: every analysis result the report, the viewer and the exporters share
is a cached field here, named for what it holds, and the analysis modules stay pure functions
(DataFrames in, DataFrames out) that tests call directly. The scope every per-step figure is over
is chosen here once (``op_basis``, ``op_scope``), so the report and the viewer's pages cannot
disagree on it.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from neuron_prof.analysis import clock, collective_match, comm_cost, flops, sync
from neuron_prof.analysis import compile as comp
from neuron_prof.analysis import device as dev
from neuron_prof.analysis import fallbacks as fb
from neuron_prof.analysis import device_collectives as dcoll
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis import precision, streams
from neuron_prof.analysis.ops import (OP_PHASES, RUN_TIME_COLUMNS, compile_overlap, in_steps, parent_index,
                                     run_time_ops, run_time_rows, self_time, step_phases)
from neuron_prof.analysis.steps import Basis, basis_steps, step_kinds

if TYPE_CHECKING:
    from neuron_prof.store.run import Run


@dataclass(frozen=True)
class CpuFallbacks:
    """``RunAnalysis.cpu_fallbacks``."""

    table: pd.DataFrame
    """One row per op a device left to the CPU, ``run.fallbacks``' columns."""
    inside: np.ndarray
    """Per row of ``run.ops``: it is, or runs inside, such an op (its copies are the fallback's,
    not reads of device values)."""
    native: pd.DataFrame
    """(rank, device) per op a device ran itself: its reported launches, or where a rank's backend
    reports none, the ops the dispatcher said it has kernels for: coverage's native side."""


@dataclass(frozen=True)
class OpCompile:
    """Per row of ``run.ops`` (``analysis.ops.compile_overlap``): whether it ran within a
    torch.compile compile on its thread, how much compiling lies within it (run time is
    ``dur - compile_ns``), and its self time with compiling left out (``run_self_ns``: 0 for ops
    inside a compile; the op table, region costs and break-site costs start from it)."""

    inside: np.ndarray
    compile_ns: np.ndarray
    run_self_ns: np.ndarray


@dataclass(frozen=True)
class DeviceCollectives:
    """The collectives that ran as device kernels (``analysis.device_collectives``): ``kernels``
    (each collective's row with device times), ``matched`` and ``waits`` (``collective_match`` on
    device time: who reached each collective last on the device), ``overlap`` (per rank, device
    and step: communication, overlapped, exposed)."""

    kernels: pd.DataFrame
    matched: pd.DataFrame
    waits: pd.DataFrame
    overlap: pd.DataFrame


@dataclass(frozen=True)
class Efficiency:
    """``RunAnalysis.efficiency``: FLOPs and their rates over the ``op_basis`` steps
    (``analysis.flops``), read against the peaks asked for. Every row of each table, sorted: a
    display cuts them."""

    precision: str
    """What most FLOPs computed in (which of a device's peaks applies)."""
    peak_tflops: float | None
    peak_gbps: float | None
    peak_source: str
    """Where the peaks came from (``analysis.flops.resolve_peak``; ``NO_PEAK`` when none is known)."""
    ranks: pd.DataFrame
    """``flops.rank_flops`` with ``mfu_pct``."""
    steps: pd.DataFrame
    """``flops.step_flops`` with ``mfu_pct``."""
    ops: pd.DataFrame
    """``flops.op_efficiency`` with the roofline's ``bound`` and ``roof_pct``."""
    kernels: pd.DataFrame
    """``flops.kernel_efficiency`` with the roofline's ``bound`` and ``roof_pct``."""
    unknown: pd.DataFrame
    """``flops.unknown_ops``: the ops whose FLOPs are unknown."""


class RunAnalysis:
    """The analyses of ``run``, computed on first use and kept (get it with :func:`analyze`)."""

    def __init__(self, run: "Run") -> None:
        self.run = run

    def __repr__(self) -> str:
        return f"RunAnalysis({self.run!r})"

    # ---- ops: nesting, compile time, self time, and the scope per-step op figures are over

    @functools.cached_property
    def op_parent(self) -> np.ndarray:
        """Row position in ``run.ops`` of each op's enclosing op (-1: top level). The nesting pass
        is the costliest step over millions of ops; self time, sync points and compiled-region
        timing all start from it, so it is computed once per run."""
        return parent_index(self.run.ops)

    @functools.cached_property
    def op_compile(self) -> OpCompile:
        """Which ops ran while compiling, the compile time inside each, and their self time
        without it."""
        ops = self.run.ops
        inside, compile_ns = compile_overlap(ops, self.compile_spans)
        run_self = self_time(ops, self.op_parent, ops["dur"].to_numpy() - compile_ns if compile_ns.any() else None)
        return OpCompile(inside, compile_ns, run_self)

    @functools.cached_property
    def op_basis(self) -> Basis:
        """The steps op figures are over: the steady steps captured in detail, else all complete
        captured steps (``analysis.steps.basis_steps``); ``per_rank`` is what "per step" divides by."""
        return basis_steps(self.step_kinds, captured_only=True)

    @functools.cached_property
    def op_scope(self) -> np.ndarray:
        """Mask of ``run.ops``: the run-time ops (not run while compiling) of the ``op_basis`` steps."""
        return run_time_rows(self.run.ops, self.op_compile.inside, self.op_basis.steps)

    def scoped_ops(self, columns: tuple[str, ...] = RUN_TIME_COLUMNS, top_level: bool = False) -> pd.DataFrame:
        """The ``op_scope`` ops as ``columns`` with their run time and run-time self time
        (``analysis.ops.run_time_ops``): what the op table, the report and the Ops page rank."""
        return run_time_ops(self.run.ops, self.op_scope, self.op_compile.compile_ns, self.op_compile.run_self_ns,
                            columns, top_level=top_level)

    @functools.cached_property
    def op_phase(self) -> np.ndarray:
        """Each op's phase of the step, an index into ``analysis.ops.OP_PHASES``."""
        return step_phases(self.run.ops, self.op_parent)

    # ---- precision

    @functools.cached_property
    def _op_precision(self) -> np.ndarray:
        """Each op's precision (``analysis.precision.op_precision``)."""
        return precision.op_precision(self.run.ops)

    @functools.cached_property
    def _precision_time(self) -> np.ndarray:
        """Each op's weight in the precision figures (``analysis.precision.time_basis``), ns."""
        if precision.time_basis(self.run.device_kernels) == "device":
            return precision.device_ns_per_op(len(self.run.ops), self.device_correlation)
        return self.op_compile.run_self_ns.astype(np.float64)

    @functools.cached_property
    def _precision_scope(self) -> np.ndarray:
        """The ``op_scope`` ops of the forward and backward passes (recompute included): what
        autocast decides the precision of."""
        passes = np.isin(self.op_phase, [OP_PHASES.index(p) for p in ("forward", "backward", "recompute")])
        return self.op_scope & passes

    @functools.cached_property
    def precision_mix(self) -> pd.DataFrame:
        """Per rank: each precision's time per ``op_basis`` step and share (``analysis.precision``)."""
        return precision.precision_mix(self.run.ops, self._op_precision, self._precision_time, self._precision_scope,
                                       self.op_basis.per_rank)

    @functools.cached_property
    def left_in_fp32(self) -> pd.DataFrame:
        """The forward ops autocast left in fp32, per rank costliest first
        (``analysis.precision.left_in_fp32``)."""
        return precision.left_in_fp32(self.run.ops, self._op_precision, self._precision_time, self._precision_scope,
                                      self.op_phase == OP_PHASES.index("forward"), self.op_basis.per_rank)

    # ---- steps and compiling

    @functools.cached_property
    def compile_spans(self) -> pd.DataFrame:
        """When each thread was compiling (``analysis.compile.compile_spans``)."""
        return comp.compile_spans(self.run.compiles, self.run.compile_phases)

    @functools.cached_property
    def step_kinds(self) -> pd.DataFrame:
        """``run.steps`` with ``compile_ns``, ``warmup`` and ``steady`` (``analysis.steps.step_kinds``)."""
        return step_kinds(self.run.steps, self.compile_spans)

    @functools.cached_property
    def region_runs(self) -> pd.DataFrame:
        """Each run of a compiled region, with its self time and the compile time inside it
        (``analysis.compile.region_runs``)."""
        return comp.region_runs(self.run.ops, self.op_parent, self.op_compile.compile_ns)

    @functools.cached_property
    def scoped_region_runs(self) -> pd.DataFrame:
        """The ``region_runs`` of the ``op_basis`` steps: what the per-step compile figures are over."""
        runs = self.region_runs
        return runs[in_steps(runs, self.op_basis.steps)] if len(runs) else runs

    @functools.cached_property
    def graph_runs(self) -> pd.DataFrame:
        """Per compiled graph: runs, total and self ms, per ``op_basis`` step, most self time first
        (``analysis.compile.graph_runs``)."""
        return comp.graph_runs(self.scoped_region_runs, self.op_basis.per_rank)

    @functools.cached_property
    def graph_break_sites(self) -> pd.DataFrame:
        """The graph breaks by user line and reason class, with the run time of the graphs that end
        at each, per ``op_basis`` step (``analysis.compile.graph_break_sites``)."""
        return comp.graph_break_sites(self.run.graph_breaks, self.scoped_region_runs, self.op_basis.per_rank)

    # ---- sync points

    @functools.cached_property
    def sync_points(self) -> pd.DataFrame:
        """One row per sync op (``analysis.sync.sync_points``) as the report, port-check and the
        trace count them: the ops run while compiling (tracing reads values the compiled graph never
        reads again) and a CPU fallback's copies (the fallback's own) left out."""
        return sync.sync_points(self.run.ops, self.op_parent,
                                exclude=self.op_compile.inside | self.cpu_fallbacks.inside)

    # ---- FLOPs and efficiency

    @functools.cached_property
    def op_flops(self) -> flops.OpFlops:
        """Each op's FLOPs and bytes (``analysis.flops.op_flops``)."""
        return flops.op_flops(self.run.ops, self.op_parent)

    @functools.cached_property
    def _flop_rates(self) -> Efficiency:
        """:meth:`efficiency`'s tables before any peak: rates over the ``op_scope`` ops, and on a
        device an op's rate over the device time of its work (its host time is its launch)."""
        ops, keep, basis, f = self.run.ops, self.op_scope, self.op_basis, self.op_flops
        steps = flops.step_flops(ops, f, keep, basis.steps)
        run_ns = ops["dur"].to_numpy() - self.op_compile.compile_ns
        kernels = pd.DataFrame(columns=flops.KERNEL_COLUMNS)
        if len(self.run.device_kernels) and len(ops):
            depth = int(ops["depth"].max())
            kernels = flops.kernel_efficiency(self.device_correlation, f, self.op_parent, depth, basis.steps,
                                              basis.per_rank)
            device_ns = flops.op_device_ns(self.device_correlation, f, self.op_parent, depth, len(ops))
            run_ns = np.where(device_ns >= 0, device_ns, run_ns)
        return Efficiency(precision=flops.flop_precision(ops, f, keep), peak_tflops=None, peak_gbps=None,
                          peak_source=flops.NO_PEAK, ranks=flops.rank_flops(steps, ops, f, keep), steps=steps,
                          ops=flops.op_efficiency(ops, f, run_ns, keep, basis.per_rank), kernels=kernels,
                          unknown=flops.unknown_ops(ops, f, keep, basis.per_rank))

    def efficiency(self, peaks: flops.PeakRequest = flops.PeakRequest()) -> Efficiency:
        """FLOPs per ``op_basis`` step and the FLOP/s achieved per rank, step, op name and device
        kernel, with MFU and the roofline against the peaks ``peaks`` resolves to
        (``analysis.flops.resolve_peak``: measured only when asked to, for a CPU run with FLOPs)."""
        e = self._flop_rates
        rated = bool(e.ranks["flops_per_step"].fillna(0).astype(bool).any())
        tflops, gbps, source = flops.resolve_peak(e.precision, self.run.meta.get("device"), peaks.tflops, peaks.gbps,
                                                  peaks.device, peaks.calibrate and rated)
        return dataclasses.replace(e, peak_tflops=tflops, peak_gbps=gbps, peak_source=source,
                                   ranks=flops.with_mfu(e.ranks, tflops), steps=flops.with_mfu(e.steps, tflops),
                                   ops=flops.with_roofline(e.ops, tflops, gbps),
                                   kernels=flops.with_roofline(e.kernels, tflops, gbps))

    # ---- memory

    @functools.cached_property
    def memory_allocations(self) -> pd.DataFrame:
        """One row per captured allocation: lifetime, attribution, category (``analysis.memory``)."""
        run = self.run
        return mem.allocations(run.memory_events, run.memory_tensors, run.steps)

    @functools.cached_property
    def memory_timeline(self) -> pd.DataFrame:
        """Live bytes over time per device, total and per category, min/max downsampled."""
        return mem.timeline(self.memory_allocations)

    @functools.cached_property
    def memory_peaks(self) -> pd.DataFrame:
        """Each captured step's peak per device and the allocation that reached it."""
        return mem.peaks(self.memory_allocations, self.run.steps)

    @functools.cached_property
    def memory_leaks(self) -> pd.DataFrame:
        """Step-over-step growth of live memory and the sites whose allocations survive (none on a
        device read from its backend's counters: ``analysis.memory.figures_from``), with the user's
        line in the step loop they were made from and what keeps them (``analysis.memory.Keepers``)."""
        run = self.run
        return mem.leaks(self.memory_allocations, run.memory_steps, run.steps, run.process_memory,
                         figures=mem.figures_from(run.memory_steps, run.memory_sources),
                         keepers=mem.Keepers(run.memory_keepers, run.keeper_walks, run.stack, run.display_path))

    def memory_snapshot(self, step: int, by: str | list[str] = "category", rank: int = 0) -> pd.DataFrame:
        """What was live at the end of ``step`` (its boundary), grouped ``by`` category, source,
        module, op..."""
        steps = self.run.steps
        s = steps[(steps["rank"] == rank) & (steps["step"] == step)]
        if s.empty:
            raise KeyError(f"no step {step} on rank {rank} in {self.run.path}")
        return mem.snapshot(self.memory_allocations, int(s["ts"].iloc[0] + s["dur"].iloc[0]), by, rank)

    # ---- collectives

    @functools.cached_property
    def collective_offsets(self) -> pd.DataFrame:
        """Each rank's offset to rank 0's clock, as merged views apply it
        (``analysis.clock.clock_offsets``)."""
        return clock.clock_offsets(self.run.clock_sync, self.run.ranks)

    @functools.cached_property
    def collectives_matched(self) -> pd.DataFrame:
        """One row per collective (group, seq) across its ranks, on rank 0's clock: arrivals, the
        last rank, wait, transfer, missing ranks (``analysis.collective_match.matched``)."""
        run = self.run
        return collective_match.matched(run.collectives, self.collective_offsets, run.collective_groups, run.steps)

    @functools.cached_property
    def collective_waits(self) -> pd.DataFrame:
        """``run.collectives`` with aligned start/end and each rank's wait for the last arrival
        (``analysis.collective_match.waits``)."""
        return collective_match.waits(self.run.collectives, self.collectives_matched, self.collective_offsets)

    @functools.cached_property
    def collective_mismatches(self) -> pd.DataFrame:
        """Collectives the ranks of a group disagree on (``analysis.collective_match.mismatches``)."""
        return collective_match.mismatches(self.run.collectives, self.run.collective_groups)

    @functools.cached_property
    def collective_overlap(self) -> pd.DataFrame:
        """Per rank and step: time in collectives, overlapped by compute, exposed
        (``analysis.comm_cost.overlap``)."""
        run = self.run
        return comm_cost.overlap(run.collectives, run.ops, run.steps)

    # ---- the device queue

    @functools.cached_property
    def device_correlation(self) -> pd.DataFrame:
        """Each enqueued op with its host op (``op_index``: its ``run.ops`` row) and the kernel
        that ran it (``analysis.device.correlation``)."""
        run = self.run
        return dev.correlation(run.device_enqueues, run.device_kernels, run.kernel_enqueues, run.ops, self.op_parent)

    @functools.cached_property
    def cpu_fallbacks(self) -> CpuFallbacks:
        """The ops the devices left to the CPU (``analysis.fallbacks``): as each device reported
        them, and on ranks whose device reported none (backends as they ship), as the dispatcher
        named them at capture; which ops lie inside one; and the ops the devices ran themselves."""
        run = self.run
        path = fb.dispatch_paths(run.ops, run.op_dispatch)
        owner = fb.fallback_ops(run.ops, path, self.op_parent)
        reported = run.fallbacks
        found = fb.dispatch_fallbacks(run.ops, self.op_parent, owner)
        found = found[~found["rank"].isin(reported["rank"].unique())] if len(reported) else found
        if not len(found):
            table = reported
        elif not len(reported):
            table = found.astype({c: "category" for c in fb.STRING_COLUMNS})
        else:
            strings = [c for c in reported.columns if reported[c].dtype == "category"]
            table = pd.concat([reported.astype({c: str for c in strings}), found], ignore_index=True)[
                list(reported.columns)].sort_values(["rank", "ts"], ignore_index=True).astype(
                {c: "category" for c in strings})
        launched = run.device_enqueues[["rank", "device"]].astype({"device": str})
        native = fb.native_ops(run.ops, path, self.op_parent, owner)
        native = native[~native["rank"].isin(launched["rank"].unique())].astype({"device": str})
        return CpuFallbacks(table=table, inside=owner >= 0,
                            native=pd.concat([launched, native], ignore_index=True) if len(native) else launched)

    @functools.cached_property
    def device_steps(self) -> pd.DataFrame:
        """Per rank, device and complete step with a device trace: device busy and idle time, the
        host's waits for it (``analysis.device.device_steps``)."""
        run = self.run
        return dev.device_steps(run.device_kernels, run.queue_flushes, self.step_kinds, run.device_gaps)

    @functools.cached_property
    def device_collectives(self) -> DeviceCollectives:
        """Collectives on the device: their kernels with device times, matched across ranks on
        device time, and per step the communication the device's other kernels hid or not."""
        run = self.run
        kernels = dcoll.collective_kernels(run.device_kernels, run.device_enqueues, run.collectives)
        matched = collective_match.matched(kernels, self.collective_offsets, run.collective_groups)
        return DeviceCollectives(kernels, matched, collective_match.waits(kernels, matched, self.collective_offsets),
                                 dcoll.comm_overlap(run.device_kernels, self.step_kinds))

    @functools.cached_property
    def device_streams(self) -> pd.DataFrame:
        """Per rank, device, complete step and stream: kernels, busy and waiting time
        (``analysis.streams.stream_steps``)."""
        return streams.stream_steps(self.run.device_kernels, self.run.stream_waits, self.step_kinds)


_ANALYSES: "weakref.WeakKeyDictionary[Run, RunAnalysis]" = weakref.WeakKeyDictionary()


def analyze(run: "Run") -> RunAnalysis:
    """The one :class:`RunAnalysis` of ``run``: the report, the viewer and the exporters that work
    on one ``Run`` share its cached results (kept while the ``Run`` lives)."""
    analysis = _ANALYSES.get(run)
    if analysis is None:
        analysis = _ANALYSES[run] = RunAnalysis(run)
    return analysis
