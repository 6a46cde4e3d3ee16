"""``neuron_prof.analyze(run) -> RunAnalysis``: the analyses of one run, each computed once.

``Run`` reads (tables, strings resolved, ranks merged); this facade computes, like Holistic Trace
Analysis's ``TraceAnalysis``: every analysis result the report, the viewer and the exporters share
is a cached field here, named for what it holds, and the analysis modules stay pure functions
(DataFrames in, DataFrames out) that tests call directly. Which tables feed each analysis, and the
scope every per-step figure is over, are chosen here once (``op_basis``, ``op_scope``,
``device.basis``, ``comms.steady_steps``), so the report and the viewer's pages cannot disagree on
them. Members hold every row: a display cuts them.

``RunAnalysis`` itself keeps at most 25 public members, so that it reads in one sitting: the
row-level tables derived from the run (op nesting and scope, step kinds, allocations, peaks and
leaks, collectives matched across ranks, the device's correlation, fallbacks and steps) and six
parts, one per question the report answers, each owning the figures of its question:
``step_time``, ``op_time`` (with the sync points), ``compiled``, ``memory``, ``comms`` and
``device``. A part reaches the others and the run through the facade it belongs to.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from neuron_prof.analysis import clock, collective_match, comm_cost, flops, metrics, stragglers, sync
from neuron_prof.analysis import compile as comp
from neuron_prof.analysis import device as dev
from neuron_prof.analysis import fallbacks as fb
from neuron_prof.analysis import device_collectives as dcoll
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis import precision, streams
from neuron_prof.analysis.accelerator import ran_on_device
from neuron_prof.analysis.ops import (OP_PHASES, RUN_TIME_COLUMNS, comm_ops, compile_overlap, in_steps, op_stats,
                                     parent_index, phase_time, run_time_ops, run_time_rows, self_time, step_phases)
from neuron_prof.analysis.recompute import recompute_by_module
from neuron_prof.analysis.steps import (Basis, basis_steps, step_breakdown, step_kinds, step_stats, steps_per_rank,
                                       time_split)

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


@dataclass(frozen=True)
class MemoryPeak:
    """``RunAnalysis.memory_device_peaks``: a device's highest step peak and what made it."""

    row: pd.Series
    """The ``memory_peaks`` row with the most bytes (the first such step on a tie)."""
    by_category: pd.DataFrame
    """What was live then, by category (``analysis.memory.snapshot``)."""
    sites: pd.DataFrame
    """The sites whose allocations were live then, most bytes first (``analysis.memory.peak_sites``)."""


@dataclass(frozen=True)
class Stragglers:
    """The stragglers of one set of matched collectives, on host or on device time
    (``analysis.stragglers``). Every row: a display cuts them."""

    ranking: pd.DataFrame
    """``stragglers.stragglers`` with ``wait_in_steps_ns`` (the wait it caused in the steps where
    it was the significant straggler)."""
    sites: pd.DataFrame
    """``stragglers.worst_collectives``: per ranked rank, where it made the others wait longest."""
    steps: pd.DataFrame
    """``stragglers.straggler_steps``."""
    threshold_ns: float
    """The wait a step needed to name its straggler (``SHARE`` of the median steady step where no
    step was seen)."""


