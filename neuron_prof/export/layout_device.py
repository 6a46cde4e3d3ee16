"""An asynchronous device in a trace: what its eager queue ran, beside the host ops that fed it,
laid out the way Kineto lays out a GPU (a launch on the host thread, an arrow to the kernel on
the stream's track), so a wait on the host reads against the kernels it waited for.

Per rank:

- a "Device <device> (stream <n>)" track per device queue and stream, one slice per kernel
  named as the backend named it ("mul+add+tanh"), with args ``ops`` (the full names of the ops
  it ran, in queue order, ", "-joined: "aten::mul, aten::add, aten::tanh"), ``n_ops``,
  ``kernel_id``, ``step``, and the ``source`` (full path) and ``module`` of its first op.
  Kernels on one stream run one after another; where clock jitter makes two overlap, the later
  goes to a "... #2" lane (slices on one track must nest);
- a collective's kernel ("c10d::allreduce_", on the communication stream) also names its
  collective: args ``op``, ``group``, ``seq`` and ``bytes``, as its host slice has them; and a
  flow from the kernel slice of the rank whose kernel started last (device time, rank 0's clock)
  to every other rank's kernel slice of the same (group, seq), as the host collectives are joined
  (``layout_collectives``): on an asynchronous device the host's slice is only the issue, the
  straggler is seen on the device. Which collective a kernel ran, and who was last, comes from
  ``analysis.device_collectives``;
- a flow from each host op slice that queued work to each kernel that ran some of it, one per
  (op slice, kernel) pair, as a CUDA launch is joined to its kernel;
- copies and sets (``device_copies``) on their stream's track beside its kernels, named as the
  backend names them ("Memcpy DtoH (Device -> Pageable)"), with args ``kind`` and ``bytes``, and a
  flow from the host op slice that issued each;
- streams and events (hook API version 2), drawn as the device ran them: on the waiting stream's
  track a "wait for event <n>" slice per ``stream_waits`` row (the stream stood idle; args
  ``event``, ``recorded_on`` (the stream that recorded it, -1 where its completion was not
  captured), ``source`` (the ``wait_event`` line) and ``record_source``), sharing the stream's
  lanes with its kernels; on the recording stream's track an "event <n>" instant where the device
  reached the record (``event_completions``; args ``event`` and the ``record`` line as
  ``source``); and a flow from that instant to a "released by event <n>" instant at the end of
  each wait it ended. The arrow needs that landing instant: the writer points a flow from the
  earlier of its two events, and the wait slice begins before the event completes. A host call
  is matched to what the device did by stream and event (``analysis.streams.host_call``);
- on the host thread's own track, a "wait for <device> (<reason>)" slice per queue flush (args
  ``reason``, ``ops`` waited for, ``source``, ``host_op``; where its ``stream_syncs`` row names
  one, the ``stream`` (-1: every stream of the device) and ``event`` (0: none) waited for) and a
  "CPU fallback <op>" slice per op the device left to the CPU (``bytes_to_host``,
  ``bytes_from_host``, ``source``, ``device``), each fitted into the op slices around it
  (``_fit_waits``, ``_fit_fallbacks``): the writer would otherwise repair a slice that sticks out
  of its op by a few ns of clock rounding by cutting the op's own slices short;
- a "Queue depth <device>" counter: ops queued and not yet run (``analysis.device.queue_depth``).

Which host op queued what, and which kernel ran it, comes from ``analysis.device``; this module
only lays it out. A run without device tables gets nothing from it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.device import enqueuing_ops, queue_depth
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.streams import host_call, match_last, pick
from neuron_prof.export.clock import TraceClock
from neuron_prof.export.event_columns import lanes, string_args
from neuron_prof.export.layout_collectives import last_rank_flows
from neuron_prof.export.writer import TraceWriter
from neuron_prof.store.keys import backend_key
from neuron_prof.store.open_ops import innermost_ops
from neuron_prof.store.run import Run

OPS_SEPARATOR = ", "
"""Between the op names of a kernel's ``ops`` arg."""
COLLECTIVE_ARGS = ("op", "group", "seq", "bytes")
"""The args a collective's kernel names its collective by, as its host slice names it."""


