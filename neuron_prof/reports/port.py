"""``neuron-prof port-check``'s document: what a run's code and ops need to move to a target
backend, as text or JSON.

What the code calls: the user's source files that the run's op stacks name are read (wherever
they are now: a file moved or changed since the run is named, never a crash) and scanned for
CUDA-only call sites (``analysis.port.call_sites``); a site "ran" if one of its lines is in the
run's stacks. What the ops need: every op the run executed outside torch.compile's compiles is
asked of the target's dispatcher (``op_support.op_paths``), and the ops that fall back to the CPU
are priced by their run-time self time (``RunAnalysis.op_compile.run_self_ns``). What waits: the
host reads of tensor values the run made (``analysis.sync``: ``.item()``, ``bool()``, a copy to the
host ...), each a wait for the target's queue, by line with its count per step.

These files are the user's code, outside the run: they are read as the run's own files are
(``safefile``: regular files only, a symbolic link not followed, at most ``SOURCE_LIMIT`` bytes),
and nothing of them but the call sites' code is shown.
"""
from __future__ import annotations

import io
import os
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from neuron_prof.analysis.port import SITE_COLUMNS, SITE_KINDS, call_sites, mark_ran, op_costs, verdict
from neuron_prof.reports.records import records
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.analysis.sync import sync_summary
from neuron_prof.errors import NeuronProfError
from neuron_prof.backends.op_support import PATHS, Target, op_paths
from neuron_prof.paths import is_user_file
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import read_whole
from neuron_prof.reports.table import aligned

SOURCE_LIMIT = 16 << 20
"""A source file larger than this is not read (no hand-written module is)."""
SHOWN = 3
"""Lines of an op shown in the text (--json has them all)."""
READ_COLUMNS = ["source", "name", "kind", "count", "in_steps", "per_step"]
INDENT = "  "
"""The text's tables stand under their headings."""


@dataclass(frozen=True)
class PortCheck:
    """A run's porting inventory for one target."""

    run: str
    target: str
    verdict: str
    call_sites: pd.DataFrame
    """file (full path), line, end_line, kind (``analysis.port.SITE_KINDS``), text, ran."""
    files: pd.DataFrame
    """The user's files in the run's stacks: file, read (its call sites are in ``call_sites``),
    note (why it was not read, or that it changed since the run)."""
    ops: pd.DataFrame
    """Every op the run executed: ``op_support.op_paths``'s op, path, cpu_overloads."""
    fallbacks: pd.DataFrame
    """The ops that fall back to the CPU on the target: ``analysis.port.op_costs``."""
    mixed: pd.DataFrame
    """The ops that fall back for some of their overloads: ``op_costs`` with cpu_overloads."""
    no_kernel: pd.DataFrame
    """Ops outside aten with no kernel for the target: op, path."""
    unknown: list[str]
    """Op names this process has not registered (custom ops whose module is not imported)."""
    host_reads: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=READ_COLUMNS))
    """The run's host reads of tensor values, each a wait on the target: ``analysis.sync.sync_summary``'s
    :data:`READ_COLUMNS` (``per_step`` over the ``read_basis`` steps). Empty: none."""
    read_basis: str = "none"
    """The steps ``per_step`` is over (``analysis.steps.Basis.kind``: steady, all, none)."""