class RunAnalysis:
    """The analyses of ``run``, computed on first use and kept (get it with :func:`analyze`)."""

    def __init__(self, run: "Run") -> None:
        self.run = run

    def __repr__(self) -> str:
        return f"RunAnalysis({self.run!r})"

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
        inside, compile_ns = compile_overlap(ops, self.compiled.spans)
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
    def step_kinds(self) -> pd.DataFrame:
        """``run.steps`` with ``compile_ns``, ``warmup`` and ``steady`` (``analysis.steps.step_kinds``)."""
        return step_kinds(self.run.steps, self.compiled.spans)

    @functools.cached_property
    def memory_allocations(self) -> pd.DataFrame:
        """One row per captured allocation: lifetime, attribution, category (``analysis.memory``)."""
        run = self.run
        return mem.allocations(run.memory_events, run.memory_tensors, run.steps)

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
                         figures=self.memory.figures_from,
                         keepers=mem.Keepers(run.memory_keepers, run.keeper_walks, run.stack, run.display_path))

    def memory_snapshot(self, step: int, by: str | list[str] = "category", rank: int = 0) -> pd.DataFrame:
        """What was live at the end of ``step`` (its boundary), grouped ``by`` category, source,
        module, op..."""
        steps = self.run.steps
        s = steps[(steps["rank"] == rank) & (steps["step"] == step)]
        if s.empty:
            raise KeyError(f"no step {step} on rank {rank} in {self.run.path}")
        return mem.snapshot(self.memory_allocations, int(s["ts"].iloc[0] + s["dur"].iloc[0]), by, rank)

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
    def step_time(self) -> "StepTime":
        """Where a step's time goes: step statistics, warm-up steps, the phase breakdown, the time split and
        the training scalars, per rank."""
        return StepTime(self)

    @functools.cached_property
    def op_time(self) -> "OpTime":
        """What the ops cost: per-op statistics, phases, recompute, precision, FLOPs and efficiency against
        peaks, and the sync points (host reads of device values) among them."""
        return OpTime(self)

    @functools.cached_property
    def compiled(self) -> "Compiled":
        """torch.compile's cost: when threads compiled, recompiles, compile time and caches, fusions, and
        the compiled regions' runs and graph-break sites at run time."""
        return Compiled(self)

    @functools.cached_property
    def memory(self) -> "MemoryFigures":
        """Memory per device: the live-memory curve, each device's peak, where its figures come from, growth
        step over step (the tracked tensors' and the process's) and the boundaries not seen."""
        return MemoryFigures(self)

    @functools.cached_property
    def comms(self) -> "Comms":
        """Host collectives per rank: communication against compute, bandwidth, the per-op waits, what is in
        flight, the steady steps and the stragglers."""
        return Comms(self)

    @functools.cached_property
    def device(self) -> "DeviceFigures":
        """The device per step: busy and idle verdicts, queue stalls, kernels and fusion, copies, CPU
        fallbacks, coverage, custom kernels, gaps, its streams and the collectives it ran."""
        return DeviceFigures(self)


class _Part:
    """One question's figures of a run (a part of :class:`RunAnalysis`): the facade it belongs to,
    through which it reaches the other parts, and the run."""

    def __init__(self, analysis: RunAnalysis) -> None:
        self.analysis = analysis
        self.run = analysis.run


class StepTime(_Part):
    """Where a step's time goes: step statistics, warm-up steps, the phase breakdown, the time split and the
    training scalars, per rank (``RunAnalysis.step_time``; every member cached, every row kept)."""

    @functools.cached_property
    def stats(self) -> pd.DataFrame:
        """Per rank: step counts and the step time statistics over the basis steps
        (``analysis.steps.step_stats``)."""
        return step_stats(self.analysis.step_kinds)

    @functools.cached_property
    def warmup(self) -> pd.DataFrame:
        """The ``step_kinds`` rows of the warm-up steps: what the steady figures leave out."""
        kinds = self.analysis.step_kinds
        return kinds[kinds["warmup"]]

    @functools.cached_property
    def breakdown(self) -> pd.DataFrame:
        """Per rank, where the ``op_basis`` steps' wall time went by phase, mean ms per step
        (``analysis.steps.step_breakdown``)."""
        a = self.analysis
        return step_breakdown(a.op_time.top_level, a.op_basis.steps, a.op_time.phase_time)

    @functools.cached_property
    def split(self) -> pd.DataFrame:
        """Per rank, where the ``op_basis`` steps' time went: communication (the exposed part of
        ``collective_overlap`` where collectives were captured), sync (the host's measured waits for
        the device where ``waits_measured``), compute, compile, idle (``analysis.steps.time_split``)."""
        run = self.run
        exposed = self.analysis.collective_overlap if not run.collectives.empty else None
        comm = comm_ops(run.ops, self.analysis.op_parent, self.analysis.op_scope, self.analysis.op_compile.compile_ns)
        a = self.analysis
        return time_split(a.op_time.top_level, a.op_basis.steps, a.op_time.sync_points, comm, exposed,
                          run.queue_flushes if a.op_time.sync_waits_measured else None)

    @functools.cached_property
    def scalars(self) -> pd.DataFrame:
        """Per rank and logged scalar: steps, first, last, min, max, mean of its per-step values
        (``analysis.metrics.summary``)."""
        return metrics.summary(self.run.metrics)


