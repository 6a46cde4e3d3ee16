"""The run summary's types: one dataclass per section and per kind of row, fields in the order
``report --json`` writes them.

The summary is built once (``summary.build.summarize``), stored in the run, and read by the
report's text, its ``--json``, the findings, ``compare`` and the viewer's pages; these types are
what all of them read, so a field is named and typed in one place. :meth:`Summary.to_json` and
:meth:`Summary.from_json` (``summary.codec``) turn a summary into the JSON ``report --json``
prints and back; JSON types follow the annotations (``float`` fields may hold ints, as the
DataFrames they come from do). Values are as computed: None where an analysis had no number
(NaN), ``ABSENT`` where the JSON leaves the key out.

Row kinds are the rows of an analysis DataFrame (``analysis.records``): their fields are its
columns. A section the run has none of (no device queue, no memory collector, no collective) is
its ``NotCaptured`` type, ``{"captured": false}`` in JSON.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from neuron_prof.reports.summary.codec import ABSENT, FLATTEN, Absent, from_json, to_json

__all__ = [
    "RunFacts", "Startup", "StepStats", "WarmupStep", "StepBreakdown", "TimeSplit", "OpRow", "OpsSection",
    "SyncSite", "SyncSection", "DeviceThresholds", "DeviceVerdict", "DeviceStep", "Stall", "TopKernel", "Fusion",
    "UnfusedRun", "Fallback", "Coverage", "CustomKernel", "StreamUse", "StreamStep", "StreamOverlap", "StreamWaitSite",
    "DeviceComm", "DeviceCommStep", "CommWait", "DeviceSection", "Recompute", "PrecisionShare", "Fp32Op",
    "PrecisionSection", "Peak", "FlopsRank", "FlopsStep", "OpEfficiency", "KernelEfficiency", "FlopsUnknown",
    "EfficiencySection", "NotCaptured", "BreakSite",
    "FrameRecompiles",
    "CompileTime", "CacheStats", "FusedKernel", "GraphRun", "CompileSection", "MemoryPeak", "CategoryBytes",
    "PeakSite", "MemoryDevice", "ProcessMemory", "MemoryLeak", "OutOfMemory", "MemorySection", "CollectiveGroup",
    "CollectiveOp", "StragglerSite", "NoStragglerSite", "Straggler", "StragglerStep", "Mismatch", "InFlight",
    "Overlap", "Bandwidth", "ClockOffset", "CollectivesSection", "CollectivesNotCaptured", "MetricSummary",
    "DumpThread", "DumpCollective", "DumpQueue", "Dump", "RankHealth", "DetailCut", "CollectorFailure", "Conflict",
    "CommandExit", "Health", "Summary",
]

row = dataclass(kw_only=True)
"""Every type here: keyword-built (from ``analysis.records`` rows), fields in JSON order."""


# ---------------------------------------------------------------- run, steps, ops, sync
@row
class RunFacts:
    """What ``run.json`` says of the run (``summary.build.summarize``)."""

    path: str
    command: str | list[str] | None
    torch_version: str | None
    device: str | None
    world_size: int | None
    ranks: list[int]
    start_time: str | None
    step_numbering: str


@row
class Startup:
    """A rank's ``start-up`` span (``Run.spans``): capture start to the first module call."""

    rank: int
    ms: float


@row
class StepStats:
    """``analysis.steps.step_stats``: a rank's step counts and its step-time statistics."""
    rank: int
    steps: int
    warmup: int
    steady: int
    captured: int
    compile_ms: float
    basis: str
    mean_ms: float
    median_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    std_ms: float | None
    slow_steps: list[int]
    """The basis steps over ``analysis.steps.SLOW_STEP`` medians."""


@row
class WarmupStep:
    """A warm-up step of ``RunAnalysis.step_kinds`` (``analysis.steps.step_kinds``)."""

    rank: int
    step: int
    step_ms: float
    compile_ms: float