def port_check(run: Run, target: Target) -> PortCheck:
    """``run``'s porting inventory for ``target``, a backend registered in this process; a run
    that captured no op cannot be checked (a NeuronProfError)."""
    if run.ops.empty:
        raise NeuronProfError(f"{run.path}: no op was captured (the eager collector was off, or no step was "
                              "captured in detail); record the job with the eager collector to check it")
    analysis = analyze(run)
    compiled = analysis.op_compile
    ran = ~compiled.inside  # ops run while compiling were traced, not run
    executed, self_ns = run.ops.loc[ran, ["name", "user_source"]], compiled.run_self_ns[ran]
    paths = op_paths([str(name) for name in executed["name"].unique()], target)
    costs = {path: op_costs(executed, self_ns, set(paths.loc[paths["path"] == path, "op"]))
             for path in ("cpu", "mixed")}
    mixed = costs["mixed"].merge(paths[["op", "cpu_overloads"]], on="op")
    custom = paths[~paths["op"].str.startswith("aten::")]
    no_kernel = custom[custom["path"].isin(["device", "host", "cpu", "mixed", "missing"])][["op", "path"]]
    unknown = sorted(custom.loc[custom["path"] == "unknown", "op"])
    sites, files = _sites(run)
    reads = sync_summary(analysis.op_time.sync_points, analysis.op_basis.steps)
    return PortCheck(str(run.path), target.device,
                     verdict(len(sites), costs["cpu"], len(no_kernel), len(unknown), target.device),
                     sites, files, paths, costs["cpu"], mixed, no_kernel.reset_index(drop=True), unknown,
                     reads[READ_COLUMNS], analysis.op_basis.kind)


def _sites(run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The call sites in the user's files that the run's op stacks name, and those files."""
    lines: dict[str, set[int]] = defaultdict(set)
    ops = run.ops
    for rank, stack in ops[["rank", "stack"]].drop_duplicates().itertuples(index=False):
        for file, _, line in run.stack(int(rank), int(stack)):
            if is_user_file(file):
                lines[file].add(line)
    cwd, started = run.meta.get("cwd"), run.meta.get("start_time_ns")
    found, files = [], []
    for file in sorted(lines):
        path = _located(file, cwd)
        try:
            sites, changed = _read_sites(path, started)
        except NeuronProfError as exc:
            files.append((file, False, str(exc)))
            continue
        files.append((file, True, "changed since the run: its lines may have moved" if changed else ""))
        found.append(mark_ran(sites, lines[file]).assign(file=file))
    columns = ["file", *SITE_COLUMNS, "ran"]
    sites = pd.concat(found, ignore_index=True)[columns] if found else pd.DataFrame(columns=columns)
    return sites, pd.DataFrame(files, columns=["file", "read", "note"])


def _located(file: str, cwd: str | None) -> str:
    """Where a file of the run's stacks is: a relative path (an imported torch.profiler trace's,
    a job started with a relative script path) from the run's working directory, else from this
    process's."""
    if os.path.isabs(file) or not cwd or file.startswith("<"):
        return file
    in_run = os.path.join(cwd, file)
    return file if not os.path.lexists(in_run) and os.path.lexists(file) else in_run


def _read_sites(path: str, started: int | None) -> tuple[pd.DataFrame, bool]:
    """A source file's call sites, and whether it changed after the run started; a
    NeuronProfError naming the file where it cannot be read as Python."""
    if path.startswith("<"):  # <string>, <stdin>, a notebook cell: code with no file
        raise NeuronProfError(f"{path}: not a file (code run from a string or a prompt)")
    try:
        data = read_whole(path, SOURCE_LIMIT)
        changed = started is not None and os.stat(path).st_mtime_ns > started
    except FileNotFoundError:
        raise NeuronProfError(f"{path}: not found (moved or deleted since the run?)") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return call_sites(data.decode(encoding)), changed
    except (SyntaxError, UnicodeDecodeError, LookupError, ValueError) as exc:
        raise NeuronProfError(f"{path}: not Python source this Python reads ({exc})") from None


def to_json(check: PortCheck) -> dict[str, Any]:
    """The check as JSON-ready values (``port-check --json``)."""
    return {"run": check.run, "target": check.target, "verdict": check.verdict,
            "call_sites": records(check.call_sites), "files": records(check.files),
            "ops_checked": len(check.ops), "fallbacks": records(check.fallbacks), "mixed": records(check.mixed),
            "no_kernel": records(check.no_kernel), "unknown": check.unknown,
            "host_reads": records(check.host_reads), "read_basis": check.read_basis,
            "ops": records(check.ops)}


