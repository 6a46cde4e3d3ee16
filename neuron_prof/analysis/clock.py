"""Every rank's times on rank 0's clock.

Each rank records on its own monotonic clock, and ranks on different hosts have different
clocks, which drift apart. The session measures each rank's offset to rank 0 when capture starts
and when it ends (``Run.clock_sync``); ``clock_offsets`` turns those measurements into offsets
and ``to_rank0`` moves a rank's times with them. Every merged view of several ranks uses them:
matched collectives, the trace export, the viewer's timelines.

Times are int64 ns; -1 means unknown.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def clock_offsets(clock_sync: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """Per rank of ``ranks``, the offset to rank 0's clock (rank 0's time = ts + offset):
    ``offset_start``/``ts_start`` and ``offset_end``/``ts_end`` (the first start and the last end
    measurement), ``rtt`` (the worse round trip: the estimate's error is within rtt/2),
    ``same_clock`` (one clock: every offset that applies is 0) and ``measured`` (False: no
    measurement, offset 0 assumed). A rank with one measurement gets a constant offset."""
    cols = ["rank", "offset_start", "offset_end", "ts_start", "ts_end", "rtt", "same_clock", "measured"]
    rows = []
    cs = clock_sync if len(clock_sync) else None
    for rank in ranks:
        mine = cs[cs["rank"] == rank] if cs is not None else None
        if rank == 0 or mine is None or mine.empty:
            rows.append({"rank": rank, "offset_start": 0, "offset_end": 0, "ts_start": 0, "ts_end": 0, "rtt": 0,
                         "same_clock": rank == 0, "measured": rank == 0})
            continue
        mine = mine.sort_values("ts")
        phase = mine["phase"].astype(str)
        start = mine[phase == "start"]
        end = mine[phase == "end"]
        first = (start if len(start) else mine).iloc[0]
        last = (end if len(end) else mine).iloc[-1]
        same = bool(mine["same_clock"].any())
        rows.append({"rank": rank, "offset_start": 0 if same else int(first["offset"]),
                     "offset_end": 0 if same else int(last["offset"]), "ts_start": int(first["ts"]),
                     "ts_end": int(last["ts"]), "rtt": int(mine["rtt"].max()), "same_clock": same, "measured": True})
    return pd.DataFrame(rows, columns=cols)


def to_rank0(ts: np.ndarray, ranks: np.ndarray, offsets: pd.DataFrame) -> np.ndarray:
    """``ts`` (each on its rank's clock) on rank 0's clock: the rank's offset, linear in time
    between its start and end measurements (clock drift), extrapolated on the same line outside
    them. Unknown times (< 0) stay -1; ranks without a row are left as they are."""
    ts = np.asarray(ts, dtype=np.int64)
    ranks = np.asarray(ranks)
    out = ts.copy()
    for r in offsets.itertuples(index=False):
        if r.offset_start == 0 and r.offset_end == 0:
            continue
        sel = ranks == r.rank
        t = ts[sel]
        span = r.ts_end - r.ts_start
        if span > 0 and r.offset_end != r.offset_start:
            off = r.offset_start + (t - r.ts_start) * ((r.offset_end - r.offset_start) / span)
            out[sel] = t + np.rint(off).astype(np.int64)
        else:
            out[sel] = t + int(r.offset_start)
    out[ts < 0] = -1
    return out
