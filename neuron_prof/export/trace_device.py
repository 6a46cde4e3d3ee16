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
- a flow from each host op slice that queued work to each kernel that ran some of it, one per
  (op slice, kernel) pair, as a CUDA launch is joined to its kernel;
- on the host thread's own track, a "wait for <device> (<reason>)" slice per queue flush (args
  ``reason``, ``ops`` waited for, ``source``, ``host_op``) and a "CPU fallback <op>" slice per op
  the device left to the CPU (``bytes_to_host``, ``bytes_from_host``, ``source``, ``device``),
  each fitted into the op slices around it (``_fit_waits``, ``_fit_fallbacks``): the writer
  would otherwise repair a slice that sticks out of its op by a few ns of clock rounding by
  cutting the op's own slices short;
- a "Queue depth <device>" counter: ops queued and not yet run (``analysis.device.queue_depth``).

Which host op queued what, and which kernel ran it, comes from ``analysis.device``; this module
only lays it out. A run without device tables gets nothing from it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.device import enqueuing_ops, queue_depth
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.export.clock import TraceClock
from neuron_prof.export.event_columns import lanes, string_args
from neuron_prof.export.tracewriter import TraceWriter
from neuron_prof.keys import backend_key
from neuron_prof.run import Run

OPS_SEPARATOR = ", "
"""Between the op names of a kernel's ``ops`` arg."""


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


def _stream_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lanes for one stream's kernels: one, unless some overlap (clock jitter). ``lanes`` is a
    Python loop per slice, so it runs only for a stream that needs it."""
    order = np.argsort(start, kind="stable")
    reach = np.maximum.accumulate(end[order])
    if not (start[order][1:] < reach[:-1]).any():
        return np.zeros(len(start), np.int64)
    return lanes(start, end)


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
        self.flushes = run.queue_flushes
        self.fallbacks = run.fallbacks
        self.depth = queue_depth(run.device_enqueues, self.kernels)
        self.kernel_ids = np.full(len(self.kernels), -1, np.int64)
        """Trace event id of each kernel's slice, once its rank is written."""
        self.op_ids = np.full(len(run.ops), -1, np.int64)
        """Trace event id of each ``Run.ops`` row's slice, as ``write_run`` wrote them."""
        self.pairs = np.empty((0, 2), np.int64)
        """Distinct (``Run.ops`` row, kernel row): one flow each."""
        self.ops_text = self.source = self.module = np.empty(0, dtype=object)
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
                      for name, df in (("kernels", self.kernels), ("flushes", self.flushes),
                                       ("fallbacks", self.fallbacks), ("depth", self.depth))}

    def write(self, writer: TraceWriter, proc: int, rank: int, op_rows: np.ndarray, op_ids: np.ndarray
              ) -> dict[str, int]:
        """``rank``'s device tracks, waits and fallbacks under ``proc``. ``op_rows``: the
        ``Run.ops`` rows of the rank's op slices, whose event ids are ``op_ids`` (the flows'
        sources). Returns what was written, by count name."""
        self.op_ids[op_rows] = op_ids
        return {"device_kernels": self._kernels(writer, proc, rank),
                "queue_flushes": self._waits(writer, proc, rank),
                "fallbacks": self._fallbacks(writer, proc, rank),
                "queue_depth_samples": self._depth(writer, proc, rank)}

    def write_flows(self, writer: TraceWriter) -> int:
        """From each host op slice to each kernel that ran ops it queued. Returns the number of flows."""
        src, dst = self.op_ids[self.pairs[:, 0]], self.kernel_ids[self.pairs[:, 1]]
        ok = (src >= 0) & (dst >= 0)
        return writer.flows(src[ok], dst[ok]) if ok.any() else 0

    def _thread_tracks(self, writer: TraceWriter, proc: int, rank: int, tids: np.ndarray) -> np.ndarray:
        """Per row, the track of its host thread: the one ``write_run`` made for the thread's op
        slices (same key, same name), or a new one for a thread that ran no captured op."""
        uniq, inverse = np.unique(tids, return_inverse=True)
        handles = np.array([writer.thread_track(proc, int(t), self.thread_names.get((rank, int(t)), f"thread {t}"))
                            for t in uniq], dtype=np.int64)
        return handles[inverse]

    def _kernels(self, writer: TraceWriter, proc: int, rank: int) -> int:
        idx = self._rows["kernels"].get(rank)
        if idx is None:
            return 0
        k = self.kernels.iloc[idx]
        start, dur = self.clock.of(rank).span(k["ts"], k["dur"])
        tracks = np.empty(len(k), np.int64)
        for (device, stream), sel in k.groupby(["device", "stream"], observed=True).indices.items():
            lane = _stream_lanes(start[sel], start[sel] + dur[sel])
            label = f"Device {device} (stream {stream})"
            handles = np.array([writer.track(proc, label + (f" #{j + 1}" if j else ""))
                                for j in range(int(lane.max()) + 1)], np.int64)
            tracks[sel] = handles[lane]
        self.kernel_ids[idx] = writer.slices(tracks, start, dur, k["name"], {
            "ops": self.ops_text[idx], "n_ops": k["n_ops"].to_numpy(np.int64),
            "kernel_id": k["id"].to_numpy(np.int64), "step": k["step"].to_numpy(np.int64),
            "source": self.source[idx], "module": self.module[idx]})
        return len(k)

    def _waits(self, writer: TraceWriter, proc: int, rank: int) -> int:
        idx = self._rows["flushes"].get(rank)
        if idx is None:
            return 0
        f = self.flushes.iloc[idx]
        start, end = (s[idx] for s in self.wait_span)
        names = "wait for " + string_args(f["device"]) + " (" + string_args(f["reason"]) + ")"
        writer.slices(self._thread_tracks(writer, proc, rank, f["tid"].to_numpy()),
                      *self.clock.of(rank).span(start, end - start), names,
                      {"reason": f["reason"], "ops": f["ops"].to_numpy(np.int64), "source": f["source_full"],
                       "host_op": f["host_op"]})
        return len(f)

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
