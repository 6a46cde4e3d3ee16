"""The run store's tables: one schema, versioned. Timestamps are int64 ns on CLOCK_MONOTONIC.

A rank folder holds one append-only Arrow IPC stream per table (``<table>.arrows``) and a
``manifest.jsonl`` whose last complete line says how many bytes of each table are committed.
Strings and Python stacks are interned: other tables hold ids into ``strings`` and ``stacks``.
Interned ids are dense, in row order, from 0 or 1; id 0 of ``strings`` and ``stacks`` is the empty
string and the empty stack (written or not); :data:`REFERENCES` says which columns hold which ids.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 6
"""2: manifest lines carry CRC-32s of the committed bytes and of themselves (``store.sign``);
readers verify them for runs of version 2 and read version 1 runs without. 3: always-on capture
samples its detail, and a dump names the steps it wrote whole in ``dumped_steps`` (version 2's
always-on ranks kept every step's detail: a dump's first_step..last_step were those steps). Tables
added since (``dump_collectives``, ``dump_queues``) need no new version: a reader that predates
them skips them, and reads an older run as having none. 4: ``ops.recompute`` (:data:`ADDED_COLUMNS`). 5: the
device tables come from the backend's Kineto activity (``neuron_prof.backends.device_activity``): their rows'
host op, module, stack and pass are joined from ``ops`` at read time (an older run's backend hook API
recorded them; the reader keeps those), ``device_copies`` and ``device_gaps`` are new, and
``device_enqueues.queue_depth`` is -1 where the backend does not say it."""
TABLE_SUFFIX = ".arrows"
JOURNAL_SUFFIX = ".journal"
JOURNALED = ("ops", "steps", "marks", "metrics", "memory_events", "memory_steps", "process_memory", "collectives",
             "device_enqueues", "queue_flushes", "device_kernels", "kernel_enqueues", "fallbacks", "event_enqueues",
             "event_completions", "stream_waits", "stream_syncs", "device_copies")
"""Tables written at every step boundary: rows go first to ``<table>.journal`` as packed
little-endian records (one write per step, cheap), and are moved into the Arrow stream in bulk
(every few seconds and at close). Readers read both, each up to its committed size."""
MANIFEST = "manifest.jsonl"
RANK_META = "rank.json"
RUN_META = "run.json"
RANK_LOCK = ".writer.lock"
"""Held (``flock``) by the process writing a rank folder, for as long as it writes."""
CONFLICT_GLOB = "rank-*.conflict-*.json"
"""A process refused a rank folder that another process owned: one note each, in the run directory."""


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def conflict_note_name(rank: int, pid: int) -> str:
    return f"{rank_dir_name(rank)}.conflict-{pid}.json"


_i8, _i16, _i32, _i64 = pa.int8(), pa.int16(), pa.int32(), pa.int64()

TABLES: dict[str, pa.Schema] = {
    # interning
    "strings": pa.schema([("id", _i32), ("value", pa.string())]),
    "frames": pa.schema([("id", _i32), ("file", _i32), ("func", _i32), ("line", _i32)]),
    "stacks": pa.schema([("id", _i32), ("frames", pa.list_(_i32))]),  # innermost frame first
    # each file the frames name, read once at capture (neuron_prof.store.source_files): size and SHA-256
    # (hex) of the bytes the path resolved to, or size -1, no hash and why it could not be read
    "source_files": pa.schema([("file", _i32), ("size", _i64), ("sha256", pa.string()), ("error", pa.string())]),
    # events
    "ops": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("name", _i32), ("module", _i32),
        ("stack", _i32), ("shapes", _i32), ("dtypes", _i32), ("devices", _i32),
        ("seq", _i64), ("fwd_tid", _i64), ("bwd", pa.bool_()), ("depth", _i16), ("recompute", pa.bool_()),
    ]),
    "steps": pa.schema([
        ("step", _i32), ("ts", _i64), ("dur", _i64), ("active", pa.bool_()), ("complete", pa.bool_()),
    ]),
    "marks": pa.schema([("ts", _i64), ("dur", _i64), ("tid", _i64), ("name", _i32), ("stack", _i32)]),
    # scalars of the training, every step whether captured in detail or not: ``loss`` (the scalar
    # ``backward()`` was called on; collector "loss"), ``tokens``/``samples`` (``prof.step(tokens=)``,
    # ``record --tokens-per-step``) and whatever ``neuron_prof.log(name, value)`` names; ts: when
    # the value was handed over (its step is the one that ts falls in)
    "metrics": pa.schema([("ts", _i64), ("tid", _i64), ("name", _i32), ("value", pa.float64())]),
    "threads": pa.schema([("tid", _i64), ("name", _i32)]),
    "failures": pa.schema([("ts", _i64), ("collector", pa.string()), ("message", pa.string())]),
    # spans of the run that are not steps (name: an id into ``strings``): ``start-up``, the
    # process's time from capture start to its first module call when capture began with it
    "spans": pa.schema([("ts", _i64), ("dur", _i64), ("tid", _i64), ("name", _i32)]),
    # compiler (collector "compiler"): string columns are ids into ``strings``
    "compiles": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("compile_id", _i32), ("func", _i32), ("file", _i32),
        ("line", _i32), ("backend", _i32), ("status", _i32), ("fail_reason", _i32), ("graph_ops", _i32),
        ("guards", _i32), ("cache_size", _i32), ("stack", _i32),
    ]),
    "compile_phases": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("compile_id", _i32), ("phase", _i32), ("depth", _i16),
    ]),
    "graph_breaks": pa.schema([
        ("ts", _i64), ("compile_id", _i32), ("gb_id", _i32), ("reason", _i32), ("reason_class", _i32),
        ("stack", _i32),
    ]),
    "recompiles": pa.schema([("ts", _i64), ("compile_id", _i32), ("func", _i32), ("reason", _i32)]),
    "fusions": pa.schema([
        ("ts", _i64), ("compile_id", _i32), ("backend", _i32), ("kernel", _i32), ("nodes", pa.list_(_i32)),
    ]),
    "compile_cache": pa.schema([
        ("ts", _i64), ("compile_id", _i32), ("cache", _i32), ("result", _i32),
    ]),
    # memory (collector "memory"); kind: a code into MEMORY_KINDS
    "memory_events": pa.schema([
        ("ts", _i64), ("alloc_ts", _i64), ("addr", _i64), ("bytes", _i64), ("device", _i32), ("tid", _i64),
        ("op", _i32), ("top_op", _i32), ("module", _i32), ("stack", _i32), ("shape", _i32), ("dtype", _i32),
        ("bwd", pa.bool_()), ("kind", _i8), ("total_allocated", _i64), ("total_reserved", _i64),
        ("grad", pa.bool_()),
    ]),
    "memory_steps": pa.schema([
        ("step", _i32), ("ts", _i64), ("device", _i32), ("live", _i64), ("peak", _i64), ("allocated", _i64),
        ("reserved", _i64),
    ]),
    "memory_tensors": pa.schema([
        ("ts", _i64), ("step", _i32), ("addr", _i64), ("device", _i32), ("bytes", _i64), ("category", _i32),
        ("shape", _i32), ("dtype", _i32),
    ]),
    "memory_ooms": pa.schema([
        ("ts", _i64), ("step", _i32), ("device", _i32), ("bytes", _i64), ("message", _i32),
    ]),
    # where each PrivateUse1 device's memory_steps figures come from (collector "memory"), decided
    # once per device: figures_from (MEMORY_FIGURES), api (the function its counters were read with;
    # empty for allocator events); a device without a row is followed by allocator events
    "memory_sources": pa.schema([("ts", _i64), ("device", _i32), ("figures_from", _i32), ("api", _i32)]),
    # what keeps the storages alive that were made in steps and still live at the end of capture or
    # at a dump (collector "memory", collectors/_keepers.py): ts of the walk, the storage (device,
    # addr), via (tensor: a Python tensor over it; autograd graph: saved by a tensor's graph), the
    # keeper as the user wrote it (``list history``), its scope (``global``, ``Trainer attribute``,
    # ``local of main()``) and file; all ids into ``strings`` but ts and addr
    "memory_keepers": pa.schema([
        ("ts", _i64), ("device", _i32), ("addr", _i64), ("via", _i32), ("keeper", _i32), ("scope", _i32),
        ("file", _i32),
    ]),
    # each such walk: how long it took, objects it looked through, storages looked for and kept
    # (with a keeper), why it stopped early ("": it did not), and the stack of the user's call that
    # ended steps (``prof.step()``, the optimizer's step): the file that runs the step loop
    "keeper_walks": pa.schema([
        ("ts", _i64), ("dur", _i64), ("objects", _i64), ("storages", _i32), ("kept", _i32), ("stopped", _i32),
        ("stack", _i32),
    ]),
    # the process's resident memory at every step boundary (collector "memory"; Linux)
    "process_memory": pa.schema([("step", _i32), ("ts", _i64), ("rss", _i64)]),
    # collectives (collector "collectives"): one row per collective this rank issued. ts/dur: the
    # issue call on thread tid; done: when the backend completed it (-1: not known); seq: the
    # group's own sequence number (the same on every rank for one collective); bytes/out_bytes:
    # tensor bytes this rank sends/receives; peer: root or peer rank in the group (-1: none);
    # status: a code into COLLECTIVE_STATUS
    "collectives": pa.schema([
        ("ts", _i64), ("dur", _i64), ("done", _i64), ("tid", _i64), ("op", _i32), ("call", _i32),
        ("group", _i32), ("seq", _i64), ("count", _i32), ("bytes", _i64), ("out_bytes", _i64),
        ("dtype", _i32), ("peer", _i32), ("async_op", pa.bool_()), ("status", _i8), ("module", _i32),
        ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    # the process groups collectives ran on: name, description, backend, size, this rank's rank in
    # the group, and the group's members as global ranks (empty: not known)
    "groups": pa.schema([
        ("group", _i32), ("desc", _i32), ("backend", _i32), ("size", _i32), ("group_rank", _i32),
        ("ranks", pa.list_(_i32)),
    ]),
    # what the device did, as its backend reports it to PyTorch's profiler (Kineto; collector
    # "device", neuron_prof.backends.device_activity; an imported trace's the same). device: "neuron:0"-style
    # (the backend's name and index); tid: the host thread of a launch, wait or call (0 for a
    # kernel); host_op/module/stack/bwd: the host op open on that thread at ts, joined from ``ops``
    # at read time (0 as written since schema 5). id: an enqueue's is its launch's correlation id, a
    # kernel's its own, unique per process. reason: sync, size, fallback, synchronize, other,
    # stream_synchronize, event_synchronize
    "device_enqueues": pa.schema([
        ("ts", _i64), ("tid", _i64), ("id", _i64), ("device", _i32), ("stream", _i32), ("op", _i32),
        ("queue_depth", _i32), ("host_op", _i32), ("module", _i32), ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    "queue_flushes": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("device", _i32), ("reason", _i32), ("ops", _i32),
        ("host_op", _i32), ("module", _i32), ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    "device_kernels": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("id", _i64), ("device", _i32), ("stream", _i32),
        ("name", _i32), ("n_ops", _i32),
    ]),
    # the enqueued ops each kernel ran: device_kernels.id, device_enqueues.id (the backend's order)
    "kernel_enqueues": pa.schema([("kernel", _i64), ("enqueue", _i64)]),
    "fallbacks": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("device", _i32), ("op", _i32), ("bytes_to_host", _i64),
        ("bytes_from_host", _i64), ("host_op", _i32), ("module", _i32), ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    # streams and events (hook API version 2). event: the backend's id of an event; stream: its
    # stream id on the device (0: default), -1 in stream_syncs: every stream of the device.
    # event_enqueues: a record (kind "record") or wait ("wait") a host thread put on a stream, with
    # the host op open on it (or the thread's user line: stack); event_completions: the device
    # reached a record (ts: the event's timestamp); stream_waits: a stream stood idle at a wait for
    # an event not yet complete; stream_syncs: host waits with their stream and event (each also a
    # queue_flushes row of the same tid and ts; reason as there)
    "event_enqueues": pa.schema([
        ("ts", _i64), ("tid", _i64), ("device", _i32), ("stream", _i32), ("event", _i64), ("kind", _i32),
        ("host_op", _i32), ("module", _i32), ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    "event_completions": pa.schema([("ts", _i64), ("device", _i32), ("stream", _i32), ("event", _i64)]),
    "stream_waits": pa.schema([("ts", _i64), ("dur", _i64), ("device", _i32), ("stream", _i32), ("event", _i64)]),
    "stream_syncs": pa.schema([
        ("ts", _i64), ("dur", _i64), ("tid", _i64), ("device", _i32), ("stream", _i32), ("event", _i64),
        ("reason", _i32), ("ops", _i32), ("host_op", _i32), ("module", _i32), ("stack", _i32), ("bwd", pa.bool_()),
    ]),
    # copies and sets on the device (Kineto's gpu_memcpy, gpu_memset): kind (HtoD, DtoH, DtoD, HtoH,
    # PtoP ... as the copy's name says; memset), bytes (-1: not said), and the host call that issued
    # it: tid, host_ts (-1: none seen), its host op at read time
    "device_copies": pa.schema([
        ("ts", _i64), ("dur", _i64), ("device", _i32), ("stream", _i32), ("kind", _i32), ("bytes", _i64),
        ("name", _i32), ("tid", _i64), ("host_ts", _i64), ("host_op", _i32), ("module", _i32), ("stack", _i32),
        ("bwd", pa.bool_()),
    ]),
    # stretches of capture windows whose device activity was not captured, and why (the job's own
    # torch.profiler held Kineto, Kineto did not start)
    "device_gaps": pa.schema([("ts", _i64), ("dur", _i64), ("reason", _i32)]),
    # what the dispatcher says an op that ran with the PrivateUse1 device's tensors ran on there
    # (collectors/_dispatch.py): device (the backend's name), op, path (op_support.PATHS: kernel,
    # composite, device, host, cpu, mixed, missing, unknown); once per op name
    "op_dispatch": pa.schema([("device", _i32), ("op", _i32), ("path", _i32)]),
    # always-on capture's dumps (neuron_prof/capture/always_on.py): one row per thread named by a dump;
    # first_step..last_step: the steps whose detail it wrote (last_step: the one in flight)
    "dumps": pa.schema([
        ("ts", _i64), ("reason", _i32), ("first_step", _i32), ("last_step", _i32), ("tid", _i64), ("stack", _i32),
    ]),
    # the sampled steps whose whole detail a dump (at ts) wrote: the run's active steps
    "dumped_steps": pa.schema([("ts", _i64), ("step", _i32)]),
    # where the job was at a dump (at ts), besides its threads' stacks: the collectives this rank
    # had issued and not seen complete (op, group, seq; since: when issued; peer: root or peer
    # rank, -1: none), from the collectives collector's in-flight ring (INFLIGHT) ...
    "dump_collectives": pa.schema([
        ("ts", _i64), ("since", _i64), ("op", _i32), ("group", _i32), ("seq", _i64), ("bytes", _i64), ("peer", _i32),
    ]),
    # ... and each device queue as the device collector last saw it: depth (ops queued, after the
    # last enqueue seen; 0 once a flush after it drained the queue) as of depth_ts, and the last
    # flush (flush_ts -1: none seen): its start, wait, reason and ops waited for
    "dump_queues": pa.schema([
        ("ts", _i64), ("device", _i32), ("depth", _i32), ("depth_ts", _i64), ("flush_ts", _i64), ("flush_dur", _i64),
        ("flush_reason", _i32), ("flush_ops", _i32),
    ]),
    # this rank's clock against rank 0's, measured at capture start and again at its end:
    # rank 0's CLOCK_MONOTONIC = ts + offset (± rtt/2); same_clock: both read one clock (same host
    # and boot), so the offset used is 0 whatever the estimate says
    "clock_sync": pa.schema([
        ("ts", _i64), ("offset", _i64), ("rtt", _i64), ("same_clock", pa.bool_()), ("phase", _i32),
    ]),
}


ADDED_COLUMNS: dict[str, dict[str, int]] = {"ops": {"recompute": 4}}
"""table -> column -> the schema version that appended it (columns are only ever appended, each with
a default: False, 0): an older run's journal rows lack it (:func:`schema_of`), and a reader reads it
as the default (``reader.RankData.table``)."""


def schema_of(table: str, version: int) -> pa.Schema:
    """``table``'s columns as a writer of schema ``version`` laid them out."""
    schema = TABLES[table]
    for column, since in ADDED_COLUMNS.get(table, {}).items():
        if version < since:
            schema = schema.remove(schema.get_field_index(column))
    return schema


