"""``neuron_prof.load(path) -> Run``: a captured run as pandas DataFrames, all ranks together.

Interned ids are resolved here (strings to pandas categoricals; stacks to ``source`` =
``file:line`` of the innermost kept frame as neuron_prof shows it (``neuron_prof.paths``),
``user_source`` = the same for the innermost frame in the user's own files, ``source_full`` = the
innermost frame with its full path), so analyses work on plain columns.
"""
from __future__ import annotations

import functools
import gc
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api.types import union_categoricals

from neuron_prof.paths import display_frame, display_path, is_user_file
from neuron_prof.reader import RankData, read_run
from neuron_prof.schema import COLLECTIVE_STATUS, INFLIGHT_STATES, MEMORY_KINDS, REFERENCES, TABLES

def _string_columns(lists: bool) -> dict[str, tuple[str, ...]]:
    """Per table, its columns of string ids (``lists``: of lists of them)."""
    return {table: tuple(c for c, into in refs.items()
                         if into == "strings" and pa.types.is_list(TABLES[table].field(c).type) == lists)
            for table, refs in REFERENCES.items()}


_STRING_COLUMNS = _string_columns(lists=False)
_STRING_LIST_COLUMNS = _string_columns(lists=True)
_HANDED_OVER = ("ops", "memory_events")  # read once per Run (cached properties), then dropped by the reader

_FRAME_COLUMNS = {"recompiles": ("func",)}  # "func (file:line)": shown with the file short


SOURCE_COLUMNS = ("source", "user_source", "source_full")
"""What a ``stack`` id becomes in every table that has one (see the module docstring)."""


class _RankStrings:
    """Per-rank lookups: string ids to values, stack ids to their source lines."""

    def __init__(self, rd: RankData, cwd: str | None) -> None:
        strings = rd.table("strings")
        ids = strings.column("id").to_numpy()
        self.values = np.empty(int(ids.max()) + 1 if len(ids) else 1, dtype=object)
        self.values[:] = ""
        self.values[ids] = np.array(strings.column("value").to_pylist(), dtype=object)
        frames = rd.table("frames").to_pandas()
        self.frame_file = dict(zip(frames["id"], self.values[frames["file"].to_numpy()])) if len(frames) else {}
        self.frame_func = dict(zip(frames["id"], self.values[frames["func"].to_numpy()])) if len(frames) else {}
        self.frame_line = dict(zip(frames["id"], frames["line"])) if len(frames) else {}
        stacks = rd.table("stacks")
        self.stack_frames: dict[int, list[int]] = dict(zip(stacks.column("id").to_pylist(),
                                                           stacks.column("frames").to_pylist()))
        self.cwd = cwd

    def categorical(self, ids: np.ndarray) -> pd.Categorical:
        present, codes = _dense_codes(ids, len(self.values))
        return pd.Categorical.from_codes(codes, categories=pd.Index(self.values[present]))

    def sources(self, stack_ids: np.ndarray) -> dict[str, pd.Categorical]:
        """The :data:`SOURCE_COLUMNS` of each row, worked out once per distinct stack."""
        present, codes = _dense_codes(stack_ids, int(stack_ids.max(initial=0)) + 1)
        labels: dict[str, list[str]] = {c: [] for c in SOURCE_COLUMNS}
        for sid in present:
            frames = self.stack_frames.get(int(sid)) or []
            user = next((f for f in frames if is_user_file(self.frame_file[f])), None)
            labels["source"].append(self.line(frames[0]) if frames else "")
            labels["user_source"].append(self.line(user) if user is not None else "")
            labels["source_full"].append(f"{self.frame_file[frames[0]]}:{self.frame_line[frames[0]]}" if frames else "")
        out = {}
        for col, values in labels.items():
            cats, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
            out[col] = pd.Categorical.from_codes(inverse.reshape(-1).astype(np.int32)[codes], categories=pd.Index(cats))
        return out

    def line(self, frame: int) -> str:
        """A frame as ``file:line`` the way neuron_prof shows it."""
        return f"{display_path(self.frame_file[frame], self.cwd)}:{self.frame_line[frame]}"