class OpTime(_Part):
    """What the ops cost: per-op statistics, phases, recompute, precision, FLOPs and efficiency against
    peaks, and the sync points (host reads of device values) among them (``RunAnalysis.op_time``; every
    member cached, every row kept)."""

    @functools.cached_property
    def phase(self) -> np.ndarray:
        """Each op's phase of the step, an index into ``analysis.ops.OP_PHASES``."""
        return step_phases(self.run.ops, self.analysis.op_parent)

    @functools.cached_property
    def stats(self) -> pd.DataFrame:
        """Self time per (name, module) of the ``op_scope`` ops (``analysis.ops.op_stats``), with
        ``self_ms_per_step`` when there is an ``op_basis`` step: the op table of the report and of
        compare. Every row, most self time first."""
        by = ("name", "module")
        stats = op_stats(self.analysis.scoped_ops((*by, "bwd", "recompute")), by)
        if self.analysis.op_basis.per_rank:
            stats["self_ms_per_step"] = stats["self_ms"] / self.analysis.op_basis.per_rank
        return stats

    @functools.cached_property
    def top_level(self) -> pd.DataFrame:
        """The top-level ``op_scope`` ops (``scoped_ops(top_level=True)``): what a step's time splits into."""
        return self.analysis.scoped_ops(top_level=True)

    @functools.cached_property
    def phase_time(self) -> pd.DataFrame:
        """Run-time self time of the ``op_scope`` ops per step and phase (``analysis.ops.phase_time``)."""
        return phase_time(self.run.ops, self.phase, self.analysis.op_compile.run_self_ns, self.analysis.op_scope)

    @functools.cached_property
    def recompute(self) -> pd.DataFrame:
        """Activation-checkpoint recompute per module over the ``op_scope`` ops, per ``op_basis`` step
        (``analysis.recompute.recompute_by_module``)."""
        a = self.analysis
        return recompute_by_module(self.run.ops, a.op_parent, a.op_compile.run_self_ns, a.op_scope, a.op_basis.per_rank)

    @functools.cached_property
    def precision_basis(self) -> str:
        """What an op's weight in the precision figures is: its device time where the run has kernels,
        else its host self time (``analysis.precision.time_basis``)."""
        return precision.time_basis(self.run.device_kernels)

    @functools.cached_property
    def _precision(self) -> np.ndarray:
        """Each op's precision (``analysis.precision.op_precision``)."""
        return precision.op_precision(self.run.ops)

    @functools.cached_property
    def _precision_time(self) -> np.ndarray:
        """Each op's weight in the precision figures (``analysis.precision.time_basis``), ns."""
        if self.precision_basis == "device":
            return precision.device_ns_per_op(len(self.run.ops), self.analysis.device_correlation)
        return self.analysis.op_compile.run_self_ns.astype(np.float64)

    @functools.cached_property
    def _precision_scope(self) -> np.ndarray:
        """The ``op_scope`` ops of the forward and backward passes (recompute included): what
        autocast decides the precision of."""
        passes = np.isin(self.phase, [OP_PHASES.index(p) for p in ("forward", "backward", "recompute")])
        return self.analysis.op_scope & passes

    @functools.cached_property
    def precision_mix(self) -> pd.DataFrame:
        """Per rank: each precision's time per ``op_basis`` step and share (``analysis.precision``)."""
        return precision.precision_mix(self.run.ops, self._precision, self._precision_time, self._precision_scope,
                                       self.analysis.op_basis.per_rank)

    @functools.cached_property
    def left_in_fp32(self) -> pd.DataFrame:
        """The forward ops autocast left in fp32, per rank costliest first
        (``analysis.precision.left_in_fp32``)."""
        return precision.left_in_fp32(self.run.ops, self._precision, self._precision_time, self._precision_scope,
                                      self.phase == OP_PHASES.index("forward"), self.analysis.op_basis.per_rank)

    @functools.cached_property
    def op_flops(self) -> flops.OpFlops:
        """Each op's FLOPs and bytes (``analysis.flops.op_flops``)."""
        return flops.op_flops(self.run.ops, self.analysis.op_parent)

    @functools.cached_property
    def _flop_rates(self) -> Efficiency:
        """:meth:`efficiency`'s tables before any peak: rates over the ``op_scope`` ops, and on a
        device an op's rate over the device time of its work (its host time is its launch)."""
        ops, keep, basis, f = self.run.ops, self.analysis.op_scope, self.analysis.op_basis, self.op_flops
        steps = flops.step_flops(ops, f, keep, basis.steps)
        run_ns = ops["dur"].to_numpy() - self.analysis.op_compile.compile_ns
        kernels = pd.DataFrame(columns=flops.KERNEL_COLUMNS)
        if len(self.run.device_kernels) and len(ops):
            depth = int(ops["depth"].max())
            a = self.analysis
            kernels = flops.kernel_efficiency(a.device_correlation, f, a.op_parent, depth, basis.steps,
                                              basis.per_rank)
            device_ns = flops.op_device_ns(a.device_correlation, f, a.op_parent, depth, len(ops))
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

    @functools.cached_property
    def sync_points(self) -> pd.DataFrame:
        """One row per sync op (``analysis.sync.sync_points``) as the report, port-check and the
        trace count them: the ops run while compiling (tracing reads values the compiled graph never
        reads again) and a CPU fallback's copies (the fallback's own) left out."""
        return sync.sync_points(self.run.ops, self.analysis.op_parent,
                                exclude=self.analysis.op_compile.inside | self.analysis.cpu_fallbacks.inside)

    @functools.cached_property
    def sync_waits_measured(self) -> bool:
        """Whether the device side was captured (kernels, queue flushes, CPU fallbacks or copies): the
        host's waits for the device, the stalls and the Device section exist only then."""
        run = self.run
        return bool(run.device_kernels.size or run.queue_flushes.size or self.analysis.cpu_fallbacks.table.size
                    or run.device_copies.size)

    @functools.cached_property
    def sync_waits(self) -> np.ndarray | None:
        """Per ``sync_points`` row, the time its thread waited for a device queue inside it
        (``analysis.device.sync_waits``); None where not ``waits_measured``."""
        return dev.sync_waits(self.sync_points, self.run.queue_flushes) if self.sync_waits_measured else None

    @functools.cached_property
    def sync_stalls(self) -> np.ndarray | None:
        """Per ``sync_points`` row, whether the host waited for the device in it
        (``analysis.sync.stalled``); None where not ``waits_measured``."""
        if self.sync_waits is None:
            return None
        return sync.stalled(self.sync_points, self.sync_waits, self.run.device_kernels)

    @functools.cached_property
    def sync_sites(self) -> pd.DataFrame:
        """The sync points by source line, with their count per ``op_basis`` step and waits
        (``analysis.sync.sync_summary``)."""
        return sync.sync_summary(self.sync_points, self.analysis.op_basis.steps, self.sync_waits, self.sync_stalls)

    @functools.cached_property
    def on_device(self) -> bool:
        """Whether the run used an accelerator (``analysis.accelerator.ran_on_device``)."""
        return ran_on_device(self.run)


