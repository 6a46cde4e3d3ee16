"""``summarize(run) -> Summary``: the run's summary, assembled from the facade.

Every figure is a member of the run's ``RunAnalysis`` (``analysis.run_analysis``), which chooses
what each analysis is over: step statistics describe the steady steps (not the first step of a
rank, not steps in which torch.compile compiled: ``analysis.steps``); op, sync and graph figures
per step are over the steady captured steps, with compile time and compile-time ops left out.
Here the members' DataFrames become the sections' rows (their columns are the rows' fields, read
as ``reports.records`` rows, so numpy scalars are plain and NaN is None, which is what keeps
``report --json`` as it was) and the longest lists are cut to ``top``: the viewer and the
exporters read the same members uncut.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, TypeVar

import pandas as pd

from neuron_prof.analysis import device as dev
from neuron_prof.analysis import flops
from neuron_prof.analysis.run_analysis import RunAnalysis, Stragglers, analyze
from neuron_prof.reports.records import records
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

__all__ = ["TOP_N", "STEP_NUMBERING", "summarize", "command_exit", "peak_for", "with_peak", "read_against"]

TOP_N = 10
STEP_NUMBERING = ("steps count from 0: step N ends at the (N+1)-th step boundary, a prof.step() call or, under "
                  "`record` and auto_step, the (N+1)-th return of the training optimizer's step() (Hugging Face "
                  "Trainer's global_step N+1)")

R = TypeVar("R")


def _rows(kind: type[R], df: pd.DataFrame) -> list[R]:
    """The rows of ``df`` as ``kind`` (its columns are the kind's fields)."""
    return [kind(**r) for r in records(df)]


def summarize(run: Run, top: int = TOP_N, peaks: flops.PeakRequest = flops.PeakRequest()) -> Summary:
    """Everything the report shows (``top``: rows of the longest lists: ops, kernels, sites), its
    efficiency read against the peaks ``peaks`` asks for."""
    meta = run.meta
    analysis = analyze(run)
    kinds = analysis.step_kinds
    basis = analysis.op_basis
    sync = analysis.op_time.sync_points
    stalls = analysis.op_time.sync_stalls
    sites = analysis.compiled.break_sites
    recompiles = analysis.compiled.recompiles
    warmup = analysis.step_time.warmup
    spans = run.spans
    startup = spans[spans["name"].astype(str) == "start-up"]
    return Summary(
        run=RunFacts(
            path=str(run.path), command=meta.get("command"), torch_version=meta.get("torch_version"),
            device=meta.get("device"), world_size=meta.get("world_size"), ranks=run.ranks,
            start_time=(_dt.datetime.fromtimestamp(meta["start_time_ns"] / 1e9, _dt.timezone.utc).isoformat()
                        if meta.get("start_time_ns") else None),
            step_numbering=STEP_NUMBERING),
        startup=[Startup(rank=int(r), ms=float(d / 1e6)) for r, d in zip(startup["rank"], startup["dur"])],
        steps=_rows(StepStats, analysis.step_time.stats),
        warmup_steps=_rows(WarmupStep, warmup.assign(step_ms=warmup["dur"] / 1e6,
                                                     compile_ms=warmup["compile_ns"] / 1e6)
                           [["rank", "step", "step_ms", "compile_ms"]]),
        step_breakdown=_rows(StepBreakdown, analysis.step_time.breakdown),
        time_split=_rows(TimeSplit, analysis.step_time.split),
        ops=OpsSection(captured_steps=basis.per_rank, basis=basis.kind, events=int(len(run.ops)),
                       compile_events=int(analysis.op_compile.inside.sum()),
                       top_by_self_time=_rows(OpRow, analysis.op_time.stats.head(top))),
        precision=PrecisionSection(time=analysis.op_time.precision_basis, mix=_rows(PrecisionShare, analysis.op_time.precision_mix),
                                   left_in_fp32=_rows(Fp32Op, analysis.op_time.left_in_fp32.groupby("rank").head(top))),
        recompute=_rows(Recompute, analysis.op_time.recompute),
        efficiency=_efficiency(analysis, top, peaks),
        sync_points=SyncSection(events=int(len(sync)), waits_measured=analysis.op_time.sync_waits_measured,
                                on_device=analysis.op_time.on_device, by_source=_rows(SyncSite, analysis.op_time.sync_sites),
                                stalls=int(stalls.sum()) if stalls is not None else ABSENT),
        device=_device(analysis, top) if analysis.op_time.sync_waits_measured else NotCaptured(),
        compile=CompileSection(
            frames_compiled=int(len(run.compiles)),
            compile_ms=float((analysis.compiled.spans["end"] - analysis.compiled.spans["ts"]).sum() / 1e6),
            compile_in_steps_ms=float(kinds.loc[kinds["complete"], "compile_ns"].sum() / 1e6),  # not the open tail
            graph_breaks=int(len(sites)),
            graph_break_events=int(len(run.graph_breaks)),
            recompiles=int(recompiles["recompiles"].sum()) if len(recompiles) else 0,
            cache_limit_hit=bool(recompiles["cache_limit_hit"].any()) if len(recompiles) else False,
            break_sites=_rows(BreakSite, sites),
            recompiles_by_frame=_rows(FrameRecompiles, recompiles),
            compile_time=_compile_time(analysis.compiled.times.head(top)),
            cache=_rows(CacheStats, analysis.compiled.cache),
            top_fusions=_rows(FusedKernel, analysis.compiled.fusions.head(top)),
            graph_runs=_rows(GraphRun, analysis.compiled.graph_runs.head(top)),
        ),
        memory=_memory(analysis, top),
        collectives=_collectives(analysis),
        metrics=_rows(MetricSummary, analysis.step_time.scalars),
        dumps=_dumps(run),
        health=Health(
            damage=[DamagedFile(rank=rd.rank, file=str(d.file.relative_to(run.path)), what=d.what,
                                tables=list(d.tables), bytes=d.bytes) for rd in run.rank_data for d in rd.damage],
            ranks=_rows(RankHealth, run.health),
            detail_cuts=_detail_cuts(run),
            failures=_rows(CollectorFailure, run.failures[["rank", "collector", "message"]]) if len(run.failures)
            else [],
            device_gaps=_rows(DeviceGap, analysis.device.gap_steps),
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
    ``peaks`` resolves to (``RunAnalysis.op_time.efficiency``)."""
    e = analysis.op_time.efficiency(peaks)
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



def read_against(summary: Summary, peaks: flops.PeakRequest) -> Summary:
    """``summary`` (a stored one, or one made for other peaks) read against the peaks ``peaks`` asks
    for (:func:`peak_for`, :func:`with_peak`); as it is when nothing is asked."""
    if peaks == flops.PeakRequest():
        return summary
    return with_peak(summary, peak_for(summary, peaks.tflops, peaks.gbps, peaks.device, peaks.calibrate))


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


def _device(analysis: RunAnalysis, top: int) -> DeviceSection:
    """The Device section: per step what bounded it, the host's waits by line, fusion, fallbacks,
    coverage and custom kernels (``analysis.device``); per-step figures over the steady captured
    steps that have a device trace (``RunAnalysis.device.basis``)."""
    verdicts = analysis.device.verdicts
    return DeviceSection(
        basis=analysis.device.basis.kind, basis_steps=analysis.device.basis.per_rank,
        thresholds=DeviceThresholds(device_bound_busy_pct=100 * dev.DEVICE_BOUND_BUSY,
                                    host_bound_busy_pct=100 * dev.HOST_BOUND_BUSY,
                                    host_bound_wait_pct=100 * dev.HOST_BOUND_WAIT),
        verdict=_rows(DeviceVerdict, analysis.device.verdict_summary),
        steps=_rows(DeviceStep, verdicts.assign(dur_ms=verdicts["dur"] / 1e6, busy_ms=verdicts["busy_ns"] / 1e6,
                                                idle_ms=verdicts["idle_ns"] / 1e6, wait_ms=verdicts["wait_ns"] / 1e6)
                    .drop(columns=["dur", "busy_ns", "idle_ns", "wait_ns"])) if len(verdicts) else [],
        stalls=_rows(Stall, analysis.device.queue_stalls),
        top_kernels=_rows(TopKernel, analysis.device.top_kernels.head(top)),
        fusion=_rows(Fusion, analysis.device.fusion),
        unfused=_rows(UnfusedRun, analysis.device.unfused.head(top)),
        copies=_rows(DeviceCopy, analysis.device.copies),
        fallbacks=_rows(Fallback, analysis.device.fallbacks),
        coverage=_rows(Coverage, analysis.device.coverage),
        custom_kernels=_rows(CustomKernel, analysis.device.custom_kernels),
        streams=_rows(StreamUse, analysis.device.stream_summary),
        stream_steps=_rows(StreamStep, analysis.device.several_stream_steps),
        stream_overlap=_rows(StreamOverlap, analysis.device.stream_overlap_summary),
        stream_waits=_rows(StreamWaitSite, analysis.device.stream_wait_sites),
        **_device_collectives(analysis),
    )


def _device_collectives(analysis: RunAnalysis) -> dict[str, list]:
    """The Device section's collectives: communication per step (overlapped, exposed), the streams
    that waited for a collective, and the stragglers on device time (``RunAnalysis.device.stragglers``)."""
    overlap = analysis.device_collectives.overlap
    found = analysis.device.stragglers
    return dict(
        collectives=_rows(DeviceComm, analysis.device.comm_summary),
        collective_steps=_rows(DeviceCommStep, overlap.assign(
            comm_ms=overlap["comm_ns"] / 1e6, overlapped_ms=overlap["overlapped_ns"] / 1e6,
            exposed_ms=overlap["exposed_ns"] / 1e6).drop(columns=["comm_ns", "overlapped_ns", "exposed_ns"])),
        collective_waits=_rows(CommWait, analysis.device.comm_waits),
        stragglers=_stragglers(found) if found is not None else [],
        straggler_steps=_rows(StragglerStep, found.steps) if found is not None else [],
    )


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


def _memory(analysis: RunAnalysis, top: int) -> MemorySection | NotCaptured:
    """Peak per device with what made it, growth per step (of the tracked bytes per device and of
    the process's resident memory), leak findings, OOMs."""
    run = analysis.run
    ms = run.memory_steps
    if ms.empty and run.memory_events.empty and run.process_memory.empty:
        return NotCaptured()
    devices = []
    figures = analysis.memory.figures_from.set_index(["rank", "device"])
    unseen = analysis.memory.unseen_steps
    for _, g in analysis.memory.growth.iterrows():
        said = figures.loc[(g["rank"], g["device"])]
        device = MemoryDevice(
            rank=int(g["rank"]), device=g["device"], figures_from=str(said["figures_from"]),
            counters_api=str(said["api"]), live_first=int(g["first"]), live_last=int(g["last"]),
            growth_per_step=float(g["growth_per_step"]), boundaries=int(g["boundaries"]), checked=int(g["checked"]),
            unseen_steps=unseen.get((int(g["rank"]), str(g["device"])), []),
            peak_between_boundaries=int(ms[(ms["rank"] == g["rank"]) & (ms["device"].astype(str) == g["device"])]
                                        ["peak"].max()))
        peak = analysis.memory.device_peaks.get((int(g["rank"]), str(g["device"])))
        if peak is not None:
            best = peak.row
            device.peak = MemoryPeak(**{k: (best[k].item() if hasattr(best[k], "item") else best[k])
                                        for k in ("step", "bytes", "op", "source", "user_source", "module",
                                                  "alloc_bytes", "category")})
            device.peak_by_category = _rows(CategoryBytes, peak.by_category)
            device.peak_sites = _rows(PeakSite, peak.sites.head(top))
        devices.append(device)
    return MemorySection(devices=devices, process=_rows(ProcessMemory, analysis.memory.process_growth),
                         leaks=_rows(MemoryLeak, analysis.memory_leaks),
                         ooms=_rows(OutOfMemory, run.memory_ooms[["rank", "step", "device", "bytes", "message"]])
                         if len(run.memory_ooms) else [])


# ---------------------------------------------------------------- collectives
def _collectives(analysis: RunAnalysis) -> CollectivesSection | CollectivesNotCaptured:
    """Everything the report, its JSON and the viewer's Collectives page show about collectives,
    from the analyses of ``collective_match``, ``stragglers`` and ``comm_cost``."""
    run = analysis.run
    coll = run.collectives
    if coll.empty:
        return CollectivesNotCaptured(ranks=len(run.ranks))
    found = analysis.comms.stragglers
    steady = analysis.comms.steady_steps
    status = coll["status"].astype(str).value_counts()
    return CollectivesSection(
        ranks=len(run.ranks),
        collectives=int(len(analysis.collectives_matched)),
        calls=int(len(coll)),
        status={k: int(v) for k, v in status.items() if v},
        groups=_rows(CollectiveGroup, _groups(run.collective_groups)),
        by_op=_rows(CollectiveOp, analysis.comms.by_op),
        steady_steps=len(steady.steps),
        median_step_ms=steady.median_ns / 1e6,
        threshold_ms=found.threshold_ns / 1e6,
        stragglers=_stragglers(found),
        straggler_steps=_rows(StragglerStep, found.steps),
        mismatches=_rows(Mismatch, analysis.collective_mismatches),
        in_flight=_rows(InFlight, analysis.comms.in_flight),
        overlap=_rows(Overlap, analysis.comms.overlap_by_rank),
        bandwidth=_rows(Bandwidth, analysis.comms.bandwidth),
        clock=_rows(ClockOffset, analysis.collective_offsets),
    )


def _stragglers(found: Stragglers) -> list[Straggler]:
    """The ranked stragglers, each with the collective where it made the others wait longest."""
    sites = {r.pop("rank"): StragglerSite(**r) for r in records(found.sites)}
    return [Straggler(**r, where=sites.get(r["rank"], NoStragglerSite())) for r in records(found.ranking)]


def _groups(groups: pd.DataFrame) -> pd.DataFrame:
    """One row per process group: name, description, backend, size, members."""
    g = groups.drop_duplicates("group")
    return pd.DataFrame({"group": g["group"].astype(str), "desc": g["desc"].astype(str),
                         "backend": g["backend"].astype(str), "size": g["size"],
                         "ranks": [list(map(int, x)) for x in g["ranks"]]})