_STRING_IDS = {
    "frames": ("file", "func"),
    "source_files": ("file",),
    "ops": ("name", "module", "shapes", "dtypes", "devices"),
    "marks": ("name",),
    "metrics": ("name",),
    "threads": ("name",),
    "spans": ("name",),
    "compiles": ("compile_id", "func", "file", "backend", "status", "fail_reason"),
    "compile_phases": ("compile_id", "phase"),
    "graph_breaks": ("compile_id", "gb_id", "reason", "reason_class"),
    "recompiles": ("compile_id", "func", "reason"),
    "fusions": ("compile_id", "backend", "kernel", "nodes"),
    "compile_cache": ("compile_id", "cache", "result"),
    "memory_events": ("device", "op", "top_op", "module", "shape", "dtype"),
    "memory_steps": ("device",),
    "memory_tensors": ("device", "category", "shape", "dtype"),
    "memory_ooms": ("device", "message"),
    "memory_sources": ("device", "figures_from", "api"),
    "memory_keepers": ("device", "via", "keeper", "scope", "file"),
    "keeper_walks": ("stopped",),
    "collectives": ("op", "call", "group", "dtype", "module"),
    "groups": ("group", "desc", "backend"),
    "clock_sync": ("phase",),
    "device_enqueues": ("device", "op", "host_op", "module"),
    "queue_flushes": ("device", "reason", "host_op", "module"),
    "device_kernels": ("device", "name"),
    "fallbacks": ("device", "op", "host_op", "module"),
    "event_enqueues": ("device", "kind", "host_op", "module"),
    "event_completions": ("device",),
    "stream_waits": ("device",),
    "stream_syncs": ("device", "reason", "host_op", "module"),
    "device_copies": ("device", "kind", "name", "host_op", "module"),
    "device_gaps": ("reason",),
    "op_dispatch": ("device", "op", "path"),
    "dumps": ("reason",),
    "dump_collectives": ("op", "group"),
    "dump_queues": ("device", "flush_reason"),
}
REFERENCES: dict[str, dict[str, str]] = {
    table: {**{c: "strings" for c in _STRING_IDS.get(table, ())},
            **({"stack": "stacks"} if "stack" in schema.names else {}),
            **({"frames": "frames"} if table == "stacks" else {})}
    for table, schema in TABLES.items()
}
"""table -> column -> the interned table its ids (or lists of ids) point into."""
LOWEST_REFERENCE = {"strings": 0, "stacks": 0, "frames": 1}
"""The smallest id a reference into each interned table may hold."""