class Compiled(_Part):
    """torch.compile's cost: when threads compiled, recompiles, compile time and caches, fusions, and the
    compiled regions' runs and graph-break sites at run time (``RunAnalysis.compiled``; every member
    cached, every row kept)."""

    @functools.cached_property
    def spans(self) -> pd.DataFrame:
        """When each thread was compiling (``analysis.compile.compile_spans``)."""
        return comp.compile_spans(self.run.compiles, self.run.compile_phases)

    @functools.cached_property
    def recompiles(self) -> pd.DataFrame:
        """Per frame: recompiles, failed guards, cache limit hit (``analysis.compile.recompile_summary``)."""
        return comp.recompile_summary(self.run.recompiles, self.run.compiles)

    @functools.cached_property
    def times(self) -> pd.DataFrame:
        """Per compile: total and per-phase ms (``analysis.compile.compile_time``). Every row."""
        return comp.compile_time(self.run.compiles, self.run.compile_phases)

    @functools.cached_property
    def cache(self) -> pd.DataFrame:
        """Per compile cache: hits, misses, bypasses, hit rate (``analysis.compile.cache_stats``)."""
        return comp.cache_stats(self.run.compile_cache)

    @functools.cached_property
    def fusions(self) -> pd.DataFrame:
        """Generated kernels by how many FX nodes they fuse, most first (``analysis.compile.top_fusions``)."""
        return comp.top_fusions(self.run.fusions)

    @functools.cached_property
    def region_runs(self) -> pd.DataFrame:
        """Each run of a compiled region, with its self time and the compile time inside it
        (``analysis.compile.region_runs``)."""
        return comp.region_runs(self.run.ops, self.analysis.op_parent, self.analysis.op_compile.compile_ns)

    @functools.cached_property
    def scoped_region_runs(self) -> pd.DataFrame:
        """The ``region_runs`` of the ``op_basis`` steps: what the per-step compile figures are over."""
        runs = self.region_runs
        return runs[in_steps(runs, self.analysis.op_basis.steps)] if len(runs) else runs

    @functools.cached_property
    def graph_runs(self) -> pd.DataFrame:
        """Per compiled graph: runs, total and self ms, per ``op_basis`` step, most self time first
        (``analysis.compile.graph_runs``)."""
        return comp.graph_runs(self.scoped_region_runs, self.analysis.op_basis.per_rank)

    @functools.cached_property
    def break_sites(self) -> pd.DataFrame:
        """The graph breaks by user line and reason class, with the run time of the graphs that end
        at each, per ``op_basis`` step (``analysis.compile.graph_break_sites``)."""
        return comp.graph_break_sites(self.run.graph_breaks, self.scoped_region_runs, self.analysis.op_basis.per_rank)