def render_text(check: PortCheck, display_path=lambda p: p) -> str:
    """The check as ``port-check`` prints it; ``display_path``: how a file is shown
    (``Run.display_path``)."""
    device = check.target
    out = [f"neuron_prof port-check {check.run} --target {device}", f"  {check.verdict}", ""]
    read = check.files[check.files["read"]]
    out.append(f"What the code calls ({len(read)} of {len(check.files)} source files in the run's stacks read; "
               "ran: the site's line is in them)")
    sites = check.call_sites
    if len(sites):
        rows = [[f"{display_path(s.file)}:{s.line}", s.kind, "yes" if s.ran else "no", s.text]
                for s in sites.itertuples()]
        out += aligned(["line", "kind", "ran", "code"], rows, indent=INDENT)
        out += ["", "  what to change:"]
        out += [f"    {kind}: {SITE_KINDS[kind].format(device=device)}" for kind in sorted(set(sites["kind"]))]
    else:
        out.append("  no CUDA-only call site")
    for f in check.files.itertuples():
        if not f.read:
            out.append(f"  not read: {f.note}")  # the note names the file
        elif f.note:
            out.append(f"  note: {display_path(f.file)}: {f.note}")
    out += ["", f"What the ops need on {device} ({len(check.ops)} ops checked through the dispatcher)"]
    if len(check.fallbacks):
        out.append("  ops that fall back to the CPU (each call waits for the device and copies its tensors both ways):")
        out += aligned(["op", "calls", "self ms", "% of op time", "lines"], _cost_rows(check.fallbacks),
                       right=(1, 2, 3), indent=INDENT)
    else:
        out.append("  no op falls back to the CPU")
    if len(check.mixed):
        out.append("  ops that fall back for some overloads (which one ran, a run does not record):")
        rows = [row[:4] + [", ".join(overloads)]
                for row, overloads in zip(_cost_rows(check.mixed), check.mixed["cpu_overloads"])]
        out += aligned(["op", "calls", "self ms", "% of op time", "overloads that fall back"], rows, right=(1, 2, 3),
                       indent=INDENT)
    if len(check.no_kernel):
        out.append(f"  custom ops without a {device} kernel:")
        out += aligned(["op", f"on {device}"], [[r.op, PATHS[r.path]] for r in check.no_kernel.itertuples()],
                       indent=INDENT)
    if check.unknown:
        out.append(f"  not registered in this process (--import the module that registers them): "
                   f"{', '.join(check.unknown)}")
    out += _reads_text(check)
    return "\n".join(out) + "\n"


def _reads_text(check: PortCheck) -> list[str]:
    """The host reads of tensor values, each of which waits for the target's queue to reach it."""
    reads = check.host_reads
    out = ["", f"What would wait on {check.target} ({int(reads['count'].sum()) if len(reads) else 0} host reads of "
               f"tensor values: the host stops at each until {check.target} has computed the value)"]
    if not len(reads):
        return out + ["  none"]
    rows = [[r.source or "?", r.name, str(r.count), "-" if r.per_step is None else f"{r.per_step:.1f}",
             str(r.count - r.in_steps)] for r in reads.itertuples()]
    out += aligned(["line", "op", "count", "/step", "elsewhere"], rows, right=(2, 3, 4), indent=INDENT)
    per = {"steady": "per steady step", "all": "per step (no steady step: over all)"}.get(check.read_basis,
                                                                                         "no step completed")
    return out + [f"  (/step: {per}; elsewhere: start-up, warm-up steps or set-up; a read moved out of the loop, or "
                  "made less often, waits less)"]


def _cost_rows(costs: pd.DataFrame) -> list[list[str]]:
    return [[r.op, str(r.calls), f"{r.self_ns / 1e6:.3f}", f"{r.pct:.1f}",
             ", ".join(r.lines[:SHOWN]) + (f" (+{len(r.lines) - SHOWN})" if len(r.lines) > SHOWN else "")]
            for r in costs.itertuples()]

