"""Streams of a device: per step, how long each stream ran kernels and stood idle at a wait for
another stream's event, how much of the device's busy time streams ran at once (a copy hidden
under compute), and where the waits come from: the host line of the ``wait_event`` /
``wait_stream`` that queued each, the stream whose event it waited for.

From the backend's hook API version 2 reports (``Run.stream_waits``, ``Run.event_enqueues``) and
its kernels' stream ids; a backend of version 1 reports every kernel on one stream and no waits,
and these read as one stream that never waited."""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.intervals import covered
from neuron_prof.analysis.ops import in_steps
from neuron_prof.analysis.steps import captured_steps, steps_per_rank

STREAM_STEP_COLUMNS = ["rank", "device", "step", "stream", "kernels", "busy_ns", "waiting_ns"]
OVERLAP_COLUMNS = ["rank", "device", "step", "busy_ns", "streams_busy_ns", "overlap_ns"]
STREAM_COLUMNS = ["rank", "device", "stream", "steps", "kernels_per_step", "busy_ms", "waiting_ms", "busy_pct"]
SEVERAL_STREAM_COLUMNS = ["rank", "device", "step", "stream", "kernels", "busy_ms", "waiting_ms", "overlap_ms"]
OVERLAP_SUMMARY_COLUMNS = ["rank", "device", "busy_ms", "overlap_ms", "overlap_pct"]
WAIT_SITE_COLUMNS = ["rank", "device", "stream", "waited_for", "user_source", "source", "count", "in_steps",
                     "per_step_ms", "total_ms", "mean_ms", "max_ms"]