class MemoryFigures(_Part):
    """Memory per device: the live-memory curve, each device's peak, where its figures come from, growth
    step over step (the tracked tensors' and the process's) and the boundaries not seen.
    (``RunAnalysis.memory``; every member cached, every row kept)."""

    @functools.cached_property
    def timeline(self) -> pd.DataFrame:
        """Live bytes over time per device, total and per category, min/max downsampled."""
        return mem.timeline(self.analysis.memory_allocations)

    @functools.cached_property
    def device_peaks(self) -> dict[tuple[int, str], MemoryPeak]:
        """Per (rank, device) with ``memory_peaks``: the highest, what was live then by category and
        the sites that held it."""
        peaks, allocs = self.analysis.memory_peaks, self.analysis.memory_allocations
        out: dict[tuple[int, str], MemoryPeak] = {}
        if peaks.empty:
            return out
        for (rank, device), p in peaks.groupby([peaks["rank"], peaks["device"].astype(str)], sort=False):
            best = p.loc[p["bytes"].idxmax()]
            ts = int(best["ts"])
            out[(int(rank), device)] = MemoryPeak(best, mem.snapshot(allocs, ts, "category", int(rank), device),
                                                  mem.peak_sites(allocs, int(rank), device, ts))
        return out

    @functools.cached_property
    def figures_from(self) -> pd.DataFrame:
        """Per (rank, device): where its memory figures come from, the allocator's events or the
        backend's counters (``analysis.memory.figures_from``)."""
        return mem.figures_from(self.run.memory_steps, self.run.memory_sources)

    @functools.cached_property
    def growth(self) -> pd.DataFrame:
        """Per rank and device: step-over-step growth of the live bytes at step boundaries
        (``analysis.memory.growth``)."""
        return mem.growth(self.run.memory_steps)

    @functools.cached_property
    def unseen_steps(self) -> dict[tuple[int, str], list[int]]:
        """Per (rank, device): the steps whose memory was not seen (``analysis.memory.unseen_steps``)."""
        return mem.unseen_steps(self.run.memory_steps, self.run.process_memory)

    @functools.cached_property
    def process_growth(self) -> pd.DataFrame:
        """Per rank: the process's resident memory over the steps and its growth
        (``analysis.memory.process_growth``)."""
        return mem.process_growth(self.run.process_memory, self.run.steps)