@row
class StepBreakdown:
    """``analysis.steps.step_breakdown``: mean ms per step in each of ``steps.PHASES`` and its share."""
    rank: int
    steps: int
    step_ms: float
    forward_ms: float
    backward_ms: float
    recompute_ms: float
    optimizer_ms: float
    communication_ms: float
    compile_ms: float
    outside_ops_ms: float
    forward_pct: float | None
    backward_pct: float | None
    recompute_pct: float | None
    optimizer_pct: float | None
    communication_pct: float | None
    compile_pct: float | None
    outside_ops_pct: float | None


@row
class Recompute:
    """``analysis.op_time.recompute.recompute_by_module``: what activation checkpointing re-ran, per
    checkpointed module."""
    rank: int
    module: str
    reruns: int
    ops: int
    ms_per_step: float
    pct_of_backward: float
    user_sources: list[str]


@row
class PrecisionShare:
    """``analysis.precision.precision_mix``: a precision's time per step and share."""
    rank: int
    precision: str
    ms_per_step: float
    pct: float


@row
class Fp32Op:
    """``analysis.precision.left_in_fp32``: a forward op computed in fp32 in a run under autocast."""
    rank: int
    name: str
    module: str
    calls: int
    ms_per_step: float
    pct: float
    user_sources: list[str]


@row
class PrecisionSection:
    """Which precision the steps' time went to (``time``: "device" time or "host" self time), and
    the ops autocast left in fp32 (empty without bf16/fp16 time)."""
    time: str
    mix: list[PrecisionShare]
    left_in_fp32: list[Fp32Op]


@row
class Peak:
    """The peaks MFU and the roofline are against (``analysis.flops``; ``summary.build.with_peak``):
    TFLOP/s and GB/s, each None where unknown, and where they came from. The stored summary has
    none: a peak is the reader's (``report --peak-tflops``, a known device, a CPU calibration)."""
    tflops: float | None
    gbps: float | None
    source: str


@row
class FlopsRank:
    """``analysis.flops.rank_flops``: a rank's FLOPs, bytes and step time per basis step, the
    FLOP/s achieved over the step and MFU against ``Peak.tflops``; FLOPs are a lower bound where
    ops with unknown or uncounted FLOPs ran (per step)."""
    rank: int
    steps: int
    flops_per_step: float
    bytes_per_step: float | None
    step_ms: float
    tflops: float
    mfu_pct: float | None
    unknown_per_step: float
    uncounted_per_step: float


@row
class FlopsStep:
    """``analysis.flops.step_flops``: one basis step of a rank."""
    rank: int
    step: int
    flops: int
    bytes: float | None
    step_ms: float
    tflops: float
    mfu_pct: float | None


@row
class OpEfficiency:
    """``analysis.flops.op_efficiency``: an op name's FLOPs, bytes and run time per step, achieved
    TFLOP/s, FLOPs per byte, and (with both peaks) whether the roofline bounds it by ``compute``
    or ``memory`` and its FLOP/s in % of the roof at its intensity."""
    rank: int
    name: str
    calls_per_step: float
    flops_per_step: float
    bytes_per_step: float | None
    ms_per_step: float
    tflops: float | None
    intensity: float | None
    bound: str | None
    roof_pct: float | None


@row
class KernelEfficiency:
    """``analysis.flops.kernel_efficiency``: a device kernel name's FLOPs (of the ops it ran),
    bytes and device time per step, and its roofline position as ``OpEfficiency``'s."""
    rank: int
    device: str
    name: str
    kernels_per_step: float
    flops_per_step: float
    bytes_per_step: float | None
    ms_per_step: float
    tflops: float | None
    intensity: float | None
    bound: str | None
    roof_pct: float | None


@row
class FlopsUnknown:
    """``analysis.flops.unknown_ops``: ops left out of the FLOPs, by name, and why."""
    rank: int
    name: str
    calls_per_step: float
    reason: str


