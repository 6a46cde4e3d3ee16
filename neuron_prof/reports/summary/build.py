"""``summarize(run) -> Summary``: the run's summary, assembled from the analyses.

Step statistics describe the steady steps (not the first step of a rank, not steps in which
torch.compile compiled: ``analysis.steps``); op, sync and graph figures per step are over the
steady captured steps, with compile time and compile-time ops left out. Each section is built
from analysis DataFrames whose columns are its rows' fields (``analysis.records`` rows, so
numpy scalars are plain and NaN is None), which is what keeps ``report --json`` as it was.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from neuron_prof.analysis import compile as comp
from neuron_prof.analysis import device as dev
from neuron_prof.analysis import device_collectives as dcoll
from neuron_prof.analysis import flops
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis import metrics
from neuron_prof.analysis import precision
from neuron_prof.analysis import streams
from neuron_prof.analysis.accelerator import ran_on_device
from neuron_prof.analysis.collective_match import in_flight, own_spans
from neuron_prof.analysis.comm_cost import bandwidth, group_bandwidth, overlap_by_rank
from neuron_prof.analysis.intervals import length_by_key
from neuron_prof.analysis.ops import comm_ops, in_steps, op_stats, phase_time
from neuron_prof.reports.records import records
from neuron_prof.analysis.recompute import recompute_by_module
from neuron_prof.analysis.run_analysis import RunAnalysis, analyze
from neuron_prof.analysis.steps import step_breakdown, step_stats, steps_per_rank, time_split
from neuron_prof.analysis.stragglers import NO_SPANS, SHARE, Spans, steady_steps, straggler_steps, stragglers
from neuron_prof.analysis.sync import stalled, sync_summary
from neuron_prof.store.run import Run
from neuron_prof.reports.summary.codec import ABSENT
from neuron_prof.reports.summary.sections import (
    Bandwidth, BreakSite, CacheStats, CategoryBytes, ClockOffset, CollectiveGroup, CollectiveOp,
    CollectivesNotCaptured, CollectivesSection, CollectorFailure, CommWait, CommandExit, CompileSection,
    CompileTime, Conflict, Coverage, CustomKernel, DamagedFile, DetailCut, DeviceComm, DeviceCommStep, DeviceCopy,
    DeviceGap, DeviceSection, DeviceStep,
    DeviceThresholds, DeviceVerdict, Dump, DumpCollective, DumpQueue, DumpThread, EfficiencySection, Fallback,
    FlopsRank, FlopsStep, FlopsUnknown, Fp32Op, FrameRecompiles, FusedKernel, Fusion, GraphRun, Health, InFlight,
    KernelEfficiency, MemoryDevice, MemoryLeak, MemoryPeak, MemorySection, MetricSummary, Mismatch, NoStragglerSite,
    NotCaptured, OpEfficiency, OpRow, OpsSection, OutOfMemory, Overlap, Peak, PeakSite, PrecisionSection,
    PrecisionShare, ProcessMemory, RankHealth, Recompute, RunFacts, Stall, Startup, StepBreakdown, StepStats,
    Straggler, StragglerSite, StragglerStep, StreamOverlap, StreamStep, StreamUse, StreamWaitSite, Summary,
    SyncSection, SyncSite, TimeSplit, TopKernel, UnfusedRun, WarmupStep)

__all__ = ["TOP_N", "STEP_NUMBERING", "summarize", "run_op_stats", "command_exit", "peak_for", "with_peak"]

TOP_N = 10
STEP_NUMBERING = ("steps count from 0: step N ends at the (N+1)-th step boundary, a prof.step() call or, under "
                  "`record` and auto_step, the (N+1)-th return of the training optimizer's step() (Hugging Face "
                  "Trainer's global_step N+1)")

R = TypeVar("R")


def _rows(kind: type[R], df: pd.DataFrame) -> list[R]:
    """The rows of ``df`` as ``kind`` (its columns are the kind's fields)."""
    return [kind(**r) for r in records(df)]


def run_op_stats(run: Run, by: tuple[str, ...] = ("name", "module")) -> pd.DataFrame:
    """``op_stats`` over the op scope (``RunAnalysis.scoped_ops``: the run-time ops of the steady
    captured steps), with ``self_ms_per_step`` when there is such a step."""
    analysis = analyze(run)
    stats = op_stats(analysis.scoped_ops(tuple(dict.fromkeys((*by, "bwd", "recompute")))), by)
    if analysis.op_basis.per_rank:
        stats["self_ms_per_step"] = stats["self_ms"] / analysis.op_basis.per_rank
    return stats


def summarize(run: Run, top: int = TOP_N, peaks: flops.PeakRequest = flops.PeakRequest()) -> Summary:
    """Everything the report shows (``top``: rows of the longest lists: ops, kernels, sites), its
    efficiency read against the peaks ``peaks`` asks for."""
    meta = run.meta
    analysis = analyze(run)
    kinds = analysis.step_kinds
    ops = run.ops
    scope, basis, n_scope = analysis.op_basis
    keep = analysis.op_scope
    inside, compile_ns = analysis.op_compile.inside, analysis.op_compile.compile_ns
    parent = analysis.op_parent
    stats = run_op_stats(run).head(top)
    top_level = analysis.scoped_ops(top_level=True)
    phase_ns = phase_time(ops, analysis.op_phase, analysis.op_compile.run_self_ns, keep)
    sync = analysis.sync_points
    flushes = run.queue_flushes
    measured = run.device_kernels.size or flushes.size or analysis.cpu_fallbacks.table.size or run.device_copies.size
    sync_waits = dev.sync_waits(sync, flushes) if measured else None
    stalls = stalled(sync, sync_waits, run.device_kernels) if measured else None
    sites = analysis.graph_break_sites
    recompiles = comp.recompile_summary(run.recompiles, run.compiles)
    ctime = comp.compile_time(run.compiles, run.compile_phases)
    warmup = kinds[kinds["warmup"]]
    spans = run.spans
    startup = spans[spans["name"].astype(str) == "start-up"]
    collectives = _collectives(run)
    exposed = analysis.collective_overlap if isinstance(collectives, CollectivesSection) else None
    return Summary(
        run=RunFacts(
            path=str(run.path), command=meta.get("command"), torch_version=meta.get("torch_version"),
            device=meta.get("device"), world_size=meta.get("world_size"), ranks=run.ranks,
            start_time=(_dt.datetime.fromtimestamp(meta["start_time_ns"] / 1e9, _dt.timezone.utc).isoformat()
                        if meta.get("start_time_ns") else None),
            step_numbering=STEP_NUMBERING),
        startup=[Startup(rank=int(r), ms=float(d / 1e6)) for r, d in zip(startup["rank"], startup["dur"])],
        steps=_rows(StepStats, step_stats(kinds)),
        warmup_steps=_rows(WarmupStep, warmup.assign(step_ms=warmup["dur"] / 1e6,
                                                     compile_ms=warmup["compile_ns"] / 1e6)
                           [["rank", "step", "step_ms", "compile_ms"]]),
        step_breakdown=_rows(StepBreakdown, step_breakdown(top_level, scope, phase_ns)),
        time_split=_rows(TimeSplit, time_split(top_level, scope, sync, comm_ops(ops, parent, keep, compile_ns),
                                               exposed, flushes if measured else None)),
        ops=OpsSection(captured_steps=n_scope, basis=basis, events=int(len(ops)), compile_events=int(inside.sum()),
                       top_by_self_time=_rows(OpRow, stats)),
        precision=PrecisionSection(time=precision.time_basis(run.device_kernels), mix=_rows(PrecisionShare, analysis.precision_mix),
                                   left_in_fp32=_rows(Fp32Op, analysis.left_in_fp32.groupby("rank").head(top))),
        recompute=_rows(Recompute, recompute_by_module(ops, parent, analysis.op_compile.run_self_ns, keep,
                                                       analysis.op_basis.per_rank)),
        efficiency=_efficiency(analysis, top, peaks),
        sync_points=SyncSection(events=int(len(sync)), waits_measured=bool(measured), on_device=ran_on_device(run),
                                by_source=_rows(SyncSite, sync_summary(sync, scope, sync_waits, stalls)),
                                stalls=int(stalls.sum()) if stalls is not None else ABSENT),
        device=_device(run, kinds, scope, basis, top) if measured else NotCaptured(),
        compile=CompileSection(
            frames_compiled=int(len(run.compiles)),
            compile_ms=float((analysis.compile_spans["end"] - analysis.compile_spans["ts"]).sum() / 1e6),
            compile_in_steps_ms=float(kinds.loc[kinds["complete"], "compile_ns"].sum() / 1e6),  # not the open tail
            graph_breaks=int(len(sites)),
            graph_break_events=int(len(run.graph_breaks)),
            recompiles=int(recompiles["recompiles"].sum()) if len(recompiles) else 0,
            cache_limit_hit=bool(recompiles["cache_limit_hit"].any()) if len(recompiles) else False,
            break_sites=_rows(BreakSite, sites),
            recompiles_by_frame=_rows(FrameRecompiles, recompiles),
            compile_time=_compile_time(ctime.head(top)),
            cache=_rows(CacheStats, comp.cache_stats(run.compile_cache)),
            top_fusions=_rows(FusedKernel, comp.top_fusions(run.fusions).head(top)),
            graph_runs=_rows(GraphRun, analysis.graph_runs.head(top)),
        ),
        memory=_memory(run, top),
        collectives=collectives,
        metrics=_rows(MetricSummary, metrics.summary(run.metrics)),
        dumps=_dumps(run),
        health=Health(
            damage=[DamagedFile(rank=rd.rank, file=str(d.file.relative_to(run.path)), what=d.what,
                                tables=list(d.tables), bytes=d.bytes) for rd in run.rank_data for d in rd.damage],
            ranks=_rows(RankHealth, run.health),
            detail_cuts=_detail_cuts(run),
            failures=_rows(CollectorFailure, run.failures[["rank", "collector", "message"]]) if len(run.failures)
            else [],
            device_gaps=_rows(DeviceGap, dev.gap_steps(run.device_gaps, run.steps)),
            stale_rank_dirs=[str(d) for d in run.stale_rank_dirs],
            missing_ranks=run.missing_ranks,
            conflicts=_rows(Conflict, run.conflicts),
            command_exit=command_exit(meta.get("exit")),
        ),
    )


def command_exit(exit: dict[str, Any] | None) -> CommandExit | None:
    """run.json's ``exit`` (``record``'s runs: ``{"code": N}`` or ``{"signal": N}``, written once the
    command ended; the reader checked it) as the Health section holds it."""
    if exit is None:
        return None
    return CommandExit(code=exit.get("code", ABSENT), signal=exit.get("signal", ABSENT))


def _efficiency(analysis: RunAnalysis, top: int, peaks: flops.PeakRequest) -> EfficiencySection:
    """FLOPs per basis step, the FLOP/s achieved, MFU, and per op name and device kernel (``top``
    per rank) their bytes, FLOP/s, intensity and place under the roofline, against the peaks
    ``peaks`` resolves to (``RunAnalysis.efficiency``)."""
    e = analysis.efficiency(peaks)
    return EfficiencySection(
        basis=analysis.op_basis.kind, basis_steps=analysis.op_basis.per_rank, precision=e.precision,
        peak=Peak(tflops=e.peak_tflops, gbps=e.peak_gbps, source=e.peak_source),
        ranks=_rows(FlopsRank, e.ranks), steps=_rows(FlopsStep, e.steps), ops=_rows(OpEfficiency, e.ops),
        kernels=_rows(KernelEfficiency, e.kernels.groupby("rank").head(top)),
        unknown=_rows(FlopsUnknown, e.unknown))


def peak_for(summary: Summary, tflops: float | None = None, gbps: float | None = None, device: str | None = None,
             calibrate: bool = False) -> Peak:
    """The peak to read ``summary``'s efficiency against (``analysis.flops.resolve_peak``): the
    given figures, else ``device``'s published ones, else, for a CPU run with FLOPs to rate and
    ``calibrate``, this machine's measured ones (asked for: a measurement differs from one read
    to the next, and the report of a run is the same every time it is printed)."""
    e = summary.efficiency
    rated = any(x.flops_per_step for x in e.ranks)
    t, g, source = flops.resolve_peak(e.precision, summary.run.device, tflops, gbps, device, calibrate and rated)
    return Peak(tflops=t, gbps=g, source=source)


def with_peak(summary: Summary, peak: Peak) -> Summary:
    """``summary`` with its efficiency figures against ``peak`` (``analysis.flops.resolve_peak``):
    MFU per rank and step, and per op name and kernel the roofline bound and % of the roof. A new
    summary: the one given (perhaps a cached, stored one) is left as it was."""
    e = summary.efficiency

    def mfu(x: R) -> R:
        return dataclasses.replace(x, mfu_pct=flops.mfu_pct(x.tflops, peak.tflops))

    def roof(x: R) -> R:
        bound, pct = flops.roofline(x.intensity, x.tflops, peak.tflops, peak.gbps)
        return dataclasses.replace(x, bound=bound, roof_pct=pct)

    efficiency = dataclasses.replace(e, peak=peak, ranks=[mfu(x) for x in e.ranks], steps=[mfu(x) for x in e.steps],
                                     ops=[roof(x) for x in e.ops], kernels=[roof(x) for x in e.kernels])
    return dataclasses.replace(summary, efficiency=efficiency)


_COMPILE_TIME_FIELDS = ("compile_id", "func", "backend", "status", "graph_ops", "total_ms")


def _compile_time(ctime: pd.DataFrame) -> list[CompileTime]:
    """``analysis.compile.compile_time`` rows: the frame's fields, then one column per phase."""
    return [CompileTime(**{k: r[k] for k in _COMPILE_TIME_FIELDS},
                        phases={k: v for k, v in r.items() if k not in _COMPILE_TIME_FIELDS})
            for r in records(ctime)]


def _dumps(run: Run) -> list[Dump]:
    """Always-on dumps, one per (rank, time), with each thread they name and where it was, the
    collectives in flight on the rank and its device queues."""
    colls = {key: rows for key, rows in run.dump_collectives.groupby(["rank", "ts"], sort=False)}
    queues = {key: rows for key, rows in run.dump_queues.groupby(["rank", "ts"], sort=False)}
    detail = {key: rows["step"].tolist() for key, rows in run.dumped_steps.groupby(["rank", "ts"], sort=False)}
    out = []
    for (rank, ts), rows in run.dumps.groupby(["rank", "ts"], sort=True):
        first = rows.iloc[0]
        c, q = colls.get((rank, ts)), queues.get((rank, ts))
        out.append(Dump(rank=int(rank), reason=str(first["reason"]), first_step=int(first["first_step"]),
                        last_step=int(first["last_step"]), detail_steps=[int(s) for s in detail.get((rank, ts), [])],
                        threads=[DumpThread(tid=int(t), source=str(src), stack=str(full))
                                 for t, src, full in zip(rows["tid"], rows["user_source"], rows["source_full"])],
                        collectives=[] if c is None else _dump_collectives(c, int(ts)),
                        queues=[] if q is None else _dump_queues(q, int(ts))))
    return out


def _dump_collectives(rows: pd.DataFrame, ts: int) -> list[DumpCollective]:
    return [DumpCollective(op=str(r["op"]), group=str(r["group"]), seq=int(r["seq"]), bytes=int(r["bytes"]),
                           peer=int(r["peer"]), for_s=(ts - int(r["since"])) / 1e9) for r in records(rows)]


def _dump_queues(rows: pd.DataFrame, ts: int) -> list[DumpQueue]:
    def age(t: int) -> float | None:
        return None if t < 0 else (ts - t) / 1e9

    out = []
    for r in records(rows):
        seen = int(r["flush_ts"]) >= 0
        out.append(DumpQueue(device=str(r["device"]), depth=int(r["depth"]), depth_age_s=age(int(r["depth_ts"])),
                             flush_reason=str(r["flush_reason"]) if seen else None, flush_ops=int(r["flush_ops"]),
                             flush_ms=int(r["flush_dur"]) / 1e6 if seen else None,
                             flush_age_s=age(int(r["flush_ts"]))))
    return out


def _device(run: Run, kinds: pd.DataFrame, scope: pd.DataFrame, basis: str, top: int) -> DeviceSection:
    """The Device section: per step what bounded it, the host's waits by line, fusion, fallbacks,
    coverage and custom kernels (``analysis.device``); per-step figures over the steady captured
    steps that have a device trace (a device gap's steps left out)."""
    analysis = analyze(run)
    scope = dev.traced_steps(scope, run.device_gaps)
    kernels, corr = run.device_kernels, analysis.device_correlation
    verdicts = dev.step_verdicts(analysis.device_steps)
    overlap = streams.stream_overlap(kernels, analysis.device_streams, kinds)
    if len(verdicts):
        flags = kinds.set_index(["rank", "step"])[["warmup", "steady"]]
        verdicts = verdicts.join(flags, on=["rank", "step"])
    return DeviceSection(
        basis=basis, basis_steps=steps_per_rank(scope),
        thresholds=DeviceThresholds(device_bound_busy_pct=100 * dev.DEVICE_BOUND_BUSY,
                                    host_bound_busy_pct=100 * dev.HOST_BOUND_BUSY,
                                    host_bound_wait_pct=100 * dev.HOST_BOUND_WAIT),
        verdict=_rows(DeviceVerdict, dev.verdict_summary(verdicts, scope)),
        steps=_rows(DeviceStep, verdicts.assign(dur_ms=verdicts["dur"] / 1e6, busy_ms=verdicts["busy_ns"] / 1e6,
                                                idle_ms=verdicts["idle_ns"] / 1e6, wait_ms=verdicts["wait_ns"] / 1e6)
                    .drop(columns=["dur", "busy_ns", "idle_ns", "wait_ns"])) if len(verdicts) else [],
        stalls=_rows(Stall, dev.stalls(run.queue_flushes, scope)),
        top_kernels=_rows(TopKernel, dev.top_kernels(kernels, corr, scope).head(top)),
        fusion=_rows(Fusion, dev.fusion(kernels)),
        unfused=_rows(UnfusedRun, dev.unfused_sequences(kernels, corr, scope).head(top)),
        copies=_rows(DeviceCopy, dev.copy_summary(run.device_copies, scope)),
        fallbacks=_rows(Fallback, dev.fallback_summary(analysis.cpu_fallbacks.table, scope)),
        coverage=_rows(Coverage, dev.coverage(analysis.cpu_fallbacks.native, analysis.cpu_fallbacks.table)),
        custom_kernels=_rows(CustomKernel, dev.custom_kernels(
            kernels, corr, scope, lambda rows: comp.compiled_graph_of(run.ops, analysis.op_parent, rows))),
        streams=_rows(StreamUse, streams.stream_summary(analysis.device_streams, scope)),
        stream_steps=_stream_steps(analysis.device_streams, overlap),
        stream_overlap=_stream_overlap(analysis.device_streams, overlap, scope),
        stream_waits=_rows(StreamWaitSite, streams.wait_sites(run.stream_waits, run.event_enqueues, scope)),
        **_device_collectives(run, kinds, scope),
    )


def _device_collectives(run: Run, kinds: pd.DataFrame, scope: pd.DataFrame) -> dict[str, list]:
    """The Device section's collectives: communication per step (overlapped, exposed), the streams
    that waited for a collective, and the stragglers on device time (``analysis.stragglers`` over
    the collectives matched by their kernels' times)."""
    found = analyze(run).device_collectives
    overlap, m, w = found.overlap, found.matched, found.waits
    ranking, per_step = _stragglers(m, w, kinds) if len(m) else ([], None)
    return dict(
        collectives=_rows(DeviceComm, dcoll.comm_summary(overlap, scope)),
        collective_steps=_rows(DeviceCommStep, overlap.assign(
            comm_ms=overlap["comm_ns"] / 1e6, overlapped_ms=overlap["overlapped_ns"] / 1e6,
            exposed_ms=overlap["exposed_ns"] / 1e6).drop(columns=["comm_ns", "overlapped_ns", "exposed_ns"])),
        collective_waits=_rows(CommWait, dcoll.comm_waits(run.stream_waits, run.event_enqueues, run.collectives,
                                                          found.kernels, scope)),
        stragglers=ranking,
        straggler_steps=_rows(StragglerStep, per_step) if per_step is not None else [],
    )


def _busy_streams(per_stream: pd.DataFrame) -> pd.Series:
    """Per (rank, device): how many streams ran kernels in ``per_stream``'s rows (``device_streams``)."""
    return per_stream[per_stream["busy_ns"].to_numpy() > 0].groupby(["rank", "device"])["stream"].nunique()


def _stream_steps(per_stream: pd.DataFrame, overlap: pd.DataFrame) -> list[StreamStep]:
    """Per step and stream, for devices that ran more than one stream or waited for one."""
    if per_stream.empty:
        return []
    several = _busy_streams(per_stream)
    waited = per_stream.groupby(["rank", "device"])["waiting_ns"].sum()
    keep = [(r, d) for (r, d) in several.index.union(waited.index)
            if several.get((r, d), 0) > 1 or waited.get((r, d), 0) > 0]
    rows = per_stream.set_index(["rank", "device"]).loc[keep].reset_index() if keep else per_stream.iloc[0:0]
    rows = rows.merge(overlap[["rank", "device", "step", "overlap_ns"]], on=["rank", "device", "step"], how="left")
    return _rows(StreamStep, rows.assign(busy_ms=rows["busy_ns"] / 1e6, waiting_ms=rows["waiting_ns"] / 1e6,
                                         overlap_ms=rows["overlap_ns"].fillna(0) / 1e6)
                 [["rank", "device", "step", "stream", "kernels", "busy_ms", "waiting_ms", "overlap_ms"]])


def _stream_overlap(per_stream: pd.DataFrame, per_step: pd.DataFrame, scope: pd.DataFrame) -> list[StreamOverlap]:
    """Per rank and device that ran kernels on more than one stream in the basis steps: busy and
    overlap ms per basis step."""
    rows = per_step[in_steps(per_step, scope)] if len(per_step) and len(scope) else per_step.iloc[0:0]
    several = _busy_streams(per_stream[in_steps(per_stream, scope)] if len(per_stream) and len(scope)
                            else per_stream.iloc[0:0])
    out = []
    for (rank, device), g in rows.groupby(["rank", "device"]):
        if several.get((rank, device), 0) < 2:
            continue  # one stream: nothing ran at once
        busy, overlap = g["busy_ns"].mean() / 1e6, g["overlap_ns"].mean() / 1e6
        out.append(StreamOverlap(rank=int(rank), device=str(device), busy_ms=float(busy), overlap_ms=float(overlap),
                                 overlap_pct=float(100 * overlap / busy) if busy else 0.0))
    return out


def _detail_cuts(run: Run) -> list[DetailCut]:
    """Per rank whose budget ended detail capture (``max_bytes`` or ``max_events``, the session's
    ``detail_cut``): the last step captured in detail, seconds from capture start, bytes on disk
    then, the limit, the tables it stopped and how many later steps ran without them."""
    out = []
    steps = run.steps
    for rd in run.rank_data:
        cut = rd.last_commit.get("detail_cut")  # its fields checked by the reader (documents.COMMIT)
        if cut is None:
            continue
        start = rd.meta.get("start_ns")
        later = steps[(steps["rank"] == rd.rank) & (steps["step"] > cut["step"]) & steps["complete"]]
        out.append(DetailCut(rank=rd.rank, step=cut["step"], bytes=cut["bytes"], by=cut["by"], limit=cut["limit"],
                             tables=cut["tables"], later_steps=int(len(later)),
                             t_s=(cut["ts"] - start) / 1e9 if start is not None else None))
    return out


def _memory(run: Run, top: int) -> MemorySection | NotCaptured:
    """Peak per device with what made it, growth per step (of the tracked bytes per device and of
    the process's resident memory), leak findings, OOMs."""
    ms = run.memory_steps
    if ms.empty and run.memory_events.empty and run.process_memory.empty:
        return NotCaptured()
    analysis = analyze(run)
    allocs = analysis.memory_allocations
    peaks = analysis.memory_peaks
    devices = []
    figures = mem.figures_from(ms, run.memory_sources).set_index(["rank", "device"])
    unseen = mem.unseen_steps(ms, run.process_memory)
    for _, g in mem.growth(ms).iterrows():
        said = figures.loc[(g["rank"], g["device"])]
        device = MemoryDevice(
            rank=int(g["rank"]), device=g["device"], figures_from=str(said["figures_from"]),
            counters_api=str(said["api"]), live_first=int(g["first"]), live_last=int(g["last"]),
            growth_per_step=float(g["growth_per_step"]), boundaries=int(g["boundaries"]), checked=int(g["checked"]),
            unseen_steps=unseen.get((int(g["rank"]), str(g["device"])), []),
            peak_between_boundaries=int(ms[(ms["rank"] == g["rank"]) & (ms["device"].astype(str) == g["device"])]
                                        ["peak"].max()))
        p = peaks[(peaks["rank"] == g["rank"]) & (peaks["device"].astype(str) == g["device"])]
        if len(p):
            best = p.loc[p["bytes"].idxmax()]
            device.peak = MemoryPeak(**{k: (best[k].item() if hasattr(best[k], "item") else best[k])
                                        for k in ("step", "bytes", "op", "source", "user_source", "module",
                                                  "alloc_bytes", "category")})
            device.peak_by_category = _rows(CategoryBytes, mem.snapshot(allocs, int(best["ts"]), "category",
                                                                        int(g["rank"]), g["device"]))
            device.peak_sites = _rows(PeakSite, mem.peak_sites(allocs, int(g["rank"]), g["device"],
                                                               int(best["ts"])).head(top))
        devices.append(device)
    return MemorySection(devices=devices, process=_rows(ProcessMemory, mem.process_growth(run.process_memory, run.steps)),
                         leaks=_rows(MemoryLeak, analysis.memory_leaks),
                         ooms=_rows(OutOfMemory, run.memory_ooms[["rank", "step", "device", "bytes", "message"]])
                         if len(run.memory_ooms) else [])


# ---------------------------------------------------------------- collectives
def _collectives(run: Run) -> CollectivesSection | CollectivesNotCaptured:
    """Everything the report, its JSON and the viewer's Collectives page show about collectives,
    from the analyses of ``collective_match``, ``stragglers`` and ``comm_cost``."""
    coll = run.collectives
    if coll.empty:
        return CollectivesNotCaptured(ranks=len(run.ranks))
    analysis = analyze(run)
    m, w, kinds = analysis.collectives_matched, analysis.collective_waits, analysis.step_kinds
    steady, median_step = steady_steps(kinds)
    ranking, per_step = _stragglers(m, w, kinds, own_spans(run.steps, analysis.collective_offsets))
    status = coll["status"].astype(str).value_counts()
    return CollectivesSection(
        ranks=len(run.ranks),
        collectives=int(len(m)),
        calls=int(len(coll)),
        status={k: int(v) for k, v in status.items() if v},
        groups=_rows(CollectiveGroup, _groups(run.collective_groups)),
        by_op=_rows(CollectiveOp, _by_op(w, m, steady)),
        steady_steps=len(steady),
        median_step_ms=median_step / 1e6,
        threshold_ms=float(per_step["threshold_ns"].iloc[0] if len(per_step) else SHARE * median_step) / 1e6,
        stragglers=ranking,
        straggler_steps=_rows(StragglerStep, per_step),
        mismatches=_rows(Mismatch, analysis.collective_mismatches),
        in_flight=_rows(InFlight, in_flight(coll, m)),
        overlap=_rows(Overlap, overlap_by_rank(analysis.collective_overlap, kinds)),
        bandwidth=_rows(Bandwidth, group_bandwidth(bandwidth(m))),
        clock=_rows(ClockOffset, analysis.collective_offsets),
    )


def _stragglers(m: pd.DataFrame, w: pd.DataFrame, kinds: pd.DataFrame, own: Spans = NO_SPANS
                ) -> tuple[list[Straggler], pd.DataFrame]:
    """The ranked stragglers of matched collectives ``m`` (with the per-rank waits ``w``: on host
    time or on device time; ``own``: neuron_prof's own work, left out of what a rank caused) and
    the per-step straggler rows (``analysis.stragglers``)."""
    per_step = straggler_steps(w, kinds, own)
    ranking = []
    for r in records(stragglers(m, w, kinds, own)):
        sig = per_step[(per_step["rank"] == r["rank"]) & per_step["significant"]]
        ranking.append(Straggler(**r, wait_in_steps_ns=int(sig["wait_caused_ns"].sum()),
                                 where=_where(w, m, r["rank"], r["steps"])))
    return ranking, per_step


def _where(w: pd.DataFrame, m: pd.DataFrame, rank: int, steps: list[int]) -> StragglerSite | NoStragglerSite:
    """The collective of ``steps`` at which ``rank`` made the others wait longest, as the rank
    issued it: op, bytes, source line, module, backward or not."""
    mine = m[(m["root_rank"] == rank) & m["step"].isin(steps)]
    if (mine["last_rank"] == rank).any():  # where it was late itself, not where its delay was passed on
        mine = mine[mine["last_rank"] == rank]
    if mine.empty:
        return NoStragglerSite()
    top = mine.loc[(mine["wait_ns"] - mine["own_ns"]).idxmax()]
    r = w[(w["rank"] == rank) & (w["group"].astype(str) == top["group"]) & (w["seq"] == top["seq"])]
    if r.empty:
        return NoStragglerSite()
    r = r.iloc[0]
    return StragglerSite(group=top["group"], seq=int(top["seq"]), op=top["op"], bytes=int(top["bytes"]),
                         source=str(r["source"]), user_source=str(r["user_source"]), module=str(r["module"]),
                         bwd=bool(r["bwd"]))


def _groups(groups: pd.DataFrame) -> pd.DataFrame:
    """One row per process group: name, description, backend, size, members."""
    g = groups.drop_duplicates("group")
    return pd.DataFrame({"group": g["group"].astype(str), "desc": g["desc"].astype(str),
                         "backend": g["backend"].astype(str), "size": g["size"],
                         "ranks": [list(map(int, x)) for x in g["ranks"]]})


def _by_op(w: pd.DataFrame, m: pd.DataFrame, steady: set[int]) -> pd.DataFrame:
    """Per group and op: collectives, rank calls, bytes one rank sent (summed over the
    collectives), mean time per rank in them (issue to completion) and mean wait per rank, over
    the whole run, each instant of a rank once (the union of its intervals: async collectives
    under way together are not added up); ``per_step``: collectives per steady step."""
    t = w.assign(group=w["group"].astype(str), op=w["op"].astype(str))
    per = t.groupby(["group", "op"]).agg(calls=("rank", "size"), ranks=("rank", "nunique"))
    codes, keys = pd.MultiIndex.from_frame(t[["group", "op", "rank"]]).factorize()
    start = t["start"].to_numpy(np.int64)
    for col, end in (("time_ns", np.where(t["end"] >= 0, t["end"], start)), ("wait_ns", start + t["wait_ns"])):
        k, ns = length_by_key(codes, start, end)
        per[col] = pd.Series(ns, index=keys[k] if len(k) else keys[:0]).groupby(level=[0, 1]).sum()
    mm = m.groupby(["group", "op"]).agg(collectives=("seq", "size"), bytes=("bytes", "sum"),
                                        in_steady=("step", lambda s: int(s.isin(steady).sum())))
    out = mm.join(per).reset_index()
    n_steady = max(len(steady), 1)
    return pd.DataFrame({"group": out["group"], "op": out["op"], "collectives": out["collectives"],
                         "calls": out["calls"], "bytes": out["bytes"],
                         "time_ms_per_rank": out["time_ns"] / out["ranks"] / 1e6,
                         "wait_ms_per_rank": out["wait_ns"] / out["ranks"] / 1e6,
                         "per_step": out["in_steady"] / n_steady if steady else float("nan")})
