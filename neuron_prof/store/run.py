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
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api.types import union_categoricals

from neuron_prof.store.keys import backend_key, thread_key, thread_key_parts
from neuron_prof.store.open_ops import innermost_ops, last_at_or_before
from neuron_prof.paths import display_frame, display_path, is_user_file
from neuron_prof.store.reader import RankData, read_run
from neuron_prof.store.schema import (ATTRIBUTE_OF_TABLE, COLLECTIVE_STATUS, INFLIGHT_STATES, MEMORY_KINDS, REFERENCES,
                                SCHEMA_VERSION, TABLE_OF_ATTRIBUTE, TABLES)

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
    """A run directory, read once: its tables as DataFrames, built on first access and kept.

    Every table of ``schema.TABLES`` (but the interned strings, frames and stacks, which are
    resolved into the others) is an attribute of the same name (``groups`` is
    ``collective_groups``), documented in ``schema.DESCRIPTIONS``; ``run.table(name)`` is the same.
    Analyses of the tables are on ``neuron_prof.analyze(run)``."""

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

    def __getattr__(self, name: str) -> pd.DataFrame:
        """A table by its attribute name (only called for names not yet in the instance)."""
        table = TABLE_OF_ATTRIBUTE.get(name)
        if table is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.table(table)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *TABLE_OF_ATTRIBUTE})

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` of ``schema.TABLES``, all ranks, ids resolved, finished as
        ``_FINISHED`` says (sorted, tagged with steps...); built once."""
        attribute = ATTRIBUTE_OF_TABLE.get(name)
        if attribute is None:
            raise KeyError(f"no table {name!r} in a run (tables: {', '.join(ATTRIBUTE_OF_TABLE)})")
        df = self.__dict__.get(attribute)
        if df is None:
            finish = _FINISHED.get(name)
            df = self._table(name) if finish is None else finish(self, self._table(name))
            self.__dict__[attribute] = df
        return df

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


# ---- how each table is finished after its ranks are merged (tables not named here: as read)

def _with_step(run: Run, df: pd.DataFrame) -> pd.DataFrame:
    return run._with_step(df)


def _by_rank_ts(run: Run, df: pd.DataFrame) -> pd.DataFrame:
    return run._with_step(df.sort_values(["rank", "ts"], ignore_index=True))


def _steps(run: Run, steps: pd.DataFrame) -> pd.DataFrame:
    """In an always-on run the steps a dump wrote whole are active too (their rows were written
    before it); the step in flight at the dump is in it only in part."""
    steps = steps.sort_values(["rank", "step"], ignore_index=True)
    dumped = pd.MultiIndex.from_arrays([run.dumped_steps["rank"], run.dumped_steps["step"]])
    steps.loc[pd.MultiIndex.from_arrays([steps["rank"], steps["step"]]).isin(dumped), "active"] = True
    return steps


def _dumped_steps(run: Run, dumped: pd.DataFrame) -> pd.DataFrame:
    """Schema 2's always-on ranks kept every step's detail, so their dumps wrote first_step up
    to the step in flight whole: their rows are made here, and readers need not know."""
    old = {rd.rank for rd in run.rank_data if rd.meta.get("schema_version", SCHEMA_VERSION) < 3}
    dumps = run.dumps.drop_duplicates(["rank", "ts"])
    dumps = dumps[dumps["rank"].isin(old)]
    made = [pd.DataFrame({"rank": rank, "ts": ts, "step": np.arange(first, last, dtype=np.int32)})
            for rank, ts, first, last in zip(dumps["rank"], dumps["ts"], dumps["first_step"], dumps["last_step"])]
    if made:
        dumped = pd.concat([dumped, *made], ignore_index=True).astype(dumped.dtypes.to_dict())
    return dumped.sort_values(["rank", "ts", "step"], ignore_index=True)


def _ops(run: Run, ops: pd.DataFrame) -> pd.DataFrame:
    """Adds ``thread`` (the thread's name) after ``tid``."""
    # thread names as a categorical built from the few distinct (rank, tid) pairs, not per row
    threads = run.threads
    names = {(int(r), int(t)): str(n) for r, t, n in zip(threads["rank"], threads["tid"], threads["name"])}
    codes, uniq = pd.factorize(thread_key(ops["rank"], ops["tid"]))
    labels = [names.get((int(r), int(t)), str(int(t))) for r, t in zip(*thread_key_parts(uniq))]
    cats, remap = np.unique(np.array(labels, dtype=object), return_inverse=True)
    thread = pd.Categorical.from_codes(remap.reshape(-1)[codes.reshape(-1)].astype(np.int32), categories=cats)
    ops.insert(ops.columns.get_loc("tid") + 1, "thread", thread)
    return run._with_step(ops)


def _memory_events(run: Run, ev: pd.DataFrame) -> pd.DataFrame:
    ev["kind"] = pd.Categorical.from_codes(ev["kind"].to_numpy(np.int8), categories=list(MEMORY_KINDS))
    return run._with_step(ev)


def _collectives(run: Run, df: pd.DataFrame) -> pd.DataFrame:
    """Adds the in-flight file's rows (a rank killed before its last flush) and each row's
    group_desc and group_size."""
    df["status"] = pd.Categorical.from_codes(df["status"].to_numpy(np.int8), categories=list(COLLECTIVE_STATUS))
    slots = [_inflight_rows(rd, df) for rd in run.rank_data if rd.inflight is not None and len(rd.inflight)]
    if any(len(s) for s in slots):
        df = pd.concat([df, *slots], ignore_index=True)
        for col in _STRING_COLUMNS["collectives"] + SOURCE_COLUMNS + ("status",):
            df[col] = df[col].astype(str).astype("category")
    groups = run.collective_groups[["rank", "group", "desc", "size"]].drop_duplicates(["rank", "group"])
    groups = groups.rename(columns={"desc": "group_desc", "size": "group_size"})
    df["group"] = df["group"].astype(str)
    groups["group"] = groups["group"].astype(str)
    df = df.merge(groups, on=["rank", "group"], how="left")
    # object first: a rank whose groups were never flushed (killed early) has rows no group
    # matches, and an empty categorical cannot take the "" that stands for unknown
    df["group_desc"] = df["group_desc"].astype(object).fillna("").astype(str).astype("category")
    df["group_size"] = df["group_size"].fillna(0).astype(np.int32)
    df["group"] = df["group"].astype("category")
    return run._with_step(df.sort_values(["rank", "ts"], ignore_index=True))


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


HOST_CONTEXT_AT = {"device_enqueues": "ts", "queue_flushes": "ts", "stream_syncs": "ts", "fallbacks": "ts",
                   "event_enqueues": "ts", "device_copies": "host_ts"}
"""Device tables whose rows have a host side, and the column of its time: a launch, a wait, a call
into the device, on thread ``tid``."""
HOST_CONTEXT_SINCE = 5
"""The schema version from which a rank's device rows come from Kineto, which names a host call's
thread and time only: their host op, module, stack and pass are the ops' (before it the backend
hook API recorded them at capture)."""


def _with_host_context(run: Run, df: pd.DataFrame, at: str) -> pd.DataFrame:
    """The host op open on each row's thread at its time (``at``), with its module, source lines
    and pass, from ``ops``: for rows of ranks whose capture (or import) took them from a profiler
    trace. A row with no op open there keeps an empty host op; its line is the backward() call's
    when it ran on autograd's thread of a device during a backward pass (DDP's reducer waits there
    for its all-reduces, outside any op, where Python has no frame): the line the collectives
    collector gave the collectives that thread issued last (``_backward_lines``), else none."""
    joined = [rd.rank for rd in run.rank_data if rd.meta.get("schema_version", 1) >= HOST_CONTEXT_SINCE]
    rows = np.flatnonzero(np.isin(df["rank"].to_numpy(), joined)) if joined and len(df) else np.zeros(0, np.int64)
    if not len(rows):
        return df
    t = df[at].to_numpy(np.int64)[rows]
    rank, tid = df["rank"].to_numpy()[rows], df["tid"].to_numpy()[rows]
    ops = run.ops
    pos = innermost_ops(rank, tid, t, ops)
    pos[t < 0] = -1
    for col, src in (("host_op", "name"), ("module", "module")):
        df[col] = _take_categories(df[col], rows, ops[src], pos)
    for col in ("stack", "bwd"):
        values = df[col].to_numpy().copy()
        values[rows] = _taken(ops[col].to_numpy(), pos, values[rows])
        df[col] = values
    # the line: the op's, or where it has none, the backward() call's on autograd's device thread
    lined = _taken(ops["stack"].to_numpy(), pos, np.zeros(len(rows), ops["stack"].dtype)) != 0
    issued = _backward_lines(run, rank, tid, t) if not lined.all() else np.full(len(rows), -1)
    issued[lined] = -1
    coll = run.collectives
    for col in SOURCE_COLUMNS:
        from_ops = _take_categories(df[col], rows, ops[col], np.where(lined, pos, -1))
        df[col] = _take_categories(pd.Series(from_ops), rows[~lined], coll[col], issued[~lined]) if (~lined).any() \
            else from_ops
    return df


def _backward_lines(run: Run, rank: np.ndarray, tid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per host-side row (rank, thread, time), the position in ``collectives`` of the last
    collective its thread issued at or before it in a backward pass with a line (its issue call
    took the backward() call's: see ``collectors/collectives.py``), -1 where none."""
    c = run.collectives
    keep = np.flatnonzero(c["bwd"].to_numpy(bool) & (c["user_source"].astype(str).to_numpy() != "")) if len(c) \
        else np.zeros(0, np.int64)
    if not len(keep):
        return np.full(len(t), -1, np.int64)
    key, ts = thread_key(c["rank"].to_numpy()[keep], c["tid"].to_numpy()[keep]), c["ts"].to_numpy(np.int64)[keep]
    order = np.lexsort((ts, key))
    pos = last_at_or_before(key[order], ts[order], thread_key(rank, tid), t)
    return np.where(pos >= 0, keep[order][np.maximum(pos, 0)], -1)


def _taken(values: np.ndarray, pos: np.ndarray, default: np.ndarray) -> np.ndarray:
    """``values[pos]`` where ``pos >= 0``, ``default`` elsewhere: only positions that exist are
    read, so a run without host ops (a trace of the device alone) gives ``default``."""
    out = default.copy()
    hit = pos >= 0
    out[hit] = values[pos[hit]]
    return out


def _take_categories(dst: pd.Series, rows: np.ndarray, src: pd.Series, pos: np.ndarray) -> pd.Categorical:
    """``dst`` (categorical) with ``rows`` set to ``src``'s value at ``pos`` ("" where -1), code by
    code: no string per row."""
    src = src.astype("category")
    cats = pd.Index(dst.cat.categories).union(pd.Index(src.cat.categories)).union(pd.Index([""]))
    codes = cats.get_indexer(dst.cat.categories)[dst.cat.codes.to_numpy()]
    taken = cats.get_indexer(src.cat.categories)[src.cat.codes.to_numpy()[np.maximum(pos, 0)]] if len(src) \
        else np.zeros(len(pos), np.int64)
    codes[rows] = np.where(pos >= 0, taken, cats.get_loc(""))
    return pd.Categorical.from_codes(codes, categories=cats)


def _device_kernels(run: Run, df: pd.DataFrame) -> pd.DataFrame:
    """Adds ``enqueue_ids``: the ``device_enqueues.id`` of the ops each kernel ran, a list."""
    links = run.kernel_enqueues
    lk = backend_key(links["rank"], links["kernel"])
    order = np.argsort(lk, kind="stable")
    lk, enq = lk[order], links["enqueue"].to_numpy(np.int64)[order]
    kk = backend_key(df["rank"], df["id"])
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
    return run._with_step(df.sort_values(["rank", "ts"], ignore_index=True))


_FINISHED: dict[str, Callable[[Run, pd.DataFrame], pd.DataFrame]] = {
    "steps": _steps,
    "dumped_steps": _dumped_steps,
    "dumps": lambda run, df: df.sort_values(["rank", "ts", "tid"], ignore_index=True),
    "dump_collectives": lambda run, df: run._with_step(df.sort_values(["rank", "ts", "since"], ignore_index=True)),
    "dump_queues": lambda run, df: run._with_step(df.sort_values(["rank", "ts", "device"], ignore_index=True)),
    "ops": _ops,
    "marks": _with_step, "metrics": _with_step, "compiles": _with_step, "graph_breaks": _with_step,
    "recompiles": _with_step,
    "threads": lambda run, df: df.drop_duplicates(["rank", "tid"], keep="last", ignore_index=True),
    "memory_events": _memory_events,
    "memory_steps": lambda run, df: df.sort_values(["rank", "device", "step"], ignore_index=True),
    "process_memory": lambda run, df: df.sort_values(["rank", "step"], ignore_index=True),
    "collectives": _collectives,
    "groups": lambda run, df: df.drop_duplicates(["rank", "group"], keep="last", ignore_index=True),
    **{table: (lambda at: lambda run, df: _by_rank_ts(run, _with_host_context(run, df, at)))(at)
       for table, at in HOST_CONTEXT_AT.items()},
    "event_completions": _by_rank_ts, "stream_waits": _by_rank_ts, "device_gaps": _by_rank_ts,
    "device_kernels": _device_kernels,
}


def load(path: str | os.PathLike) -> Run:
    """Open a run directory written by ``neuron_prof.profile`` or ``neuron-prof record``."""
    return Run(path)
