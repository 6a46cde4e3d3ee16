"""The one clock of a merged trace: every rank's events on rank 0's clock.

Each rank records on its own CLOCK_MONOTONIC. Ranks on one host share it; across hosts they do not,
and they drift. ``analysis.clock.to_rank0`` moves a rank's times onto rank 0's clock with the
offsets measured at capture start and end, which is what lines up a collective's slices on two
ranks (and the wait between them). The trace then shows rank 0's wall-clock time (its monotonic
clock plus the wall-clock offset it recorded), so every rank reads as the time of day on rank 0.
A rank whose offset was never measured (no TCPStore, one rank) is taken to share rank 0's clock,
as the analyses take it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from neuron_prof.analysis.clock import to_rank0
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.store.run import Run


class TraceClock:
    """A run's rank clocks mapped onto the trace's time (int64 ns)."""

    def __init__(self, offsets: pd.DataFrame, wall: int) -> None:
        self.offsets = offsets
        """``analysis.clock.clock_offsets``: each rank's offset to rank 0's clock."""
        moved = offsets[(offsets["offset_start"] != 0) | (offsets["offset_end"] != 0)]
        self._own = {int(r): moved[moved["rank"] == r] for r in moved["rank"]}
        """rank -> its own row, for the ranks whose clock is not rank 0's (most share it: none to apply)."""
        self.wall = int(wall)
        """Rank 0's wall-clock offset: added to rank-0 times to give the trace's time of day."""

    @classmethod
    def of_run(cls, run: Run) -> "TraceClock":
        metas = {rd.rank: rd.meta for rd in run.rank_data}
        first = metas[0] if 0 in metas else (metas[min(metas)] if metas else {})
        return cls(analyze(run).collective_offsets, int(first.get("clock_offset_ns", 0)))

    def aligned(self, aligned_ts: np.ndarray) -> np.ndarray:
        """Times already on rank 0's clock (an analysis's aligned columns) on the trace's clock."""
        return np.asarray(aligned_ts, np.int64) + self.wall

    def at(self, rank: int, ts) -> np.ndarray:
        """``rank``'s own times on the trace's clock."""
        ts = np.asarray(ts, np.int64)
        own = self._own.get(rank)
        return self.aligned(ts if own is None else to_rank0(ts, np.full(len(ts), rank, np.int64), own))

    def span(self, rank: int, ts, dur) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s slices (start, duration) on the trace's clock: both ends are moved, so a
        slice keeps its place against other ranks' slices even while the clocks drift apart."""
        ts = np.asarray(ts, np.int64)
        start = self.at(rank, ts)
        return start, self.at(rank, ts + np.asarray(dur, np.int64)) - start

    def of(self, rank: int) -> "RankClock":
        return RankClock(self, rank)


@dataclass(frozen=True)
class RankClock:
    """One rank's view of a ``TraceClock``: what the per-rank writers take."""
    clock: TraceClock
    rank: int

    def at(self, ts) -> np.ndarray:
        return self.clock.at(self.rank, ts)

    def span(self, ts, dur) -> tuple[np.ndarray, np.ndarray]:
        return self.clock.span(self.rank, ts, dur)