COLLECTIVE_STATUS = ("completed", "failed", "in_flight", "unknown")
"""``collectives.status`` codes: completed; completed with an error (a timeout, an aborted group);
still in flight when the capture ended; issued, but the backend reports no completion."""
INFLIGHT = "collectives.inflight"
"""A rank's in-flight collectives, as a memory-mapped ring of fixed slots that survives kill -9
(collectors/_comms.cpp writes it; the reader reads it): a 64-byte header (magic, slot size, slot
count, header size as little-endian int64) and slots of :data:`INFLIGHT_SLOT`."""
INFLIGHT_MAGIC = 0x3130464E4950504E
INFLIGHT_SLOT = np.dtype([("id", "<i8"), ("ts", "<i8"), ("done", "<i8"), ("seq", "<i8"), ("bytes", "<i8"),
                          ("state", "<i4"), ("peer", "<i4"), ("op", "S24"), ("group", "S56")])
INFLIGHT_STATES = {1: "in_flight", 2: "completed", 3: "failed"}
STEP_RING = "steps.ring"
"""A rank's latest step rows, as a memory-mapped ring of fixed slots that survives kill -9
(neuron_prof.store.step_ring writes it at every step boundary; the reader adds the steps it holds past the
last commit of a rank that did not close): the same 64-byte header as :data:`INFLIGHT`, then slots
of :data:`STEP_RING_SLOT`, step ``s`` in slot ``s % count``; ``crc`` is the CRC-32 of the slot's
first 24 bytes (a slot torn by the kill fails it and reads as absent)."""
STEP_RING_MAGIC = 0x313050545350504E  # "NPPSTP01"
STEP_RING_SLOT = np.dtype([("step", "<i4"), ("active", "u1"), ("complete", "u1"), ("_pad", "V2"), ("ts", "<i8"),
                           ("dur", "<i8"), ("crc", "<u4"), ("_pad2", "V4")])