def _windows(steps: pd.DataFrame, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = steps[steps["rank"] == rank]
    w0 = s["ts"].to_numpy(np.int64)
    return s["step"].to_numpy(), w0, w0 + s["dur"].to_numpy(np.int64)


def stream_steps(kernels: pd.DataFrame, waits: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device, complete captured step and stream that ran a kernel or waited in it: the
    kernels it started, ``busy_ns`` (time within the step some kernel of it ran) and
    ``waiting_ns`` (time within the step it stood idle at a wait for an event of another stream)."""
    done = captured_steps(steps, complete_only=True)
    if kernels.empty or done.empty:
        return pd.DataFrame(columns=STREAM_STEP_COLUMNS)
    rows = []
    kk = kernels.assign(device=kernels["device"].astype(str))
    ww = waits.assign(device=waits["device"].astype(str)) if len(waits) else waits
    streams = pd.concat([kk[["rank", "device", "stream"]], ww[["rank", "device", "stream"]] if len(ww) else None])
    for (rank, device, stream), _ in streams.groupby(["rank", "device", "stream"]):
        step, w0, w1 = _windows(done, rank)
        if not len(step):
            continue
        k = kk[(kk["rank"] == rank) & (kk["device"] == device) & (kk["stream"] == stream)]
        kts = np.sort(k["ts"].to_numpy(np.int64))
        busy = covered(k["ts"].to_numpy(np.int64), (k["ts"] + k["dur"]).to_numpy(np.int64), w0, w1)
        w = ww[(ww["rank"] == rank) & (ww["device"] == device) & (ww["stream"] == stream)] if len(ww) else ww
        waiting = (covered(w["ts"].to_numpy(np.int64), (w["ts"] + w["dur"]).to_numpy(np.int64), w0, w1) if len(w)
                   else np.zeros(len(step), np.int64))
        started = np.searchsorted(kts, w1, side="left") - np.searchsorted(kts, w0, side="left")
        rows.append(pd.DataFrame({"rank": rank, "device": device, "step": step, "stream": int(stream),
                                  "kernels": started, "busy_ns": busy, "waiting_ns": waiting}))
    if not rows:
        return pd.DataFrame(columns=STREAM_STEP_COLUMNS)
    return pd.concat(rows, ignore_index=True)[STREAM_STEP_COLUMNS].sort_values(
        ["rank", "device", "step", "stream"], ignore_index=True)


def stream_overlap(kernels: pd.DataFrame, per_stream: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and complete captured step: ``busy_ns`` (time some kernel of the device
    ran), ``streams_busy_ns`` (its streams' busy time added up, ``stream_steps``) and
    ``overlap_ns``, their difference: the time streams ran kernels at once (two streams: the time
    both ran; each stream beyond the second counts again)."""
    done = captured_steps(steps, complete_only=True)
    if per_stream.empty:
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    rows = []
    kk = kernels.assign(device=kernels["device"].astype(str))
    for (rank, device), k in kk.groupby(["rank", "device"]):
        step, w0, w1 = _windows(done, rank)
        if not len(step):
            continue
        busy = covered(k["ts"].to_numpy(np.int64), (k["ts"] + k["dur"]).to_numpy(np.int64), w0, w1)
        mine = per_stream[(per_stream["rank"] == rank) & (per_stream["device"] == device)]
        total = mine.groupby("step")["busy_ns"].sum().reindex(step, fill_value=0).to_numpy(np.int64)
        rows.append(pd.DataFrame({"rank": rank, "device": device, "step": step, "busy_ns": busy,
                                  "streams_busy_ns": total, "overlap_ns": np.maximum(total - busy, 0)}))
    return pd.concat(rows, ignore_index=True)[OVERLAP_COLUMNS] if rows else pd.DataFrame(columns=OVERLAP_COLUMNS)


def stream_summary(per_stream: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and stream that ran or waited in the ``basis`` steps (the steady steps),
    mean per step: kernels started, busy and waiting ms, and busy as a share of the step."""
    rows = per_stream[in_steps(per_stream, basis)] if len(per_stream) and len(basis) else per_stream.iloc[0:0]
    if rows.empty:
        return pd.DataFrame(columns=STREAM_COLUMNS)
    dur = basis.set_index(["rank", "step"])["dur"]
    rows = rows.assign(step_ns=dur.reindex(pd.MultiIndex.from_arrays([rows["rank"], rows["step"]])).to_numpy())
    n = steps_per_rank(basis)
    g = rows.groupby(["rank", "device", "stream"])
    out = pd.DataFrame({"steps": g.size(), "kernels_per_step": g["kernels"].sum() / n,
                        "busy_ms": g["busy_ns"].sum() / n / 1e6, "waiting_ms": g["waiting_ns"].sum() / n / 1e6,
                        "busy_pct": 100 * g["busy_ns"].sum() / g["step_ns"].sum()}).reset_index()
    return out[(out["busy_ms"] > 0) | (out["waiting_ms"] > 0)].reset_index(drop=True)[STREAM_COLUMNS]


def _busy_streams(per_stream: pd.DataFrame) -> pd.Series:
    """Per (rank, device): how many streams ran kernels in ``per_stream``'s rows (``stream_steps``)."""
    return per_stream[per_stream["busy_ns"].to_numpy() > 0].groupby(["rank", "device"])["stream"].nunique()


def several_stream_steps(per_stream: pd.DataFrame, overlap: pd.DataFrame) -> pd.DataFrame:
    """``stream_steps`` (``per_stream``) of the devices that ran more than one stream or waited for
    one, with ms for ns and each step's ``overlap_ms`` (``stream_overlap``: 0 where not known)."""
    if per_stream.empty:
        return pd.DataFrame(columns=SEVERAL_STREAM_COLUMNS)
    several = _busy_streams(per_stream)
    waited = per_stream.groupby(["rank", "device"])["waiting_ns"].sum()
    keep = [(r, d) for (r, d) in several.index.union(waited.index)
            if several.get((r, d), 0) > 1 or waited.get((r, d), 0) > 0]
    rows = per_stream.set_index(["rank", "device"]).loc[keep].reset_index() if keep else per_stream.iloc[0:0]
    rows = rows.merge(overlap[["rank", "device", "step", "overlap_ns"]], on=["rank", "device", "step"], how="left")
    return rows.assign(busy_ms=rows["busy_ns"] / 1e6, waiting_ms=rows["waiting_ns"] / 1e6,
                       overlap_ms=rows["overlap_ns"].fillna(0) / 1e6)[SEVERAL_STREAM_COLUMNS]


def overlap_summary(per_stream: pd.DataFrame, overlap: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device that ran kernels on more than one stream in the ``basis`` steps: busy and
    overlap ms per basis step (``stream_overlap``) and overlap as a share of busy."""
    rows = overlap[in_steps(overlap, basis)] if len(overlap) and len(basis) else overlap.iloc[0:0]
    several = _busy_streams(per_stream[in_steps(per_stream, basis)] if len(per_stream) and len(basis)
                            else per_stream.iloc[0:0])
    out = []
    for (rank, device), g in rows.groupby(["rank", "device"]):
        if several.get((rank, device), 0) < 2:
            continue  # one stream: nothing ran at once
        busy, shared = g["busy_ns"].mean() / 1e6, g["overlap_ns"].mean() / 1e6
        out.append((int(rank), str(device), float(busy), float(shared), float(100 * shared / busy) if busy else 0.0))
    return pd.DataFrame(out, columns=OVERLAP_SUMMARY_COLUMNS)


def match_last(rows: pd.DataFrame, t, table: pd.DataFrame, by: tuple[str, ...], forward: bool = False) -> np.ndarray:
    """Per row of ``rows``, the position in ``table`` of the row with the same ``by`` columns whose
    ``ts`` is the last at or before ``t`` (``forward``: the first at or after it); -1 where none."""
    def keyed(df: pd.DataFrame, ts, row: str) -> pd.DataFrame:
        cols = {k: df[k].astype(str).to_numpy(object) if isinstance(df[k].dtype, pd.CategoricalDtype)
                else df[k].to_numpy(np.int64) for k in by}
        return pd.DataFrame({**cols, "t": np.asarray(ts, np.int64),
                             row: np.arange(len(df), dtype=np.int64)}).sort_values("t", kind="stable")

    out = np.full(len(rows), -1, np.int64)
    if len(rows) and len(table):
        m = pd.merge_asof(keyed(rows, t, "q"), keyed(table, table["ts"], "row"), on="t", by=list(by),
                          direction="forward" if forward else "backward")
        out[m["q"].to_numpy()] = m["row"].fillna(-1).to_numpy(np.int64)
    return out


def pick(values: np.ndarray, rows: np.ndarray, missing) -> np.ndarray:
    """``values[rows]``, ``missing`` where a row is -1 (``match_last``/``host_call`` found none)."""
    if not len(values):
        return np.full(len(rows), missing, dtype=values.dtype)
    return np.where(rows >= 0, values[np.maximum(rows, 0)], missing)


def host_call(rows: pd.DataFrame, t, calls: pd.DataFrame) -> np.ndarray:
    """Per device-side row (an event completion, a stream wait; at ``t``), the position in
    ``calls`` (``Run.event_enqueues`` rows of one kind) of the host call it ran: same rank, device,
    stream and event, the latest at or before ``t``, else the first after it. The host reports a
    call once it is queued, so an idle stream may reach it a few microseconds before the report.
    An event recorded again before the device reached its first record reads as the later call."""
    on_stream = ("rank", "device", "stream", "event")
    before = match_last(rows, t, calls, on_stream)
    return np.where(before >= 0, before, match_last(rows, t, calls, on_stream, forward=True))


def wait_sites(waits: pd.DataFrame, enqueues: pd.DataFrame, basis: pd.DataFrame) -> pd.DataFrame:
    """Where streams stood idle waiting for another stream, by the wait's host line: per rank,
    device, waiting stream, the stream the event was recorded on (``waited_for``; -1: not seen) and
    the user's line (and innermost line) of the ``wait_event``/``wait_stream`` that queued the
    wait (``host_call``):
    waits, those in ``basis`` steps and their idle ms per step (None without one), total, mean and
    longest. Longest idle in all first."""
    if waits.empty:
        return pd.DataFrame(columns=WAIT_SITE_COLUMNS)
    w = waits.reset_index(drop=True)
    kind = enqueues["kind"].astype(str).to_numpy()
    queued, recorded = enqueues[kind == "wait"], enqueues[kind == "record"]
    call = host_call(w, w["ts"], queued)
    origin = match_last(w, w["ts"] + w["dur"], recorded, ("rank", "device", "event"))  # the record it waited on

    n = steps_per_rank(basis)
    hit = in_steps(w, basis) if n else np.zeros(len(w), dtype=bool)
    w = w.assign(device=w["device"].astype(str), waited_for=pick(recorded["stream"].to_numpy(np.int64), origin, -1),
                 user_source=pick(queued["user_source"].astype(str).to_numpy(object), call, ""),
                 source=pick(queued["source"].astype(str).to_numpy(object), call, ""),
                 hit=hit, hit_dur=np.where(hit, w["dur"], 0))
    g = w.groupby(["rank", "device", "stream", "waited_for", "user_source", "source"])
    out = pd.DataFrame({"count": g.size(), "in_steps": g["hit"].sum(), "total_ms": g["dur"].sum() / 1e6,
                        "hit_ms": g["hit_dur"].sum() / 1e6, "mean_ms": g["dur"].mean() / 1e6,
                        "max_ms": g["dur"].max() / 1e6}).reset_index()
    out["per_step_ms"] = pd.Series([h / n if n and k else None for h, k in zip(out["hit_ms"], out["in_steps"])],
                                   dtype=object)
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[WAIT_SITE_COLUMNS]