class Comms(_Part):
    """Host collectives per rank: communication against compute, bandwidth, the per-op waits, what is in
    flight, the steady steps and the stragglers (``RunAnalysis.comms``; every member cached, every row
    kept)."""

    @functools.cached_property
    def overlap_by_rank(self) -> pd.DataFrame:
        """``collective_overlap`` per rank over the steady steps (``analysis.comm_cost.overlap_by_rank``)."""
        return comm_cost.overlap_by_rank(self.analysis.collective_overlap, self.analysis.step_kinds)

    @functools.cached_property
    def bandwidth(self) -> pd.DataFrame:
        """Achieved bandwidth per group and op of the ``collectives_matched``
        (``analysis.comm_cost.group_bandwidth``)."""
        return comm_cost.group_bandwidth(comm_cost.bandwidth(self.analysis.collectives_matched))

    @functools.cached_property
    def by_op(self) -> pd.DataFrame:
        """Time and waits per group and op, collectives per ``steady_steps`` step
        (``analysis.comm_cost.by_op``)."""
        a = self.analysis
        return comm_cost.by_op(a.collective_waits, a.collectives_matched, self.steady_steps.steps)

    @functools.cached_property
    def in_flight(self) -> pd.DataFrame:
        """Per rank, the collectives issued and never completed: what a hung job was stuck in
        (``analysis.collective_match.in_flight``)."""
        return collective_match.in_flight(self.run.collectives, self.analysis.collectives_matched)

    @functools.cached_property
    def steady_steps(self) -> stragglers.SteadySteps:
        """The steps per-step collective figures are over and their median time
        (``analysis.stragglers.steady_steps``)."""
        return stragglers.steady_steps(self.analysis.step_kinds)

    @functools.cached_property
    def stragglers(self) -> Stragglers:
        """The stragglers on host time (``collectives_matched``), neuron_prof's own work left out of
        what a rank caused (``analysis.collective_match.own_spans``)."""
        own = collective_match.own_spans(self.run.steps, self.analysis.collective_offsets)
        return self.rank_stragglers(self.analysis.collectives_matched, self.analysis.collective_waits, own)

    def rank_stragglers(self, matched: pd.DataFrame, waits: pd.DataFrame,
                        own: stragglers.Spans | None = None) -> Stragglers:
        """:class:`Stragglers` of ``matched`` with their per-rank ``waits``, ``own`` (neuron_prof's own
        work, none by default) left out of what a rank caused. Host and device stragglers alike."""
        own = stragglers.NO_SPANS if own is None else own
        kinds = self.analysis.step_kinds
        per_step = stragglers.straggler_steps(waits, kinds, own)
        ranking = stragglers.stragglers(matched, waits, kinds, own)
        in_steps_ns = [int(per_step[(per_step["rank"] == r) & per_step["significant"]]["wait_caused_ns"].sum())
                       for r in ranking["rank"]]
        ranking = ranking.assign(wait_in_steps_ns=pd.Series(in_steps_ns, index=ranking.index, dtype=np.int64))
        threshold = (per_step["threshold_ns"].iloc[0] if len(per_step)
                     else stragglers.SHARE * self.steady_steps.median_ns)
        return Stragglers(ranking=ranking, sites=stragglers.worst_collectives(matched, waits, ranking), steps=per_step,
                          threshold_ns=float(threshold))