MEMORY_KINDS = ("alloc", "free", "baseline", "late_free", "live", "oom", "recent", "unfollowed")
"""``memory_events.kind`` codes. All but ``recent`` are the native tracker's (collectors/_memtrack.py
says what each means); ``recent`` marks the allocator events written out with an OOM."""
MEMORY_FIGURES = ("allocator events", "backend counters")
"""``memory_sources.figures_from``: a device's ``memory_steps`` rows are the allocator reports the
tracker received (live bytes since capture began, the peak between boundaries), or the backend's own
counters read at each boundary (its allocated bytes, its high-water mark: totals only, no lines)."""
LEAK_CONFIRMED_BY = ("the allocator's own count", "the backend's counters")
"""A leak's ``confirmed_by`` (``analysis.memory.leaks``): what besides the live bytes the capture
saw says the device's memory grows ("" where nothing does)."""


def row_dtype(schema: pa.Schema) -> np.dtype:
    """The packed record layout of a fixed-width table's journal (field order = schema order)."""
    return np.dtype([(f.name, "?" if pa.types.is_boolean(f.type) else np.dtype(f.type.to_pandas_dtype()).newbyteorder("<"))
                     for f in schema])


INTERNED = ("strings", "frames", "stacks")
"""Tables other tables point into: a reader resolves them into its tables' columns."""
ATTRIBUTE_OF_TABLE: dict[str, str] = {t: {"groups": "collective_groups"}.get(t, t) for t in TABLES if t not in INTERNED}
"""The name each event table has on a read run (``neuron_prof.load(path).<name>``)."""
TABLE_OF_ATTRIBUTE: dict[str, str] = {a: t for t, a in ATTRIBUTE_OF_TABLE.items()}