def _kernel_rows(kernels: pd.DataFrame, rank: pd.Series, kernel: pd.Series) -> np.ndarray:
    """Per (rank, kernel id), the kernel's row in ``kernels``; -1 where it has none."""
    keys = backend_key(kernels["rank"], kernels["id"])
    kernel = kernel.to_numpy(np.int64)
    if not len(keys):
        return np.full(len(kernel), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    q = backend_key(rank, kernel)
    pos = np.minimum(np.searchsorted(keys[order], q), len(keys) - 1)
    return np.where((keys[order][pos] == q) & (kernel >= 0), order[pos], -1)


def _kernel_ops(kernels: pd.DataFrame, corr: pd.DataFrame, rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel: the names of the ops it ran in queue order (joined by ``OPS_SEPARATOR``) and
    its first op's full source line and module; "" where no enqueue is linked to it. ``rows``:
    each correlation row's kernel row (``_kernel_rows``)."""
    text, source, module = (np.full(len(kernels), "", dtype=object) for _ in range(3))
    sel = np.flatnonzero(rows >= 0)
    if not len(sel):
        return text, source, module
    sel = sel[np.lexsort((corr["id"].to_numpy(np.int64)[sel], rows[sel]))]
    krow = rows[sel]
    first = np.ones(len(sel), bool)
    first[1:] = krow[1:] != krow[:-1]
    place = np.arange(len(sel)) - np.maximum.accumulate(np.where(first, np.arange(len(sel)), 0))
    names = string_args(corr["op"])[sel]
    # a join per kernel would be a Python call per kernel: the texts grow one op position at a
    # time instead, each pass over the kernels that long (all passes together touch each op once)
    by_place = np.argsort(place, kind="stable")
    bounds = np.searchsorted(place[by_place], np.arange(int(place.max()) + 2))
    text[krow[first]] = names[first]
    for j in range(1, int(place.max()) + 1):
        now = by_place[bounds[j]:bounds[j + 1]]
        text[krow[now]] = text[krow[now]] + OPS_SEPARATOR + names[now]
    source[krow[first]] = string_args(corr["source_full"])[sel[first]]
    module[krow[first]] = string_args(corr["module"])[sel[first]]
    return text, source, module


def _collectives(kernels: pd.DataFrame, coll: pd.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The kernels that ran a captured collective (``coll``: one row per such kernel, with the
    rank whose kernel of it started last, as ``analysis.device_collectives``' ``waits`` has them):
    per kernel, its row in the columns returned (-1: not a collective's kernel), and the columns:
    the kernel's ``row`` in ``kernels`` and its collective's ``rank``, ``op``, ``group``, ``seq``,
    ``bytes`` and ``last`` rank (-1: unknown)."""
    rows = _kernel_rows(kernels, coll["rank"], coll["kernel"])
    keep = np.flatnonzero(rows >= 0)
    cols = {"row": rows[keep], "rank": coll["rank"].to_numpy(np.int64)[keep], "op": string_args(coll["op"])[keep],
            "group": string_args(coll["group"])[keep], "seq": coll["seq"].to_numpy(np.int64)[keep],
            "bytes": coll["bytes"].to_numpy(np.int64)[keep], "last": coll["late_rank"].to_numpy(np.int64)[keep]}
    of = np.full(len(kernels), -1, np.int64)
    of[cols["row"]] = np.arange(len(keep))
    return of, cols


def _stream_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lanes for one stream's kernels: one, unless some overlap (clock jitter). ``lanes`` is a
    Python loop per slice, so it runs only for a stream that needs it."""
    order = np.argsort(start, kind="stable")
    reach = np.maximum.accumulate(end[order])
    if not (start[order][1:] < reach[:-1]).any():
        return np.zeros(len(start), np.int64)
    return lanes(start, end)


def _devices(*tables: pd.DataFrame) -> pd.Categorical:
    """The ``device`` columns of ``tables``, concatenated as one categorical with the first
    table's categories first: a stream's tracks are then made in the order the kernels alone
    made them, whatever the other tables add."""
    cols = [t["device"].array for t in tables if len(t)]
    return pd.api.types.union_categoricals(cols) if cols else tables[0]["device"].array


class _StreamEvents:
    """A run's stream waits, event completions and host waits on a stream or an event, each
    matched to what names it: the host lines of the ``record`` and ``wait_event`` calls, the
    completion that ended a wait, the stream and event a queue flush waited for."""

    def __init__(self, run: Run, flushes: pd.DataFrame) -> None:
        calls = run.event_enqueues
        records, waits = (calls[(calls["kind"] == kind).to_numpy()] for kind in ("record", "wait"))
        self.done = run.event_completions
        self.waits = run.stream_waits
        self.done_source = pick(string_args(records["source_full"]), host_call(self.done, self.done["ts"], records),
                                "")
        """Per completion, the line of the record the device reached."""
        self.wait_source = pick(string_args(waits["source_full"]), host_call(self.waits, self.waits["ts"], waits),
                                "")
        """Per stream wait, the line of the ``wait_event`` call the stream reached."""
        self.release = match_last(self.waits, self.waits["ts"], self.done, ("rank", "device", "event"),
                                  forward=True)
        """Per stream wait, the completion that ended it (the event's first at or after its start)."""
        self.sync_stream, self.sync_event = _sync_of(flushes, run.stream_syncs)


def _sync_of(flushes: pd.DataFrame, syncs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per queue flush, the stream and event its ``stream_syncs`` row names (the backend reports
    each host wait to both, with the same rank, tid and ts); -1 and 0 (none) where it has none."""
    row = match_last(flushes, flushes["ts"], syncs, ("rank", "tid"))
    same = pick(syncs["ts"].to_numpy(np.int64), row, -1) == flushes["ts"].to_numpy(np.int64)
    row = np.where(same, row, -1)
    return pick(syncs["stream"].to_numpy(np.int64), row, -1), pick(syncs["event"].to_numpy(np.int64), row, 0)


class _OpsAt:
    """The run's ops by rank, thread and depth in start order: what a slice fitted into the op
    slices of its thread is searched against."""

    def __init__(self, ops: pd.DataFrame) -> None:
        self.ops = ops
        self.ts = ops["ts"].to_numpy(np.int64)
        self.end = self.ts + ops["dur"].to_numpy(np.int64)
        self.depth = ops["depth"].to_numpy(np.int64)
        self.sorted = pd.DataFrame({"rank": ops["rank"].to_numpy(np.int64), "tid": ops["tid"].to_numpy(np.int64),
                                    "depth": self.depth, "t": self.ts,
                                    "row": np.arange(len(ops), dtype=np.int64)}).sort_values("t", kind="stable")

    def innermost(self, events: pd.DataFrame, t: np.ndarray) -> np.ndarray:
        """Per event, the row of the innermost op open on its thread at ``t``, -1 where none."""
        return enqueuing_ops(pd.DataFrame({"rank": events["rank"].to_numpy(), "tid": events["tid"].to_numpy(),
                                           "ts": t}), self.ops)

    def child_depth(self, op: np.ndarray) -> np.ndarray:
        """The depth of the ops directly inside ``op`` (0, the top level, where op is -1)."""
        return np.where(op >= 0, self.depth[np.maximum(op, 0)] + 1, 0)

    def at_depth(self, events: pd.DataFrame, depth: np.ndarray, t: np.ndarray, after: bool) -> np.ndarray:
        """Per event, the row of the op at ``depth`` on its thread that starts last at or before
        ``t`` (``after``: first after it); -1 where there is none."""
        q = pd.DataFrame({"rank": events["rank"].to_numpy(np.int64), "tid": events["tid"].to_numpy(np.int64),
                          "depth": depth, "t": np.asarray(t, np.int64), "q": np.arange(len(t))})
        m = pd.merge_asof(q.sort_values("t", kind="stable"), self.sorted, on="t", by=["rank", "tid", "depth"],
                          direction="forward" if after else "backward", allow_exact_matches=not after)
        out = np.full(len(t), -1, np.int64)
        out[m["q"].to_numpy()] = m["row"].fillna(-1).to_numpy(np.int64)
        return out

    def clip(self, op: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[start, end]`` cut to ``op``'s span where there is an op (-1: unchanged)."""
        has, o = op >= 0, np.maximum(op, 0)
        return (np.where(has, np.maximum(start, self.ts[o]), start),
                np.where(has, np.minimum(end, self.end[o]), end))


def _recorded(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each event as recorded: what is drawn where no op slice is around to fit into."""
    start = events["ts"].to_numpy(np.int64)
    return start, start + events["dur"].to_numpy(np.int64)


def _fit_waits(flushes: pd.DataFrame, at: _OpsAt) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each host wait, fitted into the op slices of its thread: inside the
    innermost op open at its middle (the op that waited), and between that op's children (a
    wait runs no op), so it nests wherever clock rounding puts its ends."""
    start, end = _recorded(flushes)
    mid = start + (end - start) // 2
    op = at.innermost(flushes, mid)
    start, end = at.clip(op, start, end)
    depth = at.child_depth(op)
    before, after = at.at_depth(flushes, depth, mid, after=False), at.at_depth(flushes, depth, mid, after=True)
    start = np.where(before >= 0, np.maximum(start, np.minimum(at.end[np.maximum(before, 0)], mid)), start)
    end = np.where(after >= 0, np.minimum(end, at.ts[np.maximum(after, 0)]), end)
    return start, end


def _fit_fallbacks(fallbacks: pd.DataFrame, at: _OpsAt, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each CPU fallback, fitted into the op slices of its thread: inside the op
    it ran in (its ``host_op``, the innermost op of that name open at its middle: the innermost
    may be one of its own copies), widened over any child of that op it cuts into (its copies
    and the CPU kernel are ops inside it)."""
    start, end = _recorded(fallbacks)
    mid = start + (end - start) // 2
    innermost = at.innermost(fallbacks, mid)
    names = at.ops["name"].cat.codes.to_numpy()
    want = pd.Categorical(fallbacks["host_op"].astype(str), categories=at.ops["name"].cat.categories).codes
    op = innermost.copy()
    for _ in range(int(at.depth.max(initial=0)) + 1):
        climb = (op >= 0) & (names[np.maximum(op, 0)] != want)
        if not climb.any():
            break
        op[climb] = parent[op[climb]]
    op = np.where(op >= 0, op, innermost)  # no op of its name around it: the innermost
    start, end = at.clip(op, start, end)
    depth = at.child_depth(op)
    first, last = at.at_depth(fallbacks, depth, start, after=False), at.at_depth(fallbacks, depth, end - 1, after=False)
    f, g = np.maximum(first, 0), np.maximum(last, 0)
    start = np.where((first >= 0) & (at.end[f] > start), np.minimum(start, at.ts[f]), start)
    end = np.where((last >= 0) & (at.end[g] > end), at.end[g], end)
    return start, end


class DeviceTracks:
    """The device tables of a run, correlated and fitted once; written rank by rank, then the
    flows (which need every rank's host op slice ids)."""

    def __init__(self, run: Run, clock: TraceClock) -> None:
        self.clock = clock
        self.kernels = run.device_kernels
        self.copies = run.device_copies
        self.flushes = run.queue_flushes
        self.fallbacks = analyze(run).cpu_fallbacks.table
        self.depth = queue_depth(run.device_enqueues, self.kernels)
        self.kernel_ids = np.full(len(self.kernels), -1, np.int64)
        """Trace event id of each kernel's slice, once its rank is written."""
        self.copy_ids = np.full(len(self.copies), -1, np.int64)
        """Trace event id of each copy's slice, once its rank is written."""
        self.copy_ops = innermost_ops(self.copies["rank"].to_numpy(), self.copies["tid"].to_numpy(),
                                      self.copies["host_ts"].to_numpy(), run.ops) if len(self.copies) \
            else np.empty(0, np.int64)
        """Per copy, the ``Run.ops`` row of the host op that issued it (-1: none captured)."""
        self.events = _StreamEvents(run, self.flushes)
        self.done_ids = np.full(len(self.events.done), -1, np.int64)
        """Trace event id of each event completion's instant, once its rank is written."""
        self.op_ids = np.full(len(run.ops), -1, np.int64)
        """Trace event id of each ``Run.ops`` row's slice, as ``write_run`` wrote them."""
        self.pairs = np.empty((0, 2), np.int64)
        """Distinct (``Run.ops`` row, kernel row): one flow each."""
        self.ops_text = self.source = self.module = np.empty(0, dtype=object)
        self.collective_of = np.full(len(self.kernels), -1, np.int64)
        """Per kernel, its row in ``collectives`` (-1: not a collective's kernel)."""
        self.collectives: dict[str, np.ndarray] = {}
        """The collective kernels' columns (``_collectives``): their args and cross-rank flows."""
        if len(self.kernels) and len(run.collectives):
            self.collective_of, self.collectives = _collectives(self.kernels, analyze(run).device_collectives.waits)
        if len(self.kernels):
            corr = analyze(run).device_correlation
            rows = _kernel_rows(self.kernels, corr["rank"], corr["kernel"])
            self.ops_text, self.source, self.module = _kernel_ops(self.kernels, corr, rows)
            op_index = corr["op_index"].to_numpy(np.int64)
            known = (op_index >= 0) & (rows >= 0)
            pair = np.unique(op_index[known] * len(self.kernels) + rows[known])
            self.pairs = np.stack(np.divmod(pair, len(self.kernels)), axis=1)
        self.wait_span, self.fallback_span = _recorded(self.flushes), _recorded(self.fallbacks)
        if len(run.ops) and (len(self.flushes) or len(self.fallbacks)):
            at = _OpsAt(run.ops)
            if len(self.flushes):
                self.wait_span = _fit_waits(self.flushes, at)
            if len(self.fallbacks):
                self.fallback_span = _fit_fallbacks(self.fallbacks, at, analyze(run).op_parent)
        threads = run.threads
        self.thread_names = {(int(r), int(t)): str(n) for r, t, n in zip(threads["rank"], threads["tid"],
                                                                          threads["name"])}
        self._rows = {name: df.groupby("rank").indices if len(df) else {}
                      for name, df in (("kernels", self.kernels), ("copies", self.copies), ("flushes", self.flushes),
                                       ("fallbacks", self.fallbacks), ("depth", self.depth),
                                       ("waits", self.events.waits), ("done", self.events.done))}

    def write(self, writer: TraceWriter, proc: int, rank: int, op_rows: np.ndarray, op_ids: np.ndarray
              ) -> dict[str, int]:
        """``rank``'s device tracks, waits and fallbacks under ``proc``. ``op_rows``: the
        ``Run.ops`` rows of the rank's op slices, whose event ids are ``op_ids`` (the flows'
        sources). Returns what was written, by count name."""
        self.op_ids[op_rows] = op_ids
        return {**self._streams(writer, proc, rank),
                "queue_flushes": self._waits(writer, proc, rank),
                "fallbacks": self._fallbacks(writer, proc, rank),
                "queue_depth_samples": self._depth(writer, proc, rank)}

    def write_flows(self, writer: TraceWriter) -> int:
        """From each host op slice to each kernel that ran ops it queued, and to each copy it
        issued. Returns the number of flows."""
        issued = self.copy_ops >= 0
        src = np.concatenate([self.op_ids[self.pairs[:, 0]], self.op_ids[self.copy_ops[issued]]])
        dst = np.concatenate([self.kernel_ids[self.pairs[:, 1]], self.copy_ids[issued]])
        ok = (src >= 0) & (dst >= 0)
        return writer.flows(src[ok], dst[ok]) if ok.any() else 0

    def write_collective_flows(self, writer: TraceWriter) -> int:
        """From the kernel slice of the rank whose kernel of a collective started last to every
        other rank's kernel slice of it (once every rank is written: the flows cross ranks).
        Returns the number of flows."""
        c = self.collectives
        if not c or not len(c["row"]):
            return 0
        return last_rank_flows(writer, c["group"], c["seq"], c["rank"], c["last"], self.kernel_ids[c["row"]])

    def _thread_tracks(self, writer: TraceWriter, proc: int, rank: int, tids: np.ndarray) -> np.ndarray:
        """Per row, the track of its host thread: the one ``write_run`` made for the thread's op
        slices (same key, same name), or a new one for a thread that ran no captured op."""
        uniq, inverse = np.unique(tids, return_inverse=True)
        handles = np.array([writer.thread_track(proc, int(t), self.thread_names.get((rank, int(t)), f"thread {t}"))
                            for t in uniq], dtype=np.int64)
        return handles[inverse]

    def _rank(self, name: str, rank: int) -> np.ndarray:
        """The rows of table ``name`` (a key of ``_rows``) on ``rank``."""
        return self._rows[name].get(rank, np.empty(0, np.int64))

    def _streams(self, writer: TraceWriter, proc: int, rank: int) -> dict[str, int]:
        """Kernels and stream waits on their stream's tracks (one set of lanes: a stream runs
        them one after another), event completions on the recording stream's track, and a flow
        from each completion to the end of each wait it ended."""
        ki, ci, wi, di = (self._rank(name, rank) for name in ("kernels", "copies", "waits", "done"))
        k, c, w = self.kernels.iloc[ki], self.copies.iloc[ci], self.events.waits.iloc[wi]
        ts, dur = (np.concatenate([k[col].to_numpy(np.int64), c[col].to_numpy(np.int64), w[col].to_numpy(np.int64)])
                   for col in ("ts", "dur"))
        start, dur = self.clock.of(rank).span(ts, dur)
        tracks = self._lane_tracks(writer, proc, (k, c, w), start, start + dur)
        n, m = len(k), len(k) + len(c)
        if n:
            self.kernel_ids[ki] = self._kernels(writer, ki, tracks[:n], start[:n], dur[:n])
        if len(c):
            self.copy_ids[ci] = writer.slices(tracks[n:m], start[n:m], dur[n:m], c["name"],
                                              {"kind": c["kind"], "bytes": c["bytes"].to_numpy(np.int64),
                                               "step": c["step"].to_numpy(np.int64)})
        self._completions(writer, proc, rank, di)
        flows = self._stream_waits(writer, wi, tracks[m:], start[m:], dur[m:])
        return {"device_kernels": n, "device_copies": len(c), "stream_waits": len(wi), "event_completions": len(di),
                "event_flows": flows}

    def _kernels(self, writer: TraceWriter, ki: np.ndarray, tracks: np.ndarray, start: np.ndarray,
                 dur: np.ndarray) -> np.ndarray:
        """A slice per kernel ``ki`` (``device_kernels`` rows of one rank); a collective's with
        args naming its collective (written apart, as the host waits are: a numeric arg cannot be
        left off a row). Returns the slices' event ids, in ``ki``'s order."""
        k = self.kernels.iloc[ki]
        names = k["name"]
        args = {"ops": self.ops_text[ki], "n_ops": k["n_ops"].to_numpy(np.int64),
                "kernel_id": k["id"].to_numpy(np.int64), "step": k["step"].to_numpy(np.int64),
                "source": self.source[ki], "module": self.module[ki]}
        coll = self.collective_of[ki]
        named = coll >= 0
        ids = np.full(len(ki), -1, np.int64)
        for part, collective in ((~named, False), (named, True)):
            if not part.any():
                continue
            extra = {a: self.collectives[a][coll[part]] for a in COLLECTIVE_ARGS} if collective else {}
            ids[part] = writer.slices(tracks[part], start[part], dur[part], names[part],
                                      {**{a: v[part] for a, v in args.items()}, **extra})
        return ids

    def _lane_tracks(self, writer: TraceWriter, proc: int, parts: tuple[pd.DataFrame, ...],
                     start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The track of each row of ``parts`` (kernels, copies, stream waits; ``start``/``end`` in
        that order): its stream's, or a "... #2" lane where two overlap (clock jitter, or a copy
        engine beside the compute one)."""
        streams = pd.DataFrame({"device": _devices(*parts),
                                "stream": np.concatenate([p["stream"].to_numpy(np.int64) for p in parts])})
        tracks = np.empty(len(streams), np.int64)
        for (device, stream), sel in streams.groupby(["device", "stream"], observed=True).indices.items():
            lane = _stream_lanes(start[sel], end[sel])
            label = f"Device {device} (stream {stream})"
            handles = np.array([writer.track(proc, label + (f" #{j + 1}" if j else ""))
                                for j in range(int(lane.max()) + 1)], np.int64)
            tracks[sel] = handles[lane]
        return tracks

    def _completions(self, writer: TraceWriter, proc: int, rank: int, rows: np.ndarray) -> None:
        """An "event <n>" instant where the device reached each record, on the recording
        stream's (first) track, with the line that recorded it."""
        if not len(rows):
            return
        d = self.events.done.iloc[rows]
        labels, inverse = np.unique("Device " + string_args(d["device"]) + " (stream "
                                    + d["stream"].astype(str).to_numpy(object) + ")", return_inverse=True)
        tracks = np.array([writer.track(proc, str(label)) for label in labels], np.int64)[inverse]
        self.done_ids[rows] = writer.instants(tracks, self.clock.of(rank).at(d["ts"]),
                                              "event " + d["event"].astype(str).to_numpy(object),
                                              {"event": d["event"].to_numpy(np.int64),
                                               "source": self.events.done_source[rows]})

    def _stream_waits(self, writer: TraceWriter, rows: np.ndarray, tracks: np.ndarray, start: np.ndarray,
                      dur: np.ndarray) -> int:
        """A "wait for event <n>" slice per stream wait, and a "released by event <n>" instant at
        its end that the arrow from the completion which ended it lands on (after
        ``_completions``: the flows need its ids). Returns the number of flows."""
        if not len(rows):
            return 0
        w = self.events.waits.iloc[rows]
        event, release = w["event"].to_numpy(np.int64), self.events.release[rows]
        recorded_on = pick(self.events.done["stream"].to_numpy(np.int64), release, -1)
        text = w["event"].astype(str).to_numpy(object)
        writer.slices(tracks, start, dur, "wait for event " + text,
                      {"event": event, "recorded_on": recorded_on, "source": self.events.wait_source[rows],
                       "record_source": pick(self.events.done_source, release, "")})
        ends = writer.instants(tracks, start + dur, "released by event " + text,
                               {"event": event, "recorded_on": recorded_on})
        ok = release >= 0
        return writer.flows(self.done_ids[release[ok]], ends[ok]) if ok.any() else 0

    def _waits(self, writer: TraceWriter, proc: int, rank: int) -> int:
        """The host's waits; those on a stream or an event with args naming it (written apart:
        a numeric arg cannot be left off a row, and the other waits stay as they were)."""
        idx = self._rank("flushes", rank)
        stream, event = self.events.sync_stream[idx], self.events.sync_event[idx]
        named = (stream >= 0) | (event != 0)
        for part, args in ((~named, {}), (named, {"stream": stream[named], "event": event[named]})):
            if part.any():
                self._write_waits(writer, proc, rank, idx[part], args)
        return len(idx)

    def _write_waits(self, writer: TraceWriter, proc: int, rank: int, idx: np.ndarray, extra: dict) -> None:
        """The host waits ``idx`` (``queue_flushes`` rows), with ``extra`` args beside their own."""
        f = self.flushes.iloc[idx]
        start, end = (s[idx] for s in self.wait_span)
        names = "wait for " + string_args(f["device"]) + " (" + string_args(f["reason"]) + ")"
        writer.slices(self._thread_tracks(writer, proc, rank, f["tid"].to_numpy()),
                      *self.clock.of(rank).span(start, end - start), names,
                      {"reason": f["reason"], "ops": f["ops"].to_numpy(np.int64), "source": f["source_full"],
                       "host_op": f["host_op"], **extra})

    def _fallbacks(self, writer: TraceWriter, proc: int, rank: int) -> int:
        idx = self._rows["fallbacks"].get(rank)
        if idx is None:
            return 0
        f = self.fallbacks.iloc[idx]
        start, end = (s[idx] for s in self.fallback_span)
        writer.slices(self._thread_tracks(writer, proc, rank, f["tid"].to_numpy()),
                      *self.clock.of(rank).span(start, end - start), "CPU fallback " + string_args(f["op"]),
                      {"bytes_to_host": f["bytes_to_host"].to_numpy(np.int64),
                       "bytes_from_host": f["bytes_from_host"].to_numpy(np.int64),
                       "source": f["source_full"], "device": f["device"]})
        return len(f)

    def _depth(self, writer: TraceWriter, proc: int, rank: int) -> int:
        """The queue's depth per device; only changes are written (a counter holds its value)."""
        idx = self._rows["depth"].get(rank)
        if idx is None:
            return 0
        written = 0
        for device, g in self.depth.iloc[idx].groupby("device", sort=True):
            values = g["depth"].to_numpy(np.int64)
            changed = np.ones(len(values), bool)
            changed[1:] = values[1:] != values[:-1]
            writer.counters(writer.counter_track(proc, f"Queue depth {device}", "ops"),
                            self.clock.of(rank).at(g["ts"].to_numpy(np.int64)[changed]), values[changed])
            written += int(changed.sum())
        return written
