"""A ``TORCH_TRACE`` folder (the structured compile logs tlparse reads) as a run's compile tables.

``TORCH_TRACE=/dir python train.py`` makes torch write one ``dedicated_log_torch_trace_*.log`` per
process: glog-prefixed JSON records, each maybe followed by a tab-indented payload. What neuron_prof's
compiler collector takes from torch in process, these records carry too, and they are read the
same way (``collectors.compiler.parse_graph_break``, ``compile_status``):

* ``compilation_metrics`` -> ``compiles`` (compile id, frame, status, failure, graph ops, guards,
  cache size, start and duration), with the frame's stack from its ``dynamo_start``;
* the ``dynamo_graph_break_reason`` artifact -> ``graph_breaks`` (reason, class, GB id, user stack);
* the ``recompile_reasons`` artifact -> ``recompiles`` (each failed guard).

Each process's file is the rank its records name (``rank``; 0 without one). Compile phases,
generated kernels and cache lookups are not read yet.
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from neuron_prof.collectors.compiler import compile_status, parse_graph_break, reason_class
from neuron_prof.errors import NeuronProfError
from neuron_prof.importers.imported import ImportedRun, check_new, number
from neuron_prof.recording.api import framework_prefixes
from neuron_prof.store.schema import Frame
from neuron_prof.store.safefile import read_whole
from neuron_prof.store.interner import Interner

LOG_GLOB = "dedicated_log_torch_trace_*.log"
MAX_LOG_BYTES = 4 << 30
_RECORD = re.compile(r"^[VIWE]\d{4} [\d:.]+ \d+ \S+\] (\{.*\})$")


def records(path: Path) -> list[tuple[dict[str, Any], str]]:
    """The file's (metadata, payload) records; lines that are neither are skipped."""
    text = read_whole(path, MAX_LOG_BYTES, "is it a TORCH_TRACE log?").decode("utf-8", "replace")
    out: list[tuple[dict[str, Any], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("\t"):
            if out:
                out[-1][1].append(line[1:])
            continue
        m = _RECORD.match(line)
        if m is None:
            continue
        try:
            meta = json.loads(m.group(1))
        except (ValueError, RecursionError):
            continue
        if isinstance(meta, dict):
            out.append((meta, []))
    return [(meta, "\n".join(payload)) for meta, payload in out]


def _compile_id(meta: dict[str, Any]) -> str:
    attempt = meta.get("attempt") or 0
    return f"{meta.get('frame_id')}/{meta.get('frame_compile_id')}" + (f"_{attempt}" if attempt else "")


class _Rank:
    """One rank's compile rows, read from its files' records in order."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes
        self.interner = Interner()
        self.files: dict[int, str] = {}  # the logs' interned file names ("str" records)
        self.starts: dict[str, list[Frame]] = {}  # compile id -> its frame's stack (dynamo_start)
        self.broke: set[str] = set()
        self.compiles: list[tuple] = []
        self.breaks: list[tuple] = []
        self.recompiles: list[tuple[str, str]] = []  # (compile id, reason): ts and frame from the compile
        self.sites: dict[tuple[str, int], tuple[list[Frame], str]] = {}

    def add(self, meta: dict[str, Any], payload: str) -> None:
        if isinstance(meta.get("str"), list) and len(meta["str"]) == 2:
            self.files[number(meta["str"][1], -1)] = str(meta["str"][0])
        elif isinstance(meta.get("dynamo_start"), dict):
            stack = meta["dynamo_start"].get("stack") or []
            self.starts[_compile_id(meta)] = [
                (self.files.get(number(f.get("filename"), -1), str(f.get("filename"))), str(f.get("name", "")),
                 number(f.get("line"), 0)) for f in reversed(stack) if isinstance(f, dict)]
        elif isinstance(meta.get("compilation_metrics"), dict):
            self._compile(meta["compilation_metrics"], _compile_id(meta))
        elif isinstance(meta.get("artifact"), dict):
            name = meta["artifact"].get("name")
            if name == "dynamo_graph_break_reason":
                self._graph_break(payload, _compile_id(meta))
            elif name == "recompile_reasons":
                try:
                    reasons = json.loads(payload)
                except (ValueError, RecursionError):
                    reasons = [payload]
                for r in reasons if isinstance(reasons, list) else [reasons]:
                    self.recompiles.append((_compile_id(meta), str(r)))

    def _user(self, frames: list[Frame]) -> list[Frame]:
        return [f for f in frames if f[0] and not f[0].startswith(self.prefixes)]

    def _graph_break(self, text: str, cid: str) -> None:
        gb_id, reason, frames, code, site = parse_graph_break(text)
        frames = self._user(frames)
        line = code.get(frames[0], "") if frames else ""
        if site is not None:
            if frames:
                self.sites.setdefault(site, (frames, line))
            else:  # a repeated break, logged without its stack
                frames, line = self.sites.get(site, ([(site[0], "", site[1])], ""))
        self.broke.add(cid)
        self.breaks.append((cid, gb_id, reason, reason_class(reason, source_line=line), frames))

    def _compile(self, cm: dict[str, Any], cid: str) -> None:
        status, reason = compile_status(cm.get("fail_type"), cm.get("fail_reason"), cm.get("graph_op_count"),
                                        cid in self.broke)
        start_us = cm.get("start_time_us")
        start = number(start_us, 0) * 1000 if start_us is not None else int(float(cm.get("start_time") or 0) * 1e9)
        self.compiles.append((
            start, number(cm.get("duration_us"), 0) * 1000, cid, str(cm.get("co_name") or ""),
            str(cm.get("co_filename") or ""), number(cm.get("co_firstlineno"), 0), status, reason,
            number(cm.get("graph_op_count"), 0), number(cm.get("guard_count"), 0), number(cm.get("cache_size"), 0),
            self._user(self.starts.get(cid, []))))

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        s, stack = self.interner.string, self.interner.stack
        when = {c[2]: (c[0], c[3], c[4], c[5]) for c in self.compiles}
        c = self.compiles
        out = {
            "compiles": {
                "ts": np.array([x[0] for x in c], np.int64), "dur": np.array([x[1] for x in c], np.int64),
                "tid": np.zeros(len(c), np.int64), "compile_id": np.array([s(x[2]) for x in c], np.int32),
                "func": np.array([s(x[3]) for x in c], np.int32), "file": np.array([s(x[4]) for x in c], np.int32),
                "line": np.array([x[5] for x in c], np.int32), "backend": np.zeros(len(c), np.int32),
                "status": np.array([s(x[6]) for x in c], np.int32),
                "fail_reason": np.array([s(x[7]) for x in c], np.int32),
                "graph_ops": np.array([x[8] for x in c], np.int32), "guards": np.array([x[9] for x in c], np.int32),
                "cache_size": np.array([x[10] for x in c], np.int32),
                "stack": np.array([stack(x[11]) for x in c], np.int32)},
            "graph_breaks": {
                "ts": np.array([when.get(b[0], (0,))[0] for b in self.breaks], np.int64),
                "compile_id": np.array([s(b[0]) for b in self.breaks], np.int32),
                "gb_id": np.array([s(b[1]) for b in self.breaks], np.int32),
                "reason": np.array([s(b[2]) for b in self.breaks], np.int32),
                "reason_class": np.array([s(b[3]) for b in self.breaks], np.int32),
                "stack": np.array([stack(b[4]) for b in self.breaks], np.int32)},
            "recompiles": {
                "ts": np.array([when.get(cid, (0,))[0] for cid, _ in self.recompiles], np.int64),
                "compile_id": np.array([s(cid) for cid, _ in self.recompiles], np.int32),
                "func": np.array([s("{1} ({2}:{3})".format(*when[cid]) if cid in when else "")
                                  for cid, _ in self.recompiles], np.int32),
                "reason": np.array([s(r) for _, r in self.recompiles], np.int32)},
        }
        return {**self.interner.take_new(), **{k: v for k, v in out.items() if len(v["ts"])}}


def import_torch_trace(folder: str | os.PathLike, run_dir: str | os.PathLike) -> dict[int, dict[str, int]]:
    """Write the compile logs of ``folder`` into the new run ``run_dir``; per rank, the rows of
    each table written."""
    folder, run_dir = Path(folder), Path(run_dir)
    check_new(run_dir)
    logs = sorted(folder.glob(LOG_GLOB))
    if not logs:
        raise NeuronProfError(f"{folder}: no {LOG_GLOB} in it; run the job with TORCH_TRACE={folder} first")
    prefixes = tuple(framework_prefixes())
    ranks: dict[int, _Rank] = defaultdict(lambda: _Rank(prefixes))
    for path in logs:
        recs = records(path)
        rank = next((number(m["rank"], 0) for m, _ in recs if "rank" in m), 0)
        for meta, payload in recs:
            try:
                ranks[rank].add(meta, payload)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                continue  # one odd record must not lose the others
    if not any(r.compiles or r.breaks for r in ranks.values()):
        raise NeuronProfError(f"{folder}: its logs hold no compile (no compilation_metrics record); "
                              "did the job call torch.compile?")
    run = ImportedRun(run_dir, folder, "TORCH_TRACE", world_size=max(ranks) + 1)
    run.write_meta()
    written: dict[int, dict[str, int]] = {}
    for rank, r in sorted(ranks.items()):
        writer = run.rank(rank, min((c[0] for c in r.compiles), default=0))
        tables = r.tables()
        for table, cols in tables.items():
            writer.append(table, cols)
        writer.close(0, {"dropped": {}, "written": {}, "cap_reached_at_step": None})
        written[rank] = {t: len(tables[t]["ts"]) for t in ("compiles", "graph_breaks", "recompiles") if t in tables}
    return written