@row
class EfficiencySection:
    """FLOPs per step (forward and backward, as ``torch.utils.flop_counter`` counts them), the
    FLOP/s achieved and MFU, and per op name and device kernel the roofline figures
    (``analysis.flops``); ``precision``: what most FLOPs computed in (which of a device's peaks
    applies)."""
    basis: str
    basis_steps: int
    precision: str
    peak: Peak
    ranks: list[FlopsRank]
    steps: list[FlopsStep]
    ops: list[OpEfficiency]
    kernels: list[KernelEfficiency]
    unknown: list[FlopsUnknown]


@row
class TimeSplit:
    """``analysis.steps.time_split``: mean ms per step of each of ``steps.TIME_KINDS``."""
    rank: int
    steps: int
    step_ms: float
    compute_ms: float
    communication_ms: float
    sync_ms: float
    compile_ms: float
    idle_ms: float


@row
class OpRow:
    """``RunAnalysis.op_time.stats``: ``analysis.ops.op_stats`` over ``RunAnalysis.scoped_ops``."""

    name: str
    module: str
    calls: int
    total_ms: float
    self_ms: float
    self_pct: float | None
    mean_us: float
    backward: bool
    recompute: bool
    """Forward ops the backward pass re-ran (activation checkpointing)."""
    self_ms_per_step: float | Absent = ABSENT
    """Absent when no steady captured step: no per-step figure."""


@row
class OpsSection:
    """The op scope (``RunAnalysis.op_basis``/``op_scope``) and its top ops by self time."""

    captured_steps: int
    basis: str
    events: int
    compile_events: int
    top_by_self_time: list[OpRow]


@row
class SyncSite:
    """``analysis.sync.sync_summary``: a line's sync points (``analysis.sync.sync_points``)."""

    source: str
    name: str
    kind: str
    count: int
    total_ms: float
    in_steps: int
    per_step: float | None
    wait_ms: float | None | Absent = ABSENT
    """Present when the device reported its queue (``SyncSection.waits_measured``)."""
    wait_ms_per_step: float | None | Absent = ABSENT
    stalls: int | Absent = ABSENT
    """Of ``count``, the sync points in which the device showed the host waiting
    (``analysis.sync.stalled``); present where the device was measured. The others read a value
    the device had ready."""


@row
class SyncSection:
    """Sync points (``analysis.sync``), with the device's measured waits (``analysis.device.sync_waits``)."""

    events: int
    waits_measured: bool
    on_device: bool
    """Whether the run used an accelerator (``analysis.accelerator``). Without one nothing waited:
    ``by_source`` lists host reads of tensor values that would wait on one, a porting note."""
    by_source: list[SyncSite]
    stalls: int | Absent = ABSENT
    """Of ``events``, those in which the device showed the host waiting (present where the device
    was measured): only these are stalls."""


# ---------------------------------------------------------------- device
@row
class DeviceThresholds:
    """The verdict thresholds of ``analysis.device`` (``DEVICE_BOUND_BUSY``, ``HOST_BOUND_*``)."""

    device_bound_busy_pct: float
    host_bound_busy_pct: float
    host_bound_wait_pct: float


@row
class DeviceVerdict:
    """``analysis.device.verdict_summary`` of ``step_verdicts(RunAnalysis.device_steps)``."""

    rank: int
    verdict: str
    device: str
    steps: int
    share: float
    step_ms: float
    busy_ms: float
    idle_ms: float
    wait_ms: float
    busy_pct: float
    wait_pct: float


@row
class DeviceStep:
    """``analysis.device.step_verdicts`` of ``RunAnalysis.device_steps``: one step's verdict."""

    rank: int
    step: int
    device: str
    busy_pct: float
    wait_pct: float
    verdict: str
    warmup: bool | None | Absent = ABSENT
    steady: bool | None | Absent = ABSENT
    dur_ms: float
    busy_ms: float
    idle_ms: float
    wait_ms: float


@row
class Stall:
    """``analysis.device.stalls``: the host's waits for the device by line."""

    rank: int
    source: str
    user_source: str
    host_op: str
    reason: str
    device: str
    count: int
    total_ms: float
    in_steps: int
    per_step_ms: float | None
    mean_ms: float
    max_ms: float
    ops: int