class DeviceFigures(_Part):
    """The device per step: busy and idle verdicts, queue stalls, kernels and fusion, copies, CPU fallbacks,
    coverage, custom kernels, gaps, its streams and the collectives it ran (``RunAnalysis.device``;
    every member cached, every row kept)."""

    @functools.cached_property
    def streams(self) -> pd.DataFrame:
        """Per rank, device, complete step and stream: kernels, busy and waiting time
        (``analysis.streams.stream_steps``)."""
        return streams.stream_steps(self.run.device_kernels, self.run.stream_waits, self.analysis.step_kinds)

    @functools.cached_property
    def basis(self) -> Basis:
        """The ``op_basis`` steps that have a device trace (``analysis.device.traced_steps``: a device
        gap's steps left out): what every per-step device figure is over."""
        steps = dev.traced_steps(self.analysis.op_basis.steps, self.run.device_gaps)
        return Basis(steps, self.analysis.op_basis.kind, steps_per_rank(steps))

    @functools.cached_property
    def verdicts(self) -> pd.DataFrame:
        """Per rank and step, what bounded it (``analysis.device.step_verdicts`` of ``device_steps``)
        and whether it was a warm-up or a steady step."""
        verdicts = dev.step_verdicts(self.analysis.device_steps)
        if len(verdicts):
            flags = self.analysis.step_kinds.set_index(["rank", "step"])[["warmup", "steady"]]
            verdicts = verdicts.join(flags, on=["rank", "step"])
        return verdicts

    @functools.cached_property
    def verdict_summary(self) -> pd.DataFrame:
        """Per rank and verdict over the ``device_basis`` steps (``analysis.device.verdict_summary``)."""
        return dev.verdict_summary(self.verdicts, self.basis.steps)

    @functools.cached_property
    def queue_stalls(self) -> pd.DataFrame:
        """The host's waits for a device queue by line, host op, reason and device, per
        ``device_basis`` step (``analysis.device.stalls``)."""
        return dev.stalls(self.run.queue_flushes, self.basis.steps)

    @functools.cached_property
    def top_kernels(self) -> pd.DataFrame:
        """Device kernels by time per ``device_basis`` step, most first (``analysis.device.top_kernels``).
        Every row."""
        return dev.top_kernels(self.run.device_kernels, self.analysis.device_correlation, self.basis.steps)

    @functools.cached_property
    def fusion(self) -> pd.DataFrame:
        """Per rank and device: kernels, ops per kernel, one-op kernels and the launch cost
        (``analysis.device.fusion``)."""
        return dev.fusion(self.run.device_kernels)

    @functools.cached_property
    def unfused(self) -> pd.DataFrame:
        """Runs of one-op kernels a compiler could fuse, costliest first
        (``analysis.device.unfused_sequences``). Every row."""
        return dev.unfused_sequences(self.run.device_kernels, self.analysis.device_correlation, self.basis.steps)

    @functools.cached_property
    def copies(self) -> pd.DataFrame:
        """Device copies per rank, device, direction and line, over the run and per ``device_basis``
        step (``analysis.device.copy_summary``)."""
        return dev.copy_summary(self.run.device_copies, self.basis.steps)

    @functools.cached_property
    def fallbacks(self) -> pd.DataFrame:
        """The ``cpu_fallbacks`` per rank, device and op, over the run and per ``device_basis`` step
        (``analysis.device.fallback_summary``)."""
        return dev.fallback_summary(self.analysis.cpu_fallbacks.table, self.basis.steps)

    @functools.cached_property
    def coverage(self) -> pd.DataFrame:
        """Per rank and device: the ops it ran itself and those it left to the CPU
        (``analysis.device.coverage``)."""
        return dev.coverage(self.analysis.cpu_fallbacks.native, self.analysis.cpu_fallbacks.table)

    @functools.cached_property
    def custom_kernels(self) -> pd.DataFrame:
        """Per rank, device and custom kernel: runs, device time, lines and the compiled graphs it ran
        in (``analysis.device.custom_kernels``)."""
        ops, parent = self.run.ops, self.analysis.op_parent
        return dev.custom_kernels(self.run.device_kernels, self.analysis.device_correlation, self.basis.steps,
                                  lambda rows: comp.compiled_graph_of(ops, parent, rows))

    @functools.cached_property
    def gap_steps(self) -> pd.DataFrame:
        """Per device gap, the steps it overlaps and why (``analysis.device.gap_steps``)."""
        return dev.gap_steps(self.run.device_gaps, self.run.steps)

    @functools.cached_property
    def comm_summary(self) -> pd.DataFrame:
        """Per rank and device, communication per ``device_basis`` step: overlapped and exposed
        (``analysis.device_collectives.comm_summary``)."""
        return dcoll.comm_summary(self.analysis.device_collectives.overlap, self.basis.steps)

    @functools.cached_property
    def comm_waits(self) -> pd.DataFrame:
        """Streams that stood idle waiting for a collective, by the line that issued it
        (``analysis.device_collectives.comm_waits``)."""
        run = self.run
        kernels = self.analysis.device_collectives.kernels
        return dcoll.comm_waits(run.stream_waits, run.event_enqueues, run.collectives, kernels,
                                self.basis.steps)

    @functools.cached_property
    def stragglers(self) -> Stragglers | None:
        """The stragglers on device time (``device_collectives.matched``); None where no collective
        ran as a device kernel."""
        found = self.analysis.device_collectives
        return self.analysis.comms.rank_stragglers(found.matched, found.waits) if len(found.matched) else None

    @functools.cached_property
    def stream_overlap(self) -> pd.DataFrame:
        """Per rank, device and step: the time streams ran kernels at once
        (``analysis.streams.stream_overlap``)."""
        return streams.stream_overlap(self.run.device_kernels, self.streams, self.analysis.step_kinds)

    @functools.cached_property
    def stream_summary(self) -> pd.DataFrame:
        """Per rank, device and stream, per ``device_basis`` step: kernels, busy and waiting ms
        (``analysis.streams.stream_summary``)."""
        return streams.stream_summary(self.streams, self.basis.steps)

    @functools.cached_property
    def several_stream_steps(self) -> pd.DataFrame:
        """``device_streams`` of the devices that ran more than one stream or waited for one, with
        each step's overlap (``analysis.streams.several_stream_steps``)."""
        return streams.several_stream_steps(self.streams, self.stream_overlap)

    @functools.cached_property
    def stream_overlap_summary(self) -> pd.DataFrame:
        """Per rank and device that ran more than one stream: busy and overlap per ``device_basis``
        step (``analysis.streams.overlap_summary``)."""
        return streams.overlap_summary(self.streams, self.stream_overlap, self.basis.steps)

    @functools.cached_property
    def stream_wait_sites(self) -> pd.DataFrame:
        """Where streams waited for another stream, by host line (``analysis.streams.wait_sites``)."""
        return streams.wait_sites(self.run.stream_waits, self.run.event_enqueues, self.basis.steps)


_ANALYSES: "weakref.WeakKeyDictionary[Run, RunAnalysis]" = weakref.WeakKeyDictionary()


def analyze(run: "Run") -> RunAnalysis:
    """The one :class:`RunAnalysis` of ``run``: the report, the viewer and the exporters that work
    on one ``Run`` share its cached results (kept while the ``Run`` lives)."""
    analysis = _ANALYSES.get(run)
    if analysis is None:
        analysis = _ANALYSES[run] = RunAnalysis(run)
    return analysis
