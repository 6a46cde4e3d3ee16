"""Collectives in a merged trace: what a person needs to see a straggler or a hang across ranks.

Per rank and process group a "Collectives ..." track (more lanes, "#2", ..., where async
collectives overlap: slices on one track must nest). Each collective is a slice named by its op
from the rank's arrival (the issue call) to its completion, with its group, seq, bytes, dtype,
status, source line and module as args; inside it, a "wait for rank N" slice while this rank
waited for the last rank to arrive, then "transfer" until completion. The last rank's slice is
joined by a flow to every other rank's slice of the same (group, seq), so a click on the
straggler's collective leads to the ranks it held up. A collective that never completed (a hang,
a timeout) ends at the rank's last recorded event and says so in its name ("(in flight)",
"(failed)"), with the ranks that never arrived.

Every number comes from the analyses (alignment: ``analysis.clock``; matching, waits:
``analysis.collective_match``); this module only lays them out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.export.clock import TraceClock
from neuron_prof.export.event_columns import lanes
from neuron_prof.export.writer import TraceWriter
from neuron_prof.store.run import Run

UNFINISHED = {"in_flight": "in flight", "failed": "failed"}
"""Statuses of collectives that never completed -> the word their slice's name carries."""


def _ranks_text(ranks) -> str:
    return ", ".join(str(int(r)) for r in ranks) if isinstance(ranks, (list, tuple, np.ndarray)) else ""


class CollectiveTracks:
    """The collectives of a run, aligned and matched once; written rank by rank, then the flows."""

    def __init__(self, run: Run, clock: TraceClock) -> None:
        self.clock = clock
        w = analyze(run).collective_waits
        self.ids = np.full(len(w), -1, np.int64)
        self.cols: dict[str, np.ndarray] = {}
        self._by_rank: dict[int, np.ndarray] = {}
        if w.empty:
            return
        # each row with the members of its group that never issued it
        keys = analyze(run).collectives_matched[["group", "seq", "missing"]]
        w = w.assign(group=w["group"].astype(str)).merge(keys, on=["group", "seq"], how="left", sort=False)
        # columns as arrays, converted once: a rank's rows are then plain takes (256 ranks of
        # 2,000 collectives would otherwise spend most of the export in per-rank pandas calls)
        ints = {"rank": "rank", "start": "start", "end": "end", "ts": "ts", "dur": "dur", "wait": "wait_ns",
                "late": "late_rank", "seq": "seq", "bytes": "bytes", "count": "count",
                "step": "step"}
        strs = {"op": "op", "group": "group", "desc": "group_desc", "dtype": "dtype", "status": "status",
                "call": "call", "source": "source_full", "module": "module"}
        self.cols = {k: w[c].fillna(-1).to_numpy(np.int64) for k, c in ints.items()}
        self.cols.update({k: w[c].astype(str).to_numpy(dtype=object) for k, c in strs.items()})
        self.cols["missing"] = w["missing"].map(_ranks_text).to_numpy(dtype=object)
        self._by_rank = pd.Series(np.arange(len(w))).groupby(self.cols["rank"]).indices

    def write(self, writer: TraceWriter, proc: int, rank: int, last_event: int) -> int:
        """``rank``'s collective tracks under ``proc``; ``last_event`` (the rank's own clock) is where
        a collective that never completed stops being drawn. Returns the number of collectives."""
        idx = self._by_rank.get(rank)
        if idx is None:
            return 0
        r = {k: v[idx] for k, v in self.cols.items()}
        clock = self.clock.of(rank)
        start = self.clock.aligned(r["start"])
        unfinished = r["end"] < 0  # in flight, or failed without a time
        issue_end = clock.at(r["ts"] + r["dur"])
        end = np.where(unfinished, np.maximum(clock.at([last_event])[0], issue_end), self.clock.aligned(r["end"]))
        end = np.maximum(end, start)
        wait = np.minimum(r["wait"].clip(0), end - start)
        missing = r["missing"]

        word = np.array([UNFINISHED.get(s, "") for s in r["status"]], dtype=object)
        names = np.where(word != "", r["op"] + " (" + word + ")", r["op"])
        groups = r["group"]
        tracks = np.empty(len(idx), np.int64)
        for g in pd.unique(groups):
            sel = groups == g
            lane = lanes(start[sel], end[sel])
            desc = r["desc"][np.flatnonzero(sel)[0]]
            label = f"Collectives {desc} (group {g})" if desc else f"Collectives group {g}"
            handles = np.array([writer.track(proc, label + (f" #{k + 1}" if k else ""))
                                for k in range(int(lane.max()) + 1)], np.int64)
            tracks[sel] = handles[lane]
        self.ids[idx] = writer.slices(tracks, start, end - start, names, {
            "group": groups, "seq": r["seq"], "bytes": r["bytes"], "dtype": r["dtype"], "count": r["count"],
            "status": r["status"], "call": r["call"], "source": r["source"], "module": r["module"],
            "step": r["step"], "wait_ns": wait, "last_rank": r["late"], "never_arrived": missing})

        # inside: the wait for the last rank, then the transfer; a collective some rank never
        # joined is all waiting for those ranks
        stuck = unfinished & (missing != "")
        waited = (wait > 0) & ~stuck
        moved = ~unfinished & (start + wait < end)
        child_names = np.concatenate([
            np.array([f"wait for rank {x}" for x in r["late"][waited]], dtype=object),
            np.full(int(moved.sum()), "transfer", dtype=object),
            np.array([f"waiting for rank{'s' if ',' in x else ''} {x}" for x in missing[stuck]], dtype=object)])
        writer.slices(np.concatenate([tracks[waited], tracks[moved], tracks[stuck]]),
                      np.concatenate([start[waited], (start + wait)[moved], start[stuck]]),
                      np.concatenate([wait[waited], (end - start - wait)[moved], (end - start)[stuck]]),
                      child_names)
        return len(idx)

    def write_flows(self, writer: TraceWriter) -> int:
        """From the last-arriving rank's slice of each matched collective to every other rank's
        slice of the same (group, seq). Returns the number of flows."""
        if not len(self.ids):
            return 0
        c = self.cols
        return last_rank_flows(writer, c["group"], c["seq"], c["rank"], c["late"], self.ids)


def last_rank_flows(writer: TraceWriter, group: np.ndarray, seq: np.ndarray, rank: np.ndarray, last: np.ndarray,
                    ids: np.ndarray) -> int:
    """A flow from the ``last`` rank's slice of each collective (group, seq) to every other rank's
    slice of it; ``ids``: each row's trace event id, -1 where it was not drawn. One star per
    collective, from the rank the others waited for: a click on the straggler's slice leads to
    the ranks it held up, and a collective of n ranks costs n - 1 flows, not one per pair.
    Host collectives (``CollectiveTracks``) and collective device kernels (``layout_device``)
    share it. Returns the number of flows."""
    f = pd.DataFrame({"group": group, "seq": seq, "rank": rank, "last": last, "id": ids})
    f = f[f["id"] >= 0]
    src = f[f["rank"] == f["last"]][["group", "seq", "id"]]
    dst = f[f["rank"] != f["last"]][["group", "seq", "id"]]
    pairs = src.merge(dst, on=["group", "seq"], suffixes=("_src", "_dst"))
    if pairs.empty:
        return 0
    return writer.flows(pairs["id_src"].to_numpy(), pairs["id_dst"].to_numpy())