@row
class TopKernel:
    """``analysis.device.top_kernels``."""

    rank: int
    device: str
    name: str
    kernels: int
    ops: int
    total_ms: float
    per_step_ms: float | None
    mean_us: float
    pct: float
    source: str
    user_source: str


@row
class Fusion:
    """``analysis.device.fusion``: ops per kernel and the launch cost, per device."""

    rank: int
    device: str
    kernels: int
    ops: int
    ops_per_kernel: float
    one_op_kernels: int
    one_op_pct: float
    busy_ms: float
    launch_floor_us: float
    launch_ms: float
    launch_pct: float
    collective_kernels: int


@row
class UnfusedRun:
    """``analysis.device.unfused_sequences``."""

    rank: int
    device: str
    kernels: str
    source: str
    user_source: str
    last_source: str
    occurrences: int
    total_kernels: int
    total_ms: float
    launch_ms: float
    per_step: float | None
    first_step: int


@row
class DeviceCopy:
    """``analysis.device.copy_summary``: copies of one direction from one line."""

    rank: int
    device: str
    kind: str
    user_source: str
    copies: int
    bytes: int
    total_ms: float
    in_steps: int
    bytes_per_step: float | None
    per_step_ms: float | None
    gbps: float | None


@row
class Fallback:
    """``analysis.device.fallback_summary``."""

    rank: int
    device: str
    op: str
    calls: int
    sources: list[str]
    user_sources: list[str]
    bytes_to_host: int
    bytes_from_host: int
    total_ms: float
    in_steps: int
    per_step_ms: float | None
    calls_per_step: float | None


@row
class Coverage:
    """``analysis.device.coverage``."""

    rank: int
    device: str
    native_ops: int
    fallback_ops: int
    coverage_pct: float | None
    fallback_op_kinds: int


@row
class CustomKernel:
    """``analysis.device.custom_kernels``."""

    rank: int
    device: str
    name: str
    calls: int
    forward_calls: int
    backward_calls: int
    total_ms: float
    forward_ms: float
    backward_ms: float
    mean_us: float
    per_step_ms: float | None
    pct: float
    user_sources: list[str]
    graphs: list[str]
    """The compiled graphs it ran in (their compile ids, "0/0"; "0/0 backward": the backward graph
    compiled with it); empty in eager runs."""


@row
class StreamUse:
    """``analysis.streams.stream_summary``: a stream's kernels, busy and waiting time per step."""
    rank: int
    device: str
    stream: int
    steps: int
    kernels_per_step: float
    busy_ms: float
    waiting_ms: float
    busy_pct: float


@row
class StreamStep:
    """``analysis.streams.stream_steps``: one stream in one complete captured step, with its
    device's time streams ran at once that step (``analysis.streams.stream_overlap``)."""
    rank: int
    device: str
    step: int
    stream: int
    kernels: int
    busy_ms: float
    waiting_ms: float
    overlap_ms: float


@row
class StreamOverlap:
    """Per rank and device, mean per basis step: the device's busy time and the part of it streams
    ran kernels at once (``analysis.streams.stream_overlap``)."""
    rank: int
    device: str
    busy_ms: float
    overlap_ms: float
    overlap_pct: float


@row
class DeviceComm:
    """``analysis.device_collectives.comm_summary``: per rank and device, mean per basis step, the
    collective kernels, their time, the part other kernels of the device ran at the same time
    (overlapped) and the rest (exposed)."""
    rank: int
    device: str
    steps: int
    kernels_per_step: float
    comm_ms: float
    overlapped_ms: float
    exposed_ms: float
    overlapped_pct: float


@row
class DeviceCommStep:
    """``analysis.device_collectives.comm_overlap``: one rank's device in one complete captured step."""
    rank: int
    device: str
    step: int
    kernels: int
    comm_ms: float
    overlapped_ms: float
    exposed_ms: float


@row
class CommWait:
    """``analysis.device_collectives.comm_waits``: a stream idle until a collective ran, by the
    collective and the lines that issued it and queued the wait."""
    rank: int
    device: str
    stream: int
    op: str
    group: str
    user_source: str
    waited_at: str
    count: int
    in_steps: int
    per_step_ms: float | None
    total_ms: float
    max_ms: float