DESCRIPTIONS: dict[str, str] = {
    "steps": "One row per step and rank: step, ts, dur, active (captured in detail), complete. In an always-on "
             "run the steps a dump wrote whole (``dumped_steps``) and those captured on demand are the active ones; "
             "the step in flight at the dump is in it only in part.",
    "dumps": "Always-on capture's dumps, a row per thread each named: rank, ts, reason, first_step (the oldest "
             "sampled step whose detail it wrote), last_step (the step in flight), tid and that thread's stack "
             "(source...).",
    "dumped_steps": "Always-on capture: the sampled steps whose whole detail a dump wrote (rank, ts of the dump, "
                    "step).",
    "dump_collectives": "Always-on capture: the collectives each dump found in flight on its rank (issued, not "
                        "completed): rank, ts (the dump's), since (when it was issued), op, group, seq, bytes, peer, "
                        "step (the one in flight at the dump).",
    "dump_queues": "Always-on capture: each device queue at a dump, as the device collector last saw it: rank, ts "
                   "(the dump's), device, depth (queued ops) as of depth_ts, and the last flush: flush_ts (-1: none "
                   "seen), flush_dur, flush_reason (sync, size, fallback, synchronize, other), flush_ops, step.",
    "ops": "One row per ATen op: rank, ts, dur, tid, thread, name, module, source, shapes, ..., recompute (a "
           "forward op re-run inside the backward pass: activation checkpointing), step.",
    "spans": "Spans of the run that are not steps: ``start-up`` (under ``record``: the process from its start to "
             "its first module call). neuron_prof's own work at step boundaries is the gap between one step's "
             "end and the next one's start (``analysis.steps.own_work``).",
    "marks": "User ranges from ``neuron_prof.mark``.",
    "metrics": "Scalars of the training, one row per value: ``loss`` (each ``backward()``'s root), "
               "``tokens``/``samples`` per step, and what ``neuron_prof.log`` named; ``step``: the step the value "
               "was handed over in (``analysis.metrics.per_step``: one value per step).",
    "threads": "The name of each thread that recorded: rank, tid, name.",
    "source_files": "Each source file the rank's stacks name, as capture read it once: rank, file, size and sha256 "
                    "(hex) of the file the path resolved to, or size -1, no sha256 and the error that kept it "
                    "from being read. What a page shows as source must match it (viewer/source.py).",
    "failures": "Collectors that failed during capture (training went on without them); a name "
                "``collector (table)``: it lost events of that table (counted as dropped) and went on.",
    "compiles": "One row per frame compilation: compile_id, func/file/line, backend, status, time, ops, guards.",
    "compile_phases": "Phases of each compile (bytecode tracing, AOT autograd, backend compile, ...).",
    "graph_breaks": "One row per graph break: reason, reason_class, gb_id, source (user file:line), compile_id.",
    "recompiles": "One row per failed guard that caused a recompile.",
    "fusions": "One row per generated kernel: the FX nodes fused into it (``nodes``, a list).",
    "compile_cache": "FX graph / AOT autograd cache lookups: cache, result (hit, miss, bypass).",
    "memory_events": "Allocator events: kind (alloc, free, baseline, late_free, live, oom, recent, unfollowed), bytes "
                     "(negative for frees), device, addr, alloc_ts (pairs a free with its allocation), op, top_op, "
                     "module, source; see collectors/memory.py.",
    "memory_steps": "Live bytes (allocated since capture began) and peak per device at every step boundary; for a "
                    "device read from its backend's counters (``memory_sources``), its allocated bytes and its "
                    "high-water mark.",
    "memory_tensors": "Parameters, gradients and optimizer state by storage address at captured step boundaries.",
    "memory_ooms": "Out-of-memory errors that ended the capture: message, requested bytes, device, step.",
    "memory_sources": "Where each PrivateUse1 device's ``memory_steps`` figures come from: rank, ts (when it was "
                      "decided), device, figures_from (``allocator events``: its allocator reports to the profiler; "
                      "``backend counters``: it does not, and the backend's own counters were read at each step "
                      "boundary: totals only, no lines), api (the function read, e.g. "
                      "``torch.neuron.memory_stats``). A device without a row is followed by allocator events.",
    "process_memory": "The process's resident memory (RSS) at every step boundary, per rank (Linux).",
    "memory_keepers": "What keeps alive the storages made in steps and still live when capture ended or at a dump: "
                      "rank, ts (of the walk), device, addr, via (``tensor``: a Python tensor over it; ``autograd "
                      "graph``: a tensor's graph saved it), keeper (``list history``, ``dict self.cache``), scope "
                      "(``global``, ``Trainer attribute``, ``local of main()``), file. A storage whose keeper the "
                      "walk did not find has no row.",
    "keeper_walks": "Each walk for ``memory_keepers``: rank, ts, dur, objects (Python objects looked through), "
                    "storages (looked for), kept (found a keeper), stopped (why it stopped early; \"\": it did not), "
                    "and the stack of the user's call that ended steps (source...): the file running the step loop. "
                    "A run without rows (older, or killed before capture ended) has no keepers recorded.",
    "collectives": "One row per collective per rank (collector ``collectives``): ts/dur (the issue call on thread "
                   "tid, the rank's own clock), done (completed, -1: not known), op, call (the c10d op), group, "
                   "group_desc, group_size, seq (one collective has one (group, seq) on every rank), count, bytes, "
                   "out_bytes, dtype, peer, async_op, status (completed, failed, in_flight, unknown), module, "
                   "source (the issuing user line), bwd, step. A rank killed before its last flush adds the "
                   "collectives its in-flight file still holds; their module and source are not known.",
    "groups": "The process groups each rank's collectives ran on: group (name), desc, backend, size, group_rank "
              "(the rank's place in it), ranks (its members as global ranks; empty: unknown).",
    "device_enqueues": "Ops a device backend put on its queue (collector ``device``): rank, ts, tid (host thread), "
                       "id, device (``neuron:0``), stream, op, queue_depth (after it), the host op open on the "
                       "thread (host_op, module, source, ..., bwd), step. The enqueuing op is the ``ops`` row of "
                       "the same rank and tid whose span holds ts.",
    "queue_flushes": "Waits of a host thread for a device queue to drain: rank, ts, dur, tid, device, reason (sync, "
                     "size, fallback, synchronize, other, stream_synchronize, event_synchronize), ops (queued ops waited for), host_op, module, source, "
                     "..., bwd, step.",
    "device_kernels": "Kernels a device backend ran: rank, ts, dur, tid (the reporting thread), id, device, stream, "
                      "name, n_ops, enqueue_ids (the ``device_enqueues.id`` of the ops it ran, a list), step.",
    "kernel_enqueues": "Which enqueued ops each kernel ran: rank, kernel (``device_kernels.id``), enqueue "
                       "(``device_enqueues.id``), in the backend's order.",
    "fallbacks": "Ops a device backend ran on the CPU instead: rank, ts, dur, tid, device, op, bytes_to_host, "
                 "bytes_from_host, host_op, module, source, ..., bwd, step.",
    "event_enqueues": "Event records (kind ``record``) and waits (kind ``wait``) a host thread put on a device "
                      "stream (hook API version 2): rank, ts, tid, device, stream, event (the backend's id), kind, "
                      "the host op open on the thread (host_op, module) and source (the thread's user line when "
                      "no op was open), ..., bwd, step.",
    "event_completions": "Events the device completed (it reached their record): rank, ts (the event's timestamp, "
                         "what ``Event.elapsed_time`` reads), device, stream, event, step.",
    "stream_waits": "Waits of a device stream for an event not yet complete (the stream stood idle): rank, ts, "
                    "dur, device, stream, event (its ``event_enqueues`` row of kind ``wait`` has the host line), "
                    "step.",
    "stream_syncs": "Host waits with their stream and event (hook API version 2; each is also a ``queue_flushes`` "
                    "row of the same rank, tid and ts): rank, ts, dur, tid, device, stream (-1: every stream of "
                    "the device), event (0: none), reason (as in ``queue_flushes``, and stream_synchronize, "
                    "event_synchronize), ops, host_op, module, source, ..., bwd, step.",
    "device_copies": "Copies and sets the device ran (Kineto's gpu_memcpy and gpu_memset): rank, ts, dur, device, "
                     "stream, kind (HtoD, DtoH, DtoD, HtoH, PtoP, memset), bytes (-1: not said), name, and the host "
                     "call that issued it: tid, host_ts (-1: none seen), its host op (host_op, module, source, ..., "
                     "bwd), step.",
    "device_gaps": "Stretches of capture windows whose device activity was not captured: rank, ts, dur, reason (the "
                   "job's own torch.profiler held Kineto, Kineto did not start), step.",
    "op_dispatch": "What PyTorch's dispatcher said, at capture, each op that ran with the PrivateUse1 device's "
                   "tensors ran on there: rank, device (the backend's name), op, path (kernel, composite, device, "
                   "host, cpu: the CPU fallback, mixed: some overloads fall back, missing, unknown).",
    "clock_sync": "Each rank's clock against rank 0's, measured at capture start and end (phase): rank 0's time = "
                  "ts + offset, to within rtt/2; same_clock: both ranks read one clock (the offset that applies "
                  "is 0). ``analysis.clock.clock_offsets`` turns it into the offsets used.",
}
"""What each event table of a read run holds (``help(neuron_prof.store.schema)``; docs/python-api.md)."""


Frame = tuple[str, str, int]
"""(file, function, line): a row of the ``frames`` table, the line that executed, not the function's
``def`` line."""


def lost_events_label(collector: str, table: str) -> str:
    """The name a ``failures`` row gives a collector that lost events of ``table`` and went on
    (counted with ``Recorder.dropped``); a collector's own name alone says it was switched off."""
    return f"{collector} ({table})"


def went_on(failed: str) -> bool:
    """Whether a ``failures`` row's name is a :func:`lost_events_label`: the collector went on."""
    return failed.endswith(")") and " (" in failed