def _dense_codes(ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids that occur, and each row's position among them (a counting pass, no sort)."""
    present = np.flatnonzero(np.bincount(ids, minlength=n))
    remap = np.zeros(max(n, 1), dtype=np.int32)
    remap[present] = np.arange(len(present), dtype=np.int32)
    return present, remap[ids]


def _categories_dtype(col: pd.Series):
    return col.cat.categories.dtype if isinstance(col.dtype, pd.CategoricalDtype) else None


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' frames as one. Categoricals (each rank's own categories) are united column by
    column, categories sorted as a concat's object column made category had them: a plain concat
    turns them into objects and back, which at hundreds of ranks costs more than reading."""
    if len(parts) == 1:
        return parts[0]
    # united where every rank's categories are alike (an empty Index is object, a full one str)
    cats = [c for c in parts[0].columns if _categories_dtype(parts[0][c]) is not None
            and all(_categories_dtype(p[c]) == _categories_dtype(parts[0][c]) for p in parts)]
    return pd.DataFrame({c: union_categoricals([p[c] for p in parts], sort_categories=True) if c in cats
                         else np.concatenate([p[c].to_numpy() for p in parts]) for c in parts[0].columns})


class Run:
    """A run directory, read once. Tables are built on first access and cached."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        files = read_run(self.path)
        self.meta: dict[str, Any] = files.meta
        # folders of an earlier capture into the same directory (another run id under record, or
        # a rank beyond this run's world size): ignored, listed in the report
        self.stale_rank_dirs = files.stale_rank_dirs
        self.rank_data: list[RankData] = files.ranks
        self.missing_ranks: list[int] = files.missing_ranks  # no folder: died before their first step
        self._conflicts = files.conflicts
        if not self.meta and self.rank_data:  # rank 0 died before writing run.json
            self.meta = dict(self.rank_data[0].meta)
        cwd = self.meta.get("cwd")
        self._strings = {rd.rank: _RankStrings(rd, cwd) for rd in self.rank_data}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, ranks={self.ranks}, steps={len(self.steps)}, ops={len(self.ops)})"

    @property
    def ranks(self) -> list[int]:
        return [rd.rank for rd in self.rank_data]

    def _table(self, name: str) -> pd.DataFrame:
        parts: list[pd.DataFrame] = []
        empty = None  # for the columns, when no rank has rows
        for rd in self.rank_data:
            table = rd.take(name) if name in _HANDED_OVER else rd.table(name)
            if table.num_rows:
                parts.append(self._rank_frame(name, rd, table))
            elif empty is None:
                # a rank's empty table adds nothing but its cost: a DataFrame per rank, which
                # at 256 ranks took seconds for the tables a run never wrote
                empty = (rd, table)
            del table  # a handed-over table's Arrow buffers go as soon as it is converted
        df = _concat(parts or [self._rank_frame(name, *empty)])
        for col in _STRING_COLUMNS.get(name, ()) + (SOURCE_COLUMNS if "source" in df.columns else ()):
            if df[col].dtype != "category":
                df[col] = df[col].astype("category")
        return df

    def _rank_frame(self, name: str, rd: RankData, table: pa.Table) -> pd.DataFrame:
        """One rank's table as a DataFrame, its ids resolved."""
        if name in _HANDED_OVER:  # millions of rows: convert, and let the Arrow buffers go
            df = table.to_pandas(split_blocks=True, self_destruct=True)
        else:
            df = table.to_pandas()
        strings = self._strings[rd.rank]
        for col in _STRING_COLUMNS.get(name, ()):
            df[col] = strings.categorical(df[col].to_numpy())
        for col in _STRING_LIST_COLUMNS.get(name, ()):
            df[col] = [list(strings.values[np.asarray(ids, dtype=np.int64)]) for ids in df[col]]
        for col in _FRAME_COLUMNS.get(name, ()):
            df[col] = df[col].map(lambda text: display_frame(text, strings.cwd)).astype("category")
        if "stack" in df.columns:
            for col, values in strings.sources(df["stack"].to_numpy()).items():
                df.insert(df.columns.get_loc("stack"), col, values)
        df.insert(0, "rank", np.int32(rd.rank))
        return df

    def _with_step(self, df: pd.DataFrame) -> pd.DataFrame:
        """Tag events with the step they started in (-1: before the first step began)."""
        step = np.full(len(df), -1, dtype=np.int32)
        steps = self.steps
        ranks = df["rank"].to_numpy()
        one = len(self.rank_data) == 1  # the common case: no per-rank grouping of millions of rows
        groups = {self.ranks[0]: slice(None)} if one else df.groupby("rank", observed=True).indices
        ts = df["ts"].to_numpy()
        for rank, idx in groups.items():
            s = steps[steps["rank"] == rank].sort_values("ts")
            if len(s) and len(ranks):
                pos = np.searchsorted(s["ts"].to_numpy(), ts[idx], side="right") - 1
                step[idx] = np.where(pos >= 0, s["step"].to_numpy()[np.maximum(pos, 0)], -1)
        df["step"] = step
        return df

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step and rank: step, ts, dur, active (captured in detail), complete. In an
        always-on run the steps a dump wrote whole are the active ones (their rows were written
        before it); the step in flight at the dump is in it only in part."""
        steps = self._table("steps").sort_values(["rank", "step"], ignore_index=True)
        dumps = self.dumps
        for rank, first, last in zip(dumps["rank"], dumps["first_step"], dumps["last_step"]):
            steps.loc[(steps["rank"] == rank) & steps["step"].between(first, last - 1), "active"] = True
        return steps

    @functools.cached_property
    def dumps(self) -> pd.DataFrame:
        """Always-on capture's dumps, a row per thread each named: rank, ts, reason, first_step,
        last_step (the steps whose detail it wrote), tid and that thread's stack (source...)."""
        return self._table("dumps").sort_values(["rank", "ts", "tid"], ignore_index=True)

    @functools.cached_property
    def ops(self) -> pd.DataFrame:
        """One row per ATen op: rank, ts, dur, tid, thread, name, module, source, shapes, ..., step."""
        ops = self._table("ops")
        # thread names as a categorical built from the few distinct (rank, tid) pairs, not per row
        names = {(int(r), int(t)): str(n) for r, t, n in zip(self.threads["rank"], self.threads["tid"],
                                                             self.threads["name"])}
        key = ops["rank"].to_numpy(np.int64) * (1 << 40) + ops["tid"].to_numpy(np.int64)
        codes, uniq = pd.factorize(key)
        labels = [names.get((int(k >> 40), int(k & ((1 << 40) - 1))), str(int(k & ((1 << 40) - 1)))) for k in uniq]
        cats, remap = np.unique(np.array(labels, dtype=object), return_inverse=True)
        thread = pd.Categorical.from_codes(remap.reshape(-1)[codes.reshape(-1)].astype(np.int32), categories=cats)
        ops.insert(ops.columns.get_loc("tid") + 1, "thread", thread)
        return self._with_step(ops)

    @functools.cached_property
    def op_parent(self) -> np.ndarray:
        """Row position in ``ops`` of each op's enclosing op (-1: top level). The nesting pass is
        the costliest step over millions of ops; self time, sync points and compiled-region
        timing all start from it, so it is computed once per run."""
        from neuron_prof.analysis.ops import parent_index
        return parent_index(self.ops)

    @functools.cached_property
    def op_compile(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inside, compile_ns)`` for each row of ``ops``: whether it ran within a torch.compile
        compile on its thread, and how much compiling lies within it
        (``analysis.ops.compile_overlap``). Run time = ``dur - compile_ns``."""
        from neuron_prof.analysis.ops import compile_overlap
        return compile_overlap(self.ops, self.compile_spans)

    @functools.cached_property
    def op_run_self_ns(self) -> np.ndarray:
        """Self time of each row of ``ops`` (ns) with compiling left out: 0 for ops inside a
        compile; the op table, region costs and break-site costs start from it."""
        from neuron_prof.analysis.ops import self_time
        compile_ns = self.op_compile[1]
        return self_time(self.ops, self.op_parent, self.ops["dur"].to_numpy() - compile_ns if compile_ns.any() else None)

    @functools.cached_property
    def compile_spans(self) -> pd.DataFrame:
        """When each thread was compiling (``analysis.compile.compile_spans``)."""
        from neuron_prof.analysis.compile import compile_spans
        return compile_spans(self.compiles, self.compile_phases)

    @functools.cached_property
    def step_kinds(self) -> pd.DataFrame:
        """``steps`` with ``compile_ns``, ``warmup`` and ``steady`` (``analysis.steps.step_kinds``)."""
        from neuron_prof.analysis.steps import step_kinds
        return step_kinds(self.steps, self.compile_spans)

    @functools.cached_property
    def spans(self) -> pd.DataFrame:
        """Spans of the run that are not steps: ``start-up`` (under ``record``: the process from
        its start to its first module call). neuron_prof's own work at step boundaries is the gap
        between one step's end and the next one's start (``analysis.steps.own_work``)."""
        return self._table("spans")

    @functools.cached_property
    def marks(self) -> pd.DataFrame:
        """User ranges from ``neuron_prof.mark``."""
        return self._with_step(self._table("marks"))

    @functools.cached_property
    def metrics(self) -> pd.DataFrame:
        """Scalars of the training, one row per value: ``loss`` (each ``backward()``'s root),
        ``tokens``/``samples`` per step, and what ``neuron_prof.log`` named; ``step``: the step
        the value was handed over in (``analysis.metrics.per_step``: one value per step)."""
        return self._with_step(self._table("metrics"))

    @functools.cached_property
    def threads(self) -> pd.DataFrame:
        return self._table("threads").drop_duplicates(["rank", "tid"], keep="last", ignore_index=True)

    @functools.cached_property
    def compiles(self) -> pd.DataFrame:
        """One row per frame compilation: compile_id, func/file/line, backend, status, time, ops, guards."""
        return self._with_step(self._table("compiles"))

    @functools.cached_property
    def compile_phases(self) -> pd.DataFrame:
        """Phases of each compile (bytecode tracing, AOT autograd, backend compile, ...)."""
        return self._table("compile_phases")

    @functools.cached_property
    def graph_breaks(self) -> pd.DataFrame:
        """One row per graph break: reason, reason_class, gb_id, source (user file:line), compile_id."""
        return self._with_step(self._table("graph_breaks"))

    @functools.cached_property
    def recompiles(self) -> pd.DataFrame:
        """One row per failed guard that caused a recompile."""
        return self._with_step(self._table("recompiles"))

    @functools.cached_property
    def fusions(self) -> pd.DataFrame:
        """One row per generated kernel: the FX nodes fused into it (``nodes``, a list)."""
        return self._table("fusions")

    @functools.cached_property
    def compile_cache(self) -> pd.DataFrame:
        """FX graph / AOT autograd cache lookups: cache, result (hit, miss, bypass)."""
        return self._table("compile_cache")

    @functools.cached_property
    def memory_events(self) -> pd.DataFrame:
        """Allocator events: kind (alloc, free, baseline, late_free, live, oom, recent), bytes
        (negative for frees), device, addr, alloc_ts (pairs a free with its allocation), op,
        top_op, module, source; see collectors/memory.py."""
        ev = self._table("memory_events")
        ev["kind"] = pd.Categorical.from_codes(ev["kind"].to_numpy(np.int8), categories=list(MEMORY_KINDS))
        return self._with_step(ev)

    @functools.cached_property
    def memory_steps(self) -> pd.DataFrame:
        """Live bytes (allocated since capture began) and peak per device at every step boundary."""
        return self._table("memory_steps").sort_values(["rank", "device", "step"], ignore_index=True)

    @functools.cached_property
    def process_memory(self) -> pd.DataFrame:
        """The process's resident memory (RSS) at every step boundary, per rank (Linux)."""
        return self._table("process_memory").sort_values(["rank", "step"], ignore_index=True)

    @functools.cached_property
    def memory_tensors(self) -> pd.DataFrame:
        """Parameters, gradients and optimizer state by storage address at captured step boundaries."""
        return self._table("memory_tensors")

    @functools.cached_property
    def memory_ooms(self) -> pd.DataFrame:
        """Out-of-memory errors that ended the capture: message, requested bytes, device, step."""
        return self._table("memory_ooms")

    @functools.cached_property
    def memory_allocations(self) -> pd.DataFrame:
        """One row per captured allocation: lifetime, attribution, category (analysis.memory)."""
        from neuron_prof.analysis.memory import allocations
        return allocations(self.memory_events, self.memory_tensors, self.steps)

    @functools.cached_property
    def memory_timeline(self) -> pd.DataFrame:
        """Live bytes over time per device, total and per category, min/max downsampled."""
        from neuron_prof.analysis.memory import timeline
        return timeline(self.memory_allocations)

    @functools.cached_property
    def memory_peaks(self) -> pd.DataFrame:
        """Each captured step's peak per device and the allocation that reached it."""
        from neuron_prof.analysis.memory import peaks
        return peaks(self.memory_allocations, self.steps)

    @functools.cached_property
    def memory_leaks(self) -> pd.DataFrame:
        """Step-over-step growth of live memory and the sites whose allocations survive."""
        from neuron_prof.analysis.memory import leaks
        return leaks(self.memory_allocations, self.memory_steps, self.steps, self.process_memory)

    def memory_snapshot(self, step: int, by: str | list[str] = "category", rank: int = 0) -> pd.DataFrame:
        """What was live at the end of ``step`` (its boundary), grouped ``by`` category, source,
        module, op..."""
        from neuron_prof.analysis.memory import snapshot
        s = self.steps[(self.steps["rank"] == rank) & (self.steps["step"] == step)]
        if s.empty:
            raise KeyError(f"no step {step} on rank {rank} in {self.path}")
        return snapshot(self.memory_allocations, int(s["ts"].iloc[0] + s["dur"].iloc[0]), by, rank)

    @functools.cached_property
    def collectives(self) -> pd.DataFrame:
        """One row per collective per rank (collector ``collectives``): ts/dur (the issue call on
        thread tid, the rank's own clock), done (completed, -1: not known), op (all_reduce,
        all_gather, ...), call (the c10d op), group, group_desc, group_size, seq (the group's
        sequence number: one collective has one (group, seq) on every rank), count, bytes,
        out_bytes, dtype, peer, async_op, status (completed, failed, in_flight, unknown), module,
        source (the issuing user line), bwd, step. A rank killed before its last flush adds the
        collectives its in-flight file still holds (the last few hundred: those in flight, and
        completed ones the tables had not received); their module and source are not known."""
        df = self._table("collectives")
        df["status"] = pd.Categorical.from_codes(df["status"].to_numpy(np.int8), categories=list(COLLECTIVE_STATUS))
        slots = [self._inflight_rows(rd, df) for rd in self.rank_data if rd.inflight is not None and len(rd.inflight)]
        if any(len(s) for s in slots):
            df = pd.concat([df, *slots], ignore_index=True)
            for col in _STRING_COLUMNS["collectives"] + SOURCE_COLUMNS + ("status",):
                df[col] = df[col].astype(str).astype("category")
        groups = self.collective_groups[["rank", "group", "desc", "size"]].drop_duplicates(["rank", "group"])
        groups = groups.rename(columns={"desc": "group_desc", "size": "group_size"})
        df["group"] = df["group"].astype(str)
        groups["group"] = groups["group"].astype(str)
        df = df.merge(groups, on=["rank", "group"], how="left")
        # object first: a rank whose groups were never flushed (killed early) has rows no group
        # matches, and an empty categorical cannot take the "" that stands for unknown
        df["group_desc"] = df["group_desc"].astype(object).fillna("").astype(str).astype("category")
        df["group_size"] = df["group_size"].fillna(0).astype(np.int32)
        df["group"] = df["group"].astype("category")
        return self._with_step(df.sort_values(["rank", "ts"], ignore_index=True))

    @staticmethod
    def _inflight_rows(rd: RankData, table: pd.DataFrame) -> pd.DataFrame:
        """The in-flight file's collectives that the rank's table lacks (schema.INFLIGHT)."""
        s = rd.inflight
        have = table[table["rank"] == rd.rank]
        known = set(zip(have["group"].astype(str), have["seq"].astype(np.int64)))
        groups = [g.decode("utf-8", "replace") for g in s["group"]]
        keep = np.array([(g, int(q)) not in known for g, q in zip(groups, s["seq"])], dtype=bool)
        if not keep.any():
            return pd.DataFrame()
        n = int(keep.sum())
        states = np.array([INFLIGHT_STATES[int(v)] for v in s["state"][keep]], dtype=object)
        done = np.where(states == "in_flight", -1, s["done"][keep])
        return pd.DataFrame({
            "rank": np.int32(rd.rank), "ts": s["ts"][keep], "dur": np.zeros(n, np.int64), "done": done,
            "tid": np.zeros(n, np.int64), "op": [o.decode("utf-8", "replace") for o in s["op"][keep]], "call": "",
            "group": np.array(groups, dtype=object)[keep], "seq": s["seq"][keep], "count": np.zeros(n, np.int32),
            "bytes": s["bytes"][keep], "out_bytes": np.full(n, -1, np.int64), "dtype": "",
            "peer": s["peer"][keep], "async_op": False, "status": states, "module": "",
            **{c: "" for c in SOURCE_COLUMNS}, "stack": np.zeros(n, np.int32), "bwd": False})

    @functools.cached_property
    def collective_groups(self) -> pd.DataFrame:
        """The process groups each rank's collectives ran on: group (name), desc, backend, size,
        group_rank (the rank's place in it), ranks (its members as global ranks; empty: unknown)."""
        return self._table("groups").drop_duplicates(["rank", "group"], keep="last", ignore_index=True)

    @functools.cached_property
    def clock_sync(self) -> pd.DataFrame:
        """Each rank's clock against rank 0's, measured at capture start and end (phase): rank 0's
        time = ts + offset, to within rtt/2; same_clock: both ranks read one clock (the offset that
        applies is 0). ``analysis.collectives.clock_offsets`` turns it into the offsets used."""
        return self._table("clock_sync")

    @functools.cached_property
    def collective_offsets(self) -> pd.DataFrame:
        """Each rank's offset to rank 0's clock, as merged views apply it
        (``analysis.collectives.clock_offsets``)."""
        from neuron_prof.analysis.collectives import clock_offsets
        return clock_offsets(self.clock_sync, self.ranks)

    @functools.cached_property
    def collectives_matched(self) -> pd.DataFrame:
        """One row per collective (group, seq) across its ranks, on rank 0's clock: arrivals, the
        last rank, wait, transfer, missing ranks (``analysis.collectives.matched``)."""
        from neuron_prof.analysis.collectives import matched
        return matched(self.collectives, self.collective_offsets, self.collective_groups, self.steps)

    @functools.cached_property
    def collective_waits(self) -> pd.DataFrame:
        """``collectives`` with aligned start/end and each rank's wait for the last arrival
        (``analysis.collectives.waits``)."""
        from neuron_prof.analysis.collectives import waits
        return waits(self.collectives, self.collectives_matched, self.collective_offsets)

    @functools.cached_property
    def collective_mismatches(self) -> pd.DataFrame:
        """Collectives the ranks of a group disagree on (``analysis.collectives.mismatches``)."""
        from neuron_prof.analysis.collectives import mismatches
        return mismatches(self.collectives, self.collective_groups)

    @functools.cached_property
    def collective_overlap(self) -> pd.DataFrame:
        """Per rank and step: time in collectives, overlapped by compute, exposed
        (``analysis.collectives.overlap``)."""
        from neuron_prof.analysis.collectives import overlap
        return overlap(self.collectives, self.ops, self.steps)

    @functools.cached_property
    def device_enqueues(self) -> pd.DataFrame:
        """Ops a device backend put on its queue (collector ``device``): rank, ts, tid (host
        thread), id, device (``neuron:0``), stream, op, queue_depth (after it), the host op open on
        the thread (host_op, module, source, user_source, source_full, stack, bwd), step. The
        enqueuing op is the ``run.ops`` row of the same rank and tid whose span holds ts."""
        return self._with_step(self._table("device_enqueues").sort_values(["rank", "ts"], ignore_index=True))

    @functools.cached_property
    def queue_flushes(self) -> pd.DataFrame:
        """Waits of a host thread for a device queue to drain: rank, ts, dur, tid, device, reason
        (sync, size, fallback, synchronize, other), ops (queued ops waited for), host_op, module,
        source, user_source, source_full, stack, bwd, step."""
        return self._with_step(self._table("queue_flushes").sort_values(["rank", "ts"], ignore_index=True))

    @functools.cached_property
    def kernel_enqueues(self) -> pd.DataFrame:
        """Which enqueued ops each kernel ran: rank, kernel (``device_kernels.id``), enqueue
        (``device_enqueues.id``), in the backend's order."""
        return self._table("kernel_enqueues")

    @functools.cached_property
    def device_kernels(self) -> pd.DataFrame:
        """Kernels a device backend ran: rank, ts, dur, tid (the reporting thread), id, device,
        stream, name, n_ops, enqueue_ids (the ``device_enqueues.id`` of the ops it ran, a list),
        step."""
        df = self._table("device_kernels")
        links = self.kernel_enqueues
        from neuron_prof.analysis.device import rank_key
        lk = rank_key(links["rank"], links["kernel"])
        order = np.argsort(lk, kind="stable")
        lk, enq = lk[order], links["enqueue"].to_numpy(np.int64)[order]
        kk = rank_key(df["rank"], df["id"])
        lo, hi = np.searchsorted(lk, kk, side="left"), np.searchsorted(lk, kk, side="right")
        flat = enq.tolist()
        collecting = gc.isenabled()
        gc.disable()  # a list per kernel: the cyclic collector walked the millions made so far, again and again
        try:
            ids = [flat[a:b] for a, b in zip(lo.tolist(), hi.tolist())]
        finally:
            if collecting:
                gc.enable()
        df["enqueue_ids"] = ids
        return self._with_step(df.sort_values(["rank", "ts"], ignore_index=True))

    @functools.cached_property
    def device_correlation(self) -> pd.DataFrame:
        """Each enqueued op with its host op (``op_index``: its ``ops`` row) and the kernel that ran
        it (``analysis.device.correlation``)."""
        from neuron_prof.analysis.device import correlation
        return correlation(self.device_enqueues, self.device_kernels, self.kernel_enqueues, self.ops)

    @functools.cached_property
    def device_steps(self) -> pd.DataFrame:
        """Per rank, device and complete step: device busy and idle time, the host's waits for it
        (``analysis.device.device_steps``)."""
        from neuron_prof.analysis.device import device_steps
        return device_steps(self.device_kernels, self.queue_flushes, self.step_kinds)

    @functools.cached_property
    def fallbacks(self) -> pd.DataFrame:
        """Ops a device backend ran on the CPU instead: rank, ts, dur, tid, device, op,
        bytes_to_host (inputs copied off the device), bytes_from_host (outputs copied back),
        host_op, module, source, user_source, source_full, stack, bwd, step."""
        return self._with_step(self._table("fallbacks").sort_values(["rank", "ts"], ignore_index=True))

    @functools.cached_property
    def failures(self) -> pd.DataFrame:
        """Collectors that failed during capture (training went on without them)."""
        return self._table("failures")

    def stack(self, rank: int, stack_id: int) -> list[tuple[str, str, int]]:
        """The frames (file, function, line) of a stack id, innermost first, with full paths."""
        s = self._strings[rank]
        return [(s.frame_file[f], s.frame_func[f], int(s.frame_line[f])) for f in s.stack_frames.get(stack_id, [])]

    def display_path(self, path: str) -> str:
        """A file of this run as neuron_prof shows it (``neuron_prof.paths.display_path``)."""
        return display_path(path, self.meta.get("cwd"))

    @functools.cached_property
    def health(self) -> pd.DataFrame:
        """Capture health per rank: closed cleanly, events written/dropped, bytes ignored after a kill."""
        rows = []
        for rd in self.rank_data:
            c = rd.last_commit
            rows.append({
                "rank": rd.rank, "closed": rd.closed, "committed": bool(c),
                "events_written": int(sum((c.get("written") or {}).values())),
                "events_dropped": int(sum((c.get("dropped") or {}).values())),
                "cap_reached_at_step": c.get("cap_reached_at_step"),
                "ignored_bytes": int(sum(rd.ignored_bytes.values())),
                "failures": int(rd.table("failures").num_rows),
            })
        return pd.DataFrame(rows)


    @functools.cached_property
    def conflicts(self) -> pd.DataFrame:
        """Processes that wanted a rank another process owned, and so wrote nothing: rank, pid,
        hostname, argv, time_ns, holder_pid, live (the owner was still writing)."""
        cols = ["rank", "pid", "hostname", "argv", "time_ns", "holder_pid", "live"]
        return pd.DataFrame([{c: n.get(c) for c in cols} for n in self._conflicts], columns=cols)


def load(path: str | os.PathLike) -> Run:
    """Open a run directory written by ``neuron_prof.profile`` or ``neuron-prof record``."""
    return Run(path)