@row
class StreamWaitSite:
    """``analysis.streams.wait_sites``: where a stream stood idle waiting for another's event."""
    rank: int
    device: str
    stream: int
    waited_for: int
    user_source: str
    source: str
    count: int
    in_steps: int
    per_step_ms: float | None
    total_ms: float
    mean_ms: float
    max_ms: float


@row
class DeviceSection:
    """What bounded each step, the host's waits by line, kernels, fusion, copies by direction and
    line, fallbacks, coverage, custom kernels, streams (their use, overlap and waits for each other), collectives on the
    device (communication hidden or exposed, streams waiting for them, stragglers on device time)."""
    captured: Literal[True] = True
    basis: str
    basis_steps: int
    thresholds: DeviceThresholds
    verdict: list[DeviceVerdict]
    steps: list[DeviceStep]
    stalls: list[Stall]
    top_kernels: list[TopKernel]
    fusion: list[Fusion]
    unfused: list[UnfusedRun]
    copies: list[DeviceCopy]
    fallbacks: list[Fallback]
    coverage: list[Coverage]
    custom_kernels: list[CustomKernel]
    streams: list[StreamUse]
    stream_steps: list[StreamStep]
    """Every complete captured step of a device that ran more than one stream or waited."""
    stream_overlap: list[StreamOverlap]
    stream_waits: list[StreamWaitSite]
    collectives: list[DeviceComm]
    collective_steps: list[DeviceCommStep]
    """Every complete captured step that ran collective kernels."""
    collective_waits: list[CommWait]
    stragglers: list[Straggler]
    """``analysis.stragglers.stragglers`` on device time: who reached collectives last on the device."""
    straggler_steps: list[StragglerStep]


@row
class NotCaptured:
    """A section the run has none of (no device queue, the memory collector off)."""
    captured: Literal[False] = False


# ---------------------------------------------------------------- compile
@row
class BreakSite:
    """``analysis.compile.graph_break_sites``."""

    source: str
    reason_class: str
    reason: str
    gb_id: str
    breaks: int
    compile_ids: list[str]
    hits: int
    hits_per_step: float | None
    frame_ms_per_step: float | None


@row
class FrameRecompiles:
    """``analysis.compile.recompile_summary``."""

    func: str
    recompiles: int
    reasons: list[str]
    cache_limit_hit: bool


@row
class CompileTime:
    """``analysis.compile.compile_time``."""

    compile_id: str
    func: str
    backend: str
    status: str
    graph_ops: int
    total_ms: float
    phases: dict[str, float | None] = field(metadata={FLATTEN: True})
    """ms per top-level compile phase, named as the run names it: one JSON key each."""


@row
class CacheStats:
    """``analysis.compile.cache_stats``."""

    cache: str
    hit: int
    miss: int
    bypass: int
    hit_rate: float | None


@row
class FusedKernel:
    """``analysis.compile.top_fusions``."""

    compile_id: str
    backend: str
    kernel: str
    fused: int
    nodes: list[str]


@row
class GraphRun:
    """``analysis.compile.graph_runs`` of ``analysis.compile.region_runs``."""

    compile_id: str
    runs: int
    total_ms: float
    self_ms: float
    runs_per_step: float | None
    self_ms_per_step: float | None


@row
class CompileSection:
    """Compiling (``RunAnalysis.compiled.spans``) and the ``analysis.compile`` tables.

    Two counts of graph breaks, for two questions: ``graph_breaks`` is how many *places* break the
    graph, the distinct sites (user source line and reason class, ``analysis.compile.graph_break_sites``:
    the rows of ``break_sites``), what a person fixes one by one and what a CI gate should hold;
    ``graph_break_events`` is how many *breaks* dynamo recorded, one per compile of a frame that
    broke, so one site counts again at each recompile of its frame.
    """

    frames_compiled: int
    compile_ms: float
    compile_in_steps_ms: float
    graph_breaks: int
    """Distinct break sites (source line, reason class): ``len(break_sites)``."""
    graph_break_events: int
    """Breaks recorded: one per compile of a frame that broke (rows of the ``graph_breaks`` table)."""
    recompiles: int
    cache_limit_hit: bool
    break_sites: list[BreakSite]
    recompiles_by_frame: list[FrameRecompiles]
    compile_time: list[CompileTime]
    cache: list[CacheStats]
    top_fusions: list[FusedKernel]
    graph_runs: list[GraphRun]


