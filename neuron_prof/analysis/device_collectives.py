"""Collectives on the device: a backend that queues its collectives (the emulated ``neuron``
device's process-group backend, a collective library on a real device) runs each as a kernel on a
stream, named by the c10d op that issued it (``c10d::allreduce_``). On an asynchronous device the
host's view of a collective is only its issue; what it costs the step is on the device:

* **which collective each kernel ran** (``collective_kernels``): the collective row
  (``Run.collectives``: op, group, sequence number, bytes, issuing line) whose issue call put the
  kernel's op on the queue (same rank and thread, the enqueue inside the issue call), with device
  times: ``ts``/``dur``/``done`` are the kernel's. Shaped like ``Run.collectives``, so
  ``collective_match.matched`` lines the ranks up on device time and ``stragglers`` names the
  rank whose device was late, as it does on host time;
* **communication and compute on the device** (``comm_overlap``): per rank, device and step, the
  time collective kernels ran, how much of it other kernels of the device ran at the same time
  (overlapped) and the rest (exposed);
* **which collective kept a stream waiting** (``comm_waits``): a stream idle at a wait for an event
  the collective's issue recorded (its Work's ``wait()``, DDP's reducer, a comm hook), by the
  collective and the line that issued it.

Times are int64 ns. DataFrames in, DataFrames out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.intervals import covered_before, union
from neuron_prof.analysis.ops import in_steps, name_mask
from neuron_prof.analysis.steps import steps_per_rank
from neuron_prof.analysis.streams import host_call, match_last, pick

COLLECTIVE_KERNEL_PREFIXES = ("c10d::", "nccl", "rccl")
"""How a collective's kernel is named: by the c10d op that issued it (a backend that queues its
collectives, the emulated device), or by its library (NCCL's ``ncclDevKernel_AllReduce_...``,
RCCL's)."""
OVERLAP_COLUMNS = ["rank", "device", "step", "kernels", "comm_ns", "overlapped_ns", "exposed_ns"]
SUMMARY_COLUMNS = ["rank", "device", "steps", "kernels_per_step", "comm_ms", "overlapped_ms", "exposed_ms",
                   "overlapped_pct"]
WAIT_COLUMNS = ["rank", "device", "stream", "op", "group", "user_source", "waited_at", "count", "in_steps",
                "per_step_ms", "total_ms", "max_ms"]


NO_LINE = "(no Python line: autograd's device thread)"
"""The line of a collective issued, or a wait queued, where Python has no frame: DDP's gradient
hooks and reducer run on the autograd engine's thread of the device, under ``loss.backward()``."""


def _or_no_line(lines: np.ndarray) -> np.ndarray:
    return np.where(lines == "", NO_LINE, lines)


def is_collective_kernel(kernels: pd.DataFrame) -> np.ndarray:
    """Mask of the kernels (``Run.device_kernels`` rows) that ran a collective."""
    return name_mask(kernels, lambda name: name.startswith(COLLECTIVE_KERNEL_PREFIXES))


def _issue_of(rows: pd.DataFrame, t, collectives: pd.DataFrame) -> np.ndarray:
    """Per host-side row (rank, tid, at ``t``), the position in ``collectives`` of the issue call it
    happened in (same rank and thread, ``t`` within the call), else -1."""
    at = match_last(rows, t, collectives, ("rank", "tid"))
    end = pick((collectives["ts"] + collectives["dur"]).to_numpy(np.int64), at, -1)
    return np.where(np.asarray(t, np.int64) <= end, at, -1)


def collective_kernels(kernels: pd.DataFrame, enqueues: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per collective kernel (``Run.device_kernels`` named ``c10d::...``, ``nccl...``) whose issue was
    captured: that collective's ``Run.collectives`` row with ``ts``/``dur``/``done`` the kernel's
    (device time), ``issue_ts`` the host's issue, ``step`` the kernel's, and the kernel's
    ``device``, ``stream`` and ``kernel`` (id)."""
    k = kernels[is_collective_kernel(kernels)] if len(kernels) else kernels
    if k.empty or collectives.empty or enqueues.empty:
        return collectives.iloc[0:0].assign(issue_ts=np.int64(0), device="", stream=np.int64(0), kernel=np.int64(0))
    k = k.reset_index(drop=True)
    first = np.array([ids[0] if len(ids) else -1 for ids in k["enqueue_ids"]], np.int64)
    at = pd.MultiIndex.from_frame(enqueues[["rank", "id"]]).get_indexer(
        pd.MultiIndex.from_arrays([k["rank"].to_numpy(np.int64), first]))
    rows = pd.DataFrame({"rank": k["rank"].to_numpy(np.int64),
                         "tid": pick(enqueues["tid"].to_numpy(np.int64), at, -1)})
    issue = _issue_of(rows, pick(enqueues["ts"].to_numpy(np.int64), at, -1), collectives)
    keep = (at >= 0) & (issue >= 0)
    k, issue = k[keep], issue[keep]
    out = collectives.iloc[issue].reset_index(drop=True)
    out["issue_ts"] = out["ts"].to_numpy(np.int64)
    out["ts"] = k["ts"].to_numpy(np.int64)
    out["dur"] = k["dur"].to_numpy(np.int64)
    out["done"] = out["ts"] + out["dur"]
    out["step"] = k["step"].to_numpy()
    out["device"] = k["device"].astype(str).to_numpy()
    out["stream"] = k["stream"].to_numpy(np.int64)
    out["kernel"] = k["id"].to_numpy(np.int64)
    return out


def comm_overlap(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and step (of ``steps``, complete steps) with collective kernels: how many
    started in it, their time (``comm_ns``, the union of their spans within the step), the part of
    it in which other kernels of the device ran (``overlapped_ns``) and the rest (``exposed_ns``:
    communication nothing else on the device hid)."""
    if kernels.empty:
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    rows = []
    comm = is_collective_kernel(kernels)
    for (rank, device), k in kernels.assign(comm=comm).groupby(["rank", "device"], observed=True):
        c, other = k[k["comm"]], k[~k["comm"]]
        if c.empty:
            continue
        c_start = c["ts"].to_numpy(np.int64)
        cs, ce = union(c_start, c_start + c["dur"].to_numpy(np.int64))
        o_start = other["ts"].to_numpy(np.int64)
        os_, oe = union(o_start, o_start + other["dur"].to_numpy(np.int64))
        s = steps[steps["rank"] == rank]
        w0 = s["ts"].to_numpy(np.int64)
        w1 = w0 + s["dur"].to_numpy(np.int64)
        started = np.sort(c_start)
        counts = np.searchsorted(started, w1) - np.searchsorted(started, w0)
        for step, a, b, n in zip(s["step"].to_numpy(), w0, w1, counts):
            # the communication spans clipped to the step, and the other kernels' time inside them
            ss, se = np.clip(cs, a, b), np.clip(ce, a, b)
            live = se > ss
            if not live.any():
                continue
            comm_ns = int((se - ss)[live].sum())
            over = int((covered_before(os_, oe, se[live]) - covered_before(os_, oe, ss[live])).sum())
            rows.append((int(rank), str(device), int(step), int(n), comm_ns, over, comm_ns - over))
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


def comm_summary(overlap: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device, over the ``basis`` steps: collective kernels, communication,
    overlapped and exposed ms per step, and the overlapped share of communication."""
    n = steps_per_rank(basis)
    if overlap.empty or not n:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    o = overlap[in_steps(overlap, basis)]
    if o.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    g = o.groupby(["rank", "device"])
    out = pd.DataFrame({"steps": g.size(), "kernels_per_step": g["kernels"].sum() / n,
                        "comm_ms": g["comm_ns"].sum() / n / 1e6, "overlapped_ms": g["overlapped_ns"].sum() / n / 1e6,
                        "exposed_ms": g["exposed_ns"].sum() / n / 1e6}).reset_index()
    out["overlapped_pct"] = np.where(out["comm_ms"] > 0, 100 * out["overlapped_ms"] / out["comm_ms"].where(
        out["comm_ms"] > 0, 1), 0.0)
    return out[SUMMARY_COLUMNS]


def comm_waits(waits: pd.DataFrame, event_enqueues: pd.DataFrame, collectives: pd.DataFrame,
               coll_kernels: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Streams that stood idle waiting for a collective: per rank, device, waiting stream, the
    collective's op and group and the user's line that issued it (the event the stream waited
    for was recorded in that issue call, on the stream the collective ran on: its Work's
    ``wait()``, DDP's reducer, a comm hook), and the line of the wait (``waited_at``): waits,
    those in ``basis`` steps and their idle ms per step (None without one), total and longest.
    Longest idle in all first. A collective issued where Python has no line (DDP's gradient
    hooks on the autograd engine's device thread) reads ``NO_LINE``. ``coll_kernels``:
    ``collective_kernels``, for the streams collectives ran on (the collective stream waiting for
    its inputs is the stream's own business, not a wait for a collective)."""
    if waits.empty or event_enqueues.empty or collectives.empty or coll_kernels.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    w = waits.reset_index(drop=True)
    kind = event_enqueues["kind"].astype(str).to_numpy()
    queued, recorded = event_enqueues[kind == "wait"], event_enqueues[kind == "record"].reset_index(drop=True)
    origin = match_last(w, w["ts"] + w["dur"], recorded, ("rank", "device", "event"))
    rec_rows = pd.DataFrame({"rank": w["rank"].to_numpy(np.int64),
                             "tid": pick(recorded["tid"].to_numpy(np.int64), origin, -1)})
    issue = _issue_of(rec_rows, pick(recorded["ts"].to_numpy(np.int64), origin, -1), collectives)
    comm_streams = pd.MultiIndex.from_frame(coll_kernels[["rank", "device", "stream"]].astype(
        {"device": str}).drop_duplicates())
    on_comm = comm_streams.get_indexer(pd.MultiIndex.from_arrays(
        [w["rank"].to_numpy(np.int64), w["device"].astype(str).to_numpy(),
         pick(recorded["stream"].to_numpy(np.int64), origin, -1)])) >= 0
    keep = (issue >= 0) & on_comm
    w, issue = w[keep].reset_index(drop=True), issue[keep]
    if w.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    call = host_call(w, w["ts"], queued)
    c = collectives.iloc[issue]
    n = steps_per_rank(basis)
    hit = in_steps(w, basis) if n else np.zeros(len(w), dtype=bool)
    w = w.assign(device=w["device"].astype(str), op=c["op"].astype(str).to_numpy(), group=c["group"].astype(str).to_numpy(),
                 user_source=_or_no_line(c["user_source"].astype(str).to_numpy(object)),
                 waited_at=_or_no_line(pick(queued["user_source"].astype(str).to_numpy(object), call, "")),
                 hit=hit, hit_dur=np.where(hit, w["dur"], 0))
    g = w.groupby(["rank", "device", "stream", "op", "group", "user_source", "waited_at"])
    out = pd.DataFrame({"count": g.size(), "in_steps": g["hit"].sum(), "total_ms": g["dur"].sum() / 1e6,
                        "hit_ms": g["hit_dur"].sum() / 1e6, "max_ms": g["dur"].max() / 1e6}).reset_index()
    out["per_step_ms"] = pd.Series([h / n if n and k else None for h, k in zip(out["hit_ms"], out["in_steps"])],
                                   dtype=object)
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[WAIT_COLUMNS]