# ---------------------------------------------------------------- memory
@row
class MemoryPeak:
    """The highest of ``RunAnalysis.memory_peaks`` (``analysis.memory.peaks``) on a device."""

    step: int
    bytes: int
    op: str
    source: str
    user_source: str
    module: str
    alloc_bytes: int
    category: str


@row
class CategoryBytes:
    """``analysis.memory.snapshot`` by category at the peak."""

    category: str
    bytes: int
    blocks: int


@row
class PeakSite:
    """``analysis.memory.peak_sites``."""

    source: str
    user_source: str
    module: str
    op: str
    category: str
    bytes: int
    blocks: int


@row
class MemoryDevice:
    """``analysis.memory.growth`` of ``Run.memory_steps``, with the device's peak."""

    rank: int
    device: str
    figures_from: str
    """``allocator events``, or ``backend counters`` (``analysis.memory.figures_from``): the allocator
    does not report to the profiler, so live bytes are the backend's allocated bytes (all of them,
    not since capture began) and the peak its high-water mark; no lines."""
    counters_api: str
    """The function the backend's counters were read with (``torch.neuron.memory_stats``); empty
    for allocator events."""
    live_first: int
    live_last: int
    growth_per_step: float
    boundaries: int
    checked: int
    """Step-to-step differences ``growth_per_step`` and the leak verdict are judged over."""
    unseen_steps: list[int]
    """Steps whose boundaries have no live figure (``analysis.memory.unseen_steps``): the job's own
    torch.profiler held the allocator reports then; Capture health says so."""
    peak_between_boundaries: int
    peak: MemoryPeak | Absent = ABSENT
    """The three peak fields: absent when no captured step allocated on the device."""
    peak_by_category: list[CategoryBytes] | Absent = ABSENT
    peak_sites: list[PeakSite] | Absent = ABSENT


@row
class ProcessMemory:
    """``analysis.memory.process_growth``."""

    rank: int
    boundaries: int
    first: int
    last: int
    judged: int
    growth_per_step: float | None


@row
class MemoryLeak:
    """A row of ``RunAnalysis.memory_leaks`` (``analysis.memory.leaks``)."""
    rank: int
    device: str
    growth_per_step: float
    steps_growing: int
    steps_checked: int
    confidence: float
    source: str
    user_source: str
    module: str
    op: str
    category: str
    grad: bool
    bytes_per_step: int
    blocks_per_step: int
    steps_seen: int
    process_growth_per_step: float | None
    process_outgrows: bool
    kept_graph: bool
    allocator_growth_per_step: float | None
    """The allocator's own count's growth per step over the same boundaries (None: it keeps none)."""
    confirmed_by: str
    """``analysis.memory.CONFIRMED_BY``, or "": nothing but the capture's live bytes says it grows."""
    made_at: str
    """The user's line in the step loop the surviving blocks were made from ("": not known)."""
    keeper: str
    """What keeps them alive: ``list history (global in train.py)`` ("": see keeper_note)."""
    keeper_via: str
    """``tensor`` (a Python tensor over them) or ``autograd graph`` (a kept tensor's graph saved them)."""
    keeper_note: str
    """Why there is no keeper: ``not recorded`` (no walk: an older run, or a capture that did not end), not found."""


@row
class OutOfMemory:
    """A row of ``Run.memory_ooms``."""

    rank: int
    step: int
    device: str
    bytes: int
    message: str


@row
class MemorySection:
    """Memory per device, leaks (``RunAnalysis.memory_leaks``) and OOMs."""

    captured: Literal[True] = True
    devices: list[MemoryDevice]
    process: list[ProcessMemory]
    leaks: list[MemoryLeak]
    ooms: list[OutOfMemory]


# ---------------------------------------------------------------- collectives
@row
class CollectiveGroup:
    """A process group of ``Run.collective_groups``."""

    group: str
    desc: str
    backend: str
    size: int
    ranks: list[int]


@row
class CollectiveOp:
    """Time and waits per group and op (``RunAnalysis.comms.by_op``: ``analysis.comm_cost.by_op``)."""

    group: str
    op: str
    collectives: int
    calls: int
    bytes: int
    time_ms_per_rank: float
    wait_ms_per_rank: float
    per_step: float | None


@row
class StragglerSite:
    """The collective at which a straggler made the others wait longest, as it issued it."""
    group: str
    seq: int
    op: str
    bytes: int
    source: str
    user_source: str
    module: str
    bwd: bool


@row
class NoStragglerSite:
    """No such collective found: ``{}`` in JSON."""


@row
class Straggler:
    """``analysis.stragglers.stragglers``."""

    rank: int
    times_last: int
    wait_caused_ns: int
    share: float | None
    steps: list[int]
    waited_ns: int
    wait_in_steps_ns: int
    where: StragglerSite | NoStragglerSite


@row
class StragglerStep:
    """``analysis.stragglers.straggler_steps``."""

    step: int
    rank: int
    wait_caused_ns: int
    significant: bool
    threshold_ns: float


@row
class Mismatch:
    """``RunAnalysis.collective_mismatches`` (``analysis.collective_match.mismatches``)."""

    group: str
    seq: int
    kind: str
    ranks: list[int]
    detail: str


@row
class InFlight:
    """``analysis.collective_match.in_flight``."""

    rank: int
    group: str
    seq: int
    op: str
    bytes: int
    dtype: str
    status: str
    ts: int
    step: int
    source: str
    arrived: list[int] | None
    missing: list[int] | None


@row
class Overlap:
    """``analysis.comm_cost.overlap_by_rank`` of ``RunAnalysis.collective_overlap``."""

    rank: int
    steps: int
    comm_ms: float
    overlapped_ms: float
    exposed_ms: float
    step_ms: float
    exposed_pct: float | None


@row
class Bandwidth:
    """``analysis.comm_cost.group_bandwidth``."""

    group: str
    op: str
    group_size: int
    calls: int
    bytes: int
    transfer_ns: int
    algbw: float | None
    busbw: float | None


@row
class ClockOffset:
    """``RunAnalysis.collective_offsets`` (``analysis.clock.clock_offsets``)."""

    rank: int
    offset_start: int
    offset_end: int
    ts_start: int
    ts_end: int
    rtt: int
    same_clock: bool
    measured: bool


@row
class CollectivesSection:
    """Collectives matched across ranks (``RunAnalysis.collectives_matched``) and what they cost."""

    captured: Literal[True] = True
    ranks: int
    collectives: int
    calls: int
    status: dict[str, int]
    groups: list[CollectiveGroup]
    by_op: list[CollectiveOp]
    steady_steps: int
    median_step_ms: float
    threshold_ms: float | None
    stragglers: list[Straggler]
    straggler_steps: list[StragglerStep]
    mismatches: list[Mismatch]
    in_flight: list[InFlight]
    overlap: list[Overlap]
    bandwidth: list[Bandwidth]
    clock: list[ClockOffset]


@row
class CollectivesNotCaptured:
    """No collective in the run: ``ranks`` says whether one was to be expected."""
    captured: Literal[False] = False
    ranks: int


# ---------------------------------------------------------------- metrics, dumps, health
@row
class MetricSummary:
    rank: int
    name: str
    steps: int
    first: float | None
    last: float | None
    min: float | None
    max: float | None
    mean: float | None


@row
class DumpThread:
    tid: int
    source: str
    stack: str


@row
class DumpCollective:
    """A collective in flight on the dump's rank (``Run.dump_collectives``): issued ``for_s``
    seconds before the dump and not completed."""
    op: str
    group: str
    seq: int
    bytes: int
    peer: int
    for_s: float


@row
class DumpQueue:
    """A device queue at the dump (``Run.dump_queues``), as the backend last reported it (live
    between sampled steps too): ``depth`` ops queued ``depth_age_s`` seconds before the dump; the last flush (None: none seen)
    began ``flush_age_s`` before it and waited ``flush_ms`` for ``flush_ops`` ops."""
    device: str
    depth: int
    depth_age_s: float | None
    flush_reason: str | None
    flush_ops: int
    flush_ms: float | None
    flush_age_s: float | None


@row
class Dump:
    rank: int
    reason: str
    first_step: int
    last_step: int
    """The step in flight at the dump (in it only in part, if it was a sampled step)."""
    detail_steps: list[int]
    """The sampled steps whose whole detail the dump wrote (``Run.dumped_steps``)."""
    threads: list[DumpThread]
    collectives: list[DumpCollective]
    queues: list[DumpQueue]


@row
class RankHealth:
    rank: int
    closed: bool
    committed: bool
    events_written: int
    events_dropped: int
    cap_reached_at_step: int | None
    ignored_bytes: int
    failures: int


@row
class DetailCut:
    """Where a rank's budget ended detail capture (``max_bytes`` or ``max_events``)."""
    rank: int
    step: int
    bytes: int
    by: str
    limit: int
    tables: list[str]
    later_steps: int
    t_s: float | None


@row
class CollectorFailure:
    rank: int
    collector: str
    message: str


@row
class DeviceGap:
    """Steps of a capture window whose device activity was not captured, and why (the job's own
    torch.profiler held Kineto, the device's trace could not be read)."""
    rank: int
    first_step: int
    last_step: int
    reason: str


@row
class Conflict:
    rank: int
    pid: int | float
    hostname: str | None
    argv: list[str]
    time_ns: float | None
    holder_pid: float | None
    live: bool | None


@row
class CommandExit:
    """How ``record``'s command ended: an exit code or a signal."""
    code: int | Absent = ABSENT
    signal: int | Absent = ABSENT


@row
class DamagedFile:
    """A rank's file damaged so that what it committed cannot be read (``reader.Damage``): the
    report says so first, and ``report --json`` carries it (``health.damage``) for a CI gate."""
    rank: int
    file: str            # relative to the run directory: rank-00000/manifest.jsonl
    what: str            # "is missing", "is empty", "holds no complete commit"
    tables: list[str]    # the tables it left unreadable
    bytes: int


@row
class Health:
    damage: list[DamagedFile]
    ranks: list[RankHealth]
    detail_cuts: list[DetailCut]
    failures: list[CollectorFailure]
    device_gaps: list[DeviceGap]
    stale_rank_dirs: list[str]
    missing_ranks: list[int]
    conflicts: list[Conflict]
    command_exit: CommandExit | None


# ---------------------------------------------------------------- the summary
@row
class Summary:
    """Everything ``neuron-prof report`` shows (``summary.build.summarize``)."""
    run: RunFacts
    startup: list[Startup]
    steps: list[StepStats]
    warmup_steps: list[WarmupStep]
    step_breakdown: list[StepBreakdown]
    time_split: list[TimeSplit]
    ops: OpsSection
    precision: PrecisionSection
    recompute: list[Recompute]
    efficiency: EfficiencySection
    sync_points: SyncSection
    device: DeviceSection | NotCaptured
    compile: CompileSection
    memory: MemorySection | NotCaptured
    collectives: CollectivesSection | CollectivesNotCaptured
    metrics: list[MetricSummary]
    dumps: list[Dump]
    health: Health

    def to_json(self) -> dict[str, Any]:
        """The summary as ``report --json`` prints it and the run stores it."""
        return to_json(self)

    @classmethod
    def from_json(cls, doc: Any) -> Summary:
        """``doc`` (parsed JSON, e.g. a stored summary) as a Summary if every field has its type;
        raises ``codec.NotASummary`` (a ValueError naming the first field that does not) else."""
        return from_json(cls, doc)
