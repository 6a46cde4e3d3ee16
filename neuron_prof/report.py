"""The run summary behind ``neuron-prof report``: one dict (``--json``) and its text rendering."""
from __future__ import annotations

import datetime as _dt
from typing import Any

import pandas as pd

from neuron_prof.analysis import collectives as colls
from neuron_prof.analysis import compile as comp
from neuron_prof.analysis import device as dev
from neuron_prof.analysis import memory as mem
from neuron_prof.analysis import metrics as scalars
from neuron_prof.analysis.ops import (comm_ops, in_steps, op_stats, phase_time, run_time_ops, run_time_rows,
                                     step_phases)
from neuron_prof.analysis.records import records as _records
from neuron_prof.analysis.steps import PHASES, TIME_KINDS, basis_steps, step_breakdown, step_stats, time_split
from neuron_prof.analysis.sync import sync_points, sync_summary
from neuron_prof.findings import (called_from, detail_cut_text, findings, in_flight_text, process_note, ranks_text, steps_text,
                                  straggler_text, user_line)
from neuron_prof.reader import describe_exit
from neuron_prof.run import Run
from neuron_prof.units import format_bytes

TOP_N = 10
STEP_NUMBERING = ("steps count from 0: step N ends at the (N+1)-th step boundary, a prof.step() call or, under "
                  "`record` and auto_step, the (N+1)-th return of the training optimizer's step() (Hugging Face "
                  "Trainer's global_step N+1)")


def run_op_stats(run: Run, by: tuple[str, ...] = ("name", "module")) -> pd.DataFrame:
    """``op_stats`` over the run-time ops of the steady captured steps (compile time and ops run
    while compiling left out), with ``self_ms_per_step`` when there is such a step."""
    scope, _, n_scope = basis_steps(run.step_kinds, captured_only=True)
    keep = run_time_rows(run.ops, run.op_compile[0], scope)
    columns = tuple(dict.fromkeys((*by, "bwd")))
    stats = op_stats(run_time_ops(run.ops, keep, run.op_compile[1], run.op_run_self_ns, columns), by)
    if n_scope:
        stats["self_ms_per_step"] = stats["self_ms"] / n_scope
    return stats


def summarize(run: Run, top: int = TOP_N) -> dict[str, Any]:
    """Everything the report shows, JSON-ready. Step statistics describe the steady steps (not the
    first step of a rank, not steps in which torch.compile compiled: ``analysis.steps``); op,
    sync and graph figures per step are over the steady captured steps, with compile time and
    compile-time ops left out."""
    meta = run.meta
    kinds = run.step_kinds
    ops = run.ops
    scope, basis, n_scope = basis_steps(kinds, captured_only=True)
    keep = run_time_rows(ops, run.op_compile[0], scope)
    inside, compile_ns = run.op_compile
    stats = run_op_stats(run).head(top)
    top_level = run_time_ops(ops, keep, compile_ns, run.op_run_self_ns, top_level=True)
    phase_ns = phase_time(ops, step_phases(ops, run.op_parent), run.op_run_self_ns, keep)
    sync = sync_points(ops, run.op_parent, exclude=run.op_compile[0])
    flushes = run.queue_flushes
    measured = run.device_kernels.size or flushes.size or run.fallbacks.size
    sync_waits = dev.sync_waits(sync, flushes) if measured else None
    runs = comp.region_runs(ops, run.op_parent, run.op_compile[1])
    scope_runs = runs[in_steps(runs, scope)] if len(runs) else runs
    sites = comp.graph_break_sites(run.graph_breaks, scope_runs, n_scope)
    recompiles = comp.recompile_summary(run.recompiles, run.compiles)
    ctime = comp.compile_time(run.compiles, run.compile_phases)
    warmup = kinds[kinds["warmup"]]
    spans = run.spans
    startup = spans[spans["name"].astype(str) == "start-up"]
    collectives = colls.summary(run)
    exposed = run.collective_overlap if collectives["captured"] else None
    return {
        "run": {
            "path": str(run.path), "command": meta.get("command"), "torch_version": meta.get("torch_version"),
            "device": meta.get("device"), "world_size": meta.get("world_size"), "ranks": run.ranks,
            "start_time": (_dt.datetime.fromtimestamp(meta["start_time_ns"] / 1e9, _dt.timezone.utc).isoformat()
                           if meta.get("start_time_ns") else None),
            "step_numbering": STEP_NUMBERING,
        },
        "startup": [{"rank": int(r), "ms": float(d / 1e6)} for r, d in zip(startup["rank"], startup["dur"])],
        "steps": _records(step_stats(kinds)),
        "warmup_steps": _records(warmup.assign(step_ms=warmup["dur"] / 1e6, compile_ms=warmup["compile_ns"] / 1e6)
                                 [["rank", "step", "step_ms", "compile_ms"]]),
        "step_breakdown": _records(step_breakdown(top_level, scope, phase_ns)),
        "time_split": _records(time_split(top_level, scope, sync, comm_ops(ops, run.op_parent, keep, compile_ns),
                                          exposed, flushes if measured else None)),
        "ops": {"captured_steps": n_scope, "basis": basis, "events": int(len(ops)),
                "compile_events": int(inside.sum()), "top_by_self_time": _records(stats)},
        "sync_points": {"events": int(len(sync)), "waits_measured": bool(measured),
                        "by_source": _records(sync_summary(sync, scope, sync_waits))},
        "device": _device(run, kinds, scope, basis, top) if measured else {"captured": False},
        "compile": {
            "frames_compiled": int(len(run.compiles)),
            "compile_ms": float((run.compile_spans["end"] - run.compile_spans["ts"]).sum() / 1e6),
            "compile_in_steps_ms": float(kinds["compile_ns"].sum() / 1e6),
            "graph_breaks": int(len(sites)),
            "graph_break_events": int(len(run.graph_breaks)),
            "recompiles": int(recompiles["recompiles"].sum()) if len(recompiles) else 0,
            "cache_limit_hit": bool(recompiles["cache_limit_hit"].any()) if len(recompiles) else False,
            "break_sites": _records(sites),
            "recompiles_by_frame": _records(recompiles),
            "compile_time": _records(ctime.head(top)),
            "cache": _records(comp.cache_stats(run.compile_cache)),
            "top_fusions": _records(comp.top_fusions(run.fusions, top)),
            "graph_runs": _records(comp.graph_runs(scope_runs, n_scope).head(top)),
        },
        "memory": _memory(run, top),
        "collectives": collectives,
        "metrics": _records(scalars.summary(run.metrics)),
        "dumps": _dumps(run),
        "health": {
            "ranks": _records(run.health),
            "detail_cuts": _detail_cuts(run),
            "failures": _records(run.failures[["rank", "collector", "message"]]) if len(run.failures) else [],
            "stale_rank_dirs": [str(d) for d in run.stale_rank_dirs],
            "missing_ranks": run.missing_ranks,
            "conflicts": _records(run.conflicts),
            "command_exit": meta.get("exit"),  # record's runs: {"code": N} or {"signal": N}
        },
    }


def _dumps(run: Run) -> list[dict[str, Any]]:
    """Always-on dumps, one per (rank, time), with each thread they name and where it was."""
    out = []
    for (rank, ts), rows in run.dumps.groupby(["rank", "ts"], sort=True):
        first = rows.iloc[0]
        out.append({"rank": int(rank), "reason": str(first["reason"]), "first_step": int(first["first_step"]),
                    "last_step": int(first["last_step"]),
                    "threads": [{"tid": int(t), "source": str(src), "stack": str(full)}
                                for t, src, full in zip(rows["tid"], rows["user_source"], rows["source_full"])]})
    return out


def _render_metrics(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", "Training scalars (per step: loss is the scalar backward() ran on; neuron_prof.log adds more)"]
    out += _table(rows, [("rank", "rank", "d"), ("name", "name", ""), ("steps", "steps", "d"),
                         ("first", "first", ".6g"), ("last", "last", ".6g"), ("min", "min", ".6g"),
                         ("max", "max", ".6g")])
    return out


def _render_dumps(dumps: list[dict[str, Any]]) -> list[str]:
    if not dumps:
        return []
    out = ["", "Always-on dumps (the detail of these steps is in the run)"]
    for d in dumps:
        out.append(f"  rank {d['rank']}, steps {d['first_step']}-{d['last_step']}: {d['reason']}")
        for t in d["threads"]:
            out.append(f"    thread {t['tid']} at {t['source'] or '(no Python frame of yours)'}")
    return out


STEPS_SHOWN = 12
"""Steps listed in the Device section's text (the --json lists every complete step)."""


def _device(run: Run, kinds: pd.DataFrame, scope: pd.DataFrame, basis: str, top: int) -> dict[str, Any]:
    """The Device section: per step what bounded it, the host's waits by line, fusion, fallbacks
    and coverage (``analysis.device``); per-step figures over the steady captured steps."""
    kernels, corr = run.device_kernels, run.device_correlation
    verdicts = dev.step_verdicts(run.device_steps)
    if len(verdicts):
        flags = kinds.set_index(["rank", "step"])[["warmup", "steady"]]
        verdicts = verdicts.join(flags, on=["rank", "step"])
    return {
        "captured": True, "basis": basis, "basis_steps": int(scope.groupby("rank").size().max()) if len(scope) else 0,
        "thresholds": {"device_bound_busy_pct": 100 * dev.DEVICE_BOUND_BUSY,
                       "host_bound_busy_pct": 100 * dev.HOST_BOUND_BUSY,
                       "host_bound_wait_pct": 100 * dev.HOST_BOUND_WAIT},
        "verdict": _records(dev.verdict_summary(verdicts, scope)),
        "steps": _records(verdicts.assign(dur_ms=verdicts["dur"] / 1e6, busy_ms=verdicts["busy_ns"] / 1e6,
                                          idle_ms=verdicts["idle_ns"] / 1e6, wait_ms=verdicts["wait_ns"] / 1e6)
                          .drop(columns=["dur", "busy_ns", "idle_ns", "wait_ns"])) if len(verdicts) else [],
        "stalls": _records(dev.stalls(run.queue_flushes, scope)),
        "top_kernels": _records(dev.top_kernels(kernels, corr, scope, top)),
        "fusion": _records(dev.fusion(kernels)),
        "unfused": _records(dev.unfused_sequences(kernels, corr, scope, top)),
        "fallbacks": _records(dev.fallback_summary(run.fallbacks, scope)),
        "coverage": _records(dev.coverage(run.device_enqueues, run.fallbacks)),
    }


def _render_device(d: dict[str, Any]) -> list[str]:
    """The Device section: nothing for a run on a device that reports no queue."""
    if not d["captured"]:
        return []
    over = f"{d['basis_steps']} {_basis_name(d['basis'])} captured steps"
    heads = ", ".join(f"rank {f['rank']} {f['device']}: {f['kernels']} kernels running {f['ops']} ops"
                      for f in d["fusion"]) or "no kernel reported"
    out = ["", f"Device ({heads}; per-step figures over {over})"]
    t = d["thresholds"]
    for v in d["verdict"]:
        out.append(f"  rank {v['rank']}: {v['steps']} {v['verdict']} step{'s' if v['steps'] != 1 else ''} ({100 * v['share']:.0f}%): step "
                   f"{v['step_ms']:.2f} ms, {v['device']} busy {v['busy_ms']:.2f} ms ({v['busy_pct']:.0f}%), idle "
                   f"{v['idle_ms']:.2f} ms, the host waiting for it {v['wait_ms']:.2f} ms ({v['wait_pct']:.0f}%)")
    out.append(f"  (device-bound: the busiest device runs kernels {t['device_bound_busy_pct']:.0f}% of the step or "
               f"more; host-bound: it is busy under {t['host_bound_busy_pct']:.0f}% while the host waits under "
               f"{t['host_bound_wait_pct']:.0f}%: the device waits for work; else balanced)")
    shown = d["steps"] if len(d["steps"]) <= STEPS_SHOWN else \
        sorted(d["steps"], key=lambda x: -x["dur_ms"])[:STEPS_SHOWN]
    if shown:
        rows = [{**x, "kind": "warm-up" if x.get("warmup") else ""} for x in sorted(shown, key=lambda x: (x["rank"], x["step"]))]
        out += _table(rows, [("rank", "rank", ""), ("step", "step", ""), ("kind", "", ""), ("device", "device", ""),
                             ("verdict", "verdict", ""), ("dur_ms", "step ms", ".2f"), ("busy_ms", "busy ms", ".2f"),
                             ("busy_pct", "%", ".0f"), ("idle_ms", "idle ms", ".2f"), ("wait_ms", "host waits ms", ".2f"),
                             ("wait_pct", "%", ".0f")])
        if len(d["steps"]) > len(shown):
            out.append(f"  (the {len(shown)} longest of {len(d['steps'])} steps; --json lists all)")
    out.append("  Stalls: the host waiting for the device, by the line that waited")
    if d["stalls"]:
        rows = [{**x, "source": x["source"] or "(outside any op)"} for x in _most(d["stalls"], "total_ms")]
        out += _table(rows, [("rank", "rank", ""), ("source", "source line", ""), *_called_from(rows),
                             ("host_op", "op", ""), ("reason", "why", ""), ("device", "device", ""), ("count", "waits", "d"),
                             ("per_step_ms", "ms/step", ".3f"), ("mean_ms", "mean ms", ".3f"),
                             ("max_ms", "max ms", ".3f"), ("total_ms", "total ms", ".3f"), ("ops", "ops waited for", "d")])
        out.append("  (why: sync = the host needs a value; size = the queue was full; fallback = a CPU fallback "
                   "needs the inputs; synchronize = torch.<device>.synchronize()" + _more(d["stalls"]) + ")")
    else:
        out.append("  none: the host never waited for a queued op")
    if d["top_kernels"]:
        out.append("  Top kernels by device time (source: the line that queued the longest one's first op)")
        out += _table(d["top_kernels"], [("rank", "rank", ""), ("device", "device", ""), ("name", "kernel", ""),
                                         ("kernels", "runs", "d"), ("ops", "ops", "d"),
                                         ("per_step_ms", "ms/step", ".3f"), ("mean_us", "mean us", ".1f"),
                                         ("pct", "% busy", ".1f"), ("total_ms", "total ms", ".2f"),
                                         ("source", "source line", "")])
    for f in d["fusion"]:
        out.append(f"  Fusion on rank {f['rank']} {f['device']}: {f['ops_per_kernel']:.2f} ops per kernel, "
                   f"{f['one_op_pct']:.0f}% of kernels ran one op; launch cost at most {f['launch_pct']:.0f}% of "
                   f"{f['busy_ms']:.1f} ms busy ({f['kernels']} kernels x the shortest, {f['launch_floor_us']:.1f} us)")
    if d["unfused"]:
        out.append(f"  Unfused runs ({dev.UNFUSED_MIN_RUN}+ one-op kernels in a row; where torch.compile(backend=...) "
                   "or a custom kernel would save launches)")
        rows = [{**x, "where": x["source"] + (f" .. {x['last_source']}" if x["last_source"] != x["source"] else "")}
                for x in d["unfused"]]
        out += _table(rows, [("where", "source lines", ""), ("kernels", "kernels", ""),
                             ("occurrences", "times", "d"), ("per_step", "/step", ".1f"),
                             ("total_kernels", "kernels", "d"), ("total_ms", "device ms", ".2f"),
                             ("launch_ms", "launch ms (at most)", ".2f")])
    cov = ", ".join(f"rank {c['rank']} {c['device']} {c['coverage_pct']:.1f}% of {c['native_ops'] + c['fallback_ops']}"
                    for c in d["coverage"])
    out.append(f"  CPU fallbacks (coverage: the share of device ops run natively: {cov})")
    if d["fallbacks"]:
        rows = [{**x, "lines": ", ".join(x["sources"][:3]) + (" ..." if len(x["sources"]) > 3 else ""),
                 "to_host": format_bytes(x["bytes_to_host"]), "from_host": format_bytes(x["bytes_from_host"])}
                for x in _most(d["fallbacks"], "total_ms")]
        out += _table(rows, [("rank", "rank", ""), ("op", "op", ""), ("device", "device", ""),
                             ("lines", "source lines", ""),
                             ("calls", "calls", "d"), ("calls_per_step", "/step", ".1f"),
                             ("to_host", "to host", ""), ("from_host", "from host", ""),
                             ("per_step_ms", "ms/step", ".3f"), ("total_ms", "total ms", ".3f")])
        out.append("  (bytes over the run: inputs copied off the device, results copied back; time includes the copies"
                   + _more(d["fallbacks"]) + ")")
    else:
        out.append("  none: every op ran on the device")
    return out


def _detail_cuts(run: Run) -> list[dict[str, Any]]:
    """Per rank whose budget ended detail capture (``max_bytes`` or ``max_events``, the session's
    ``detail_cut``): the last step captured in detail, seconds from capture start, bytes on disk
    then, the limit, the tables it stopped and how many later steps ran without them."""
    out = []
    steps = run.steps
    for rd in run.rank_data:
        cut = rd.last_commit.get("detail_cut")  # its fields checked by the reader (documents.COMMIT)
        if cut is None:
            continue
        start = rd.meta.get("start_ns")
        later = steps[(steps["rank"] == rd.rank) & (steps["step"] > cut["step"]) & steps["complete"]]
        out.append({"rank": rd.rank, "step": cut["step"], "bytes": cut["bytes"], "by": cut["by"],
                    "limit": cut["limit"], "tables": cut["tables"], "later_steps": int(len(later)),
                    "t_s": (cut["ts"] - start) / 1e9 if start is not None else None})
    return out


def _memory(run: Run, top: int) -> dict[str, Any]:
    """Peak per device with what made it, growth per step (of the tracked bytes per device and of
    the process's resident memory), leak findings, OOMs."""
    ms = run.memory_steps
    if ms.empty and run.memory_events.empty:
        return {"captured": False}
    allocs = run.memory_allocations
    peaks = run.memory_peaks
    devices = []
    for _, g in mem.growth(ms).iterrows():
        d = {"rank": int(g["rank"]), "device": g["device"], "live_first": int(g["first"]), "live_last": int(g["last"]),
             "growth_per_step": float(g["growth_per_step"]), "boundaries": int(g["boundaries"]),
             "peak_between_boundaries": int(ms[(ms["rank"] == g["rank"]) & (ms["device"].astype(str) == g["device"])]
                                            ["peak"].max())}
        p = peaks[(peaks["rank"] == g["rank"]) & (peaks["device"].astype(str) == g["device"])]
        if len(p):
            best = p.loc[p["bytes"].idxmax()]
            d["peak"] = {k: (best[k].item() if hasattr(best[k], "item") else best[k])
                         for k in ("step", "bytes", "op", "source", "user_source", "module", "alloc_bytes", "category")}
            d["peak_by_category"] = _records(mem.snapshot(allocs, int(best["ts"]), "category", int(g["rank"]),
                                                          g["device"]))
            d["peak_sites"] = _records(mem.peak_sites(allocs, int(g["rank"]), g["device"], int(best["ts"]), top))
        devices.append(d)
    return {"captured": True, "devices": devices,
            "process": _records(mem.process_growth(run.process_memory, run.steps)),
            "leaks": _records(run.memory_leaks),
            "ooms": _records(run.memory_ooms[["rank", "step", "device", "bytes", "message"]])
            if len(run.memory_ooms) else []}


def _render_memory(m: dict[str, Any]) -> list[str]:
    if not m["captured"]:
        return ["", "Memory", "  not captured (the `memory` collector was off; it is on by default)"]
    out = ["", "Memory (bytes allocated since capture began, per device)"]
    for d in m["devices"]:
        out.append(f"  rank {d['rank']} {d['device']}: live {format_bytes(d['live_first'])} -> "
                   f"{format_bytes(d['live_last'])} over "
                   f"{d['boundaries']} step boundaries ({format_bytes(d['growth_per_step'])}/step), "
                   f"highest peak between boundaries {format_bytes(d['peak_between_boundaries'])}")
        p = d.get("peak")
        if p:
            out.append(f"  peak of the captured steps: {format_bytes(p['bytes'])} in step {p['step']}, reached with "
                       f"{format_bytes(p['alloc_bytes'])} from {p['op'] or '?'} at {p['source'] or '?'}"
                       + called_from(p) + (f" ({p['module']})" if p["module"] else "") + f" [{p['category']}]")
            out.append("    by category: " + ", ".join(f"{c['category']} {format_bytes(c['bytes'])}"
                                                   for c in d["peak_by_category"]))
            sites = [{**x, "size": format_bytes(x["bytes"]), "module": x["module"] or "-", "source": x["source"] or "?"}
                     for x in d["peak_sites"]]
            cols = [("source", "live at the peak: source line", ""), *_called_from(sites), ("module", "module", ""),
                    ("op", "op", ""), ("category", "category", ""), ("blocks", "blocks", "d"), ("size", "bytes", "")]
            out += ["  " + line for line in _table(sites, cols)]
    for x in m.get("process", []):
        per_step = (f"{format_bytes(x['growth_per_step'])}/step over {x['judged']} boundaries of steps not captured"
                    if x["growth_per_step"] is not None else
                    "growth not judged: the capture's own buffers move it in captured steps; capture fewer steps "
                    "(--schedule) to judge it")
        out.append(f"  rank {x['rank']} process resident memory (RSS): {format_bytes(x['first'])} -> "
                   f"{format_bytes(x['last'])} over {x['boundaries']} step boundaries, {per_step}")
    if m["leaks"]:
        by_dev: dict[tuple, list] = {}
        for x in m["leaks"]:
            by_dev.setdefault((x["rank"], x["device"]), []).append(x)
        for (rank, device), rows in by_dev.items():
            x = rows[0]
            out.append(f"  !! LEAK on rank {rank} {device}: +{format_bytes(x['growth_per_step'])} per step "
                       f"(grew in {x['steps_growing']} of the step boundaries checked), confidence {x['confidence']:.2f}")
            if process_note(x):
                out.append(f"     {process_note(x)}")
            sites = [{**r, "size": format_bytes(r["bytes_per_step"]), "seen": f"{r['steps_seen']}/{r['steps_checked']}",
                      "module": r["module"] or "-", "graph": "yes" if r["grad"] else ""}
                     for r in rows if r["source"] or r["op"]]
            cols = [("source", "surviving allocations from", ""), *_called_from(sites), ("module", "module", ""),
                    ("op", "op", ""), ("category", "category", ""), ("graph", "autograd graph", ""),
                    ("size", "bytes/step", ""), ("blocks_per_step", "blocks/step", "d"), ("seen", "steps", "")]
            out += ["  " + line for line in _table(sites, cols)]
    else:
        out.append("  no leak: live memory does not grow step over step")
    for o in m["ooms"]:
        out.append(f"  !! OUT OF MEMORY on rank {o['rank']} {o['device']} in step {o['step']}: {o['message']}")
    return out


def _render_collectives(c: dict[str, Any], world_size: int | None) -> list[str]:
    """The Collectives section: nothing for a single-process run without collectives."""
    if not c["captured"]:
        if max(c["ranks"], world_size or 1) < 2:
            return []
        return ["", "Collectives", "  not captured (the `collectives` collector records them once "
                "torch.distributed's process group is initialised; it is on by default)"]
    shown = c["groups"][:GROUPS_SHOWN]
    groups = "; ".join(f"group {g['group']} {g['desc']} ({g['backend']}, ranks {ranks_text(g['ranks'])})"
                       for g in shown)
    if len(c["groups"]) > len(shown):
        groups += f"; {len(c['groups']) - len(shown)} more groups (--json lists them)"
    out = ["", f"Collectives ({c['collectives']} collectives, {c['calls']} calls on {c['ranks']} ranks; {groups})"]
    out.append("  " + _clock_text(c["clock"]))
    rows = [{**x, "size": format_bytes(x["bytes"])} for x in _most(c["by_op"], "time_ms_per_rank")]
    out += _table(rows, [("group", "group", ""), ("op", "op", ""), ("collectives", "collectives", "d"),
                         ("per_step", "/steady step", ".1f"), ("size", "bytes/rank", ""),
                         ("time_ms_per_rank", "ms/rank", ".2f"), ("wait_ms_per_rank", "wait ms/rank", ".2f")])
    out.append("  (ms/rank: issue to completion, summed over the run, mean over ranks; wait: waiting for the "
               "last rank to arrive" + _more(c["by_op"]) + ")")
    out.append(f"  Stragglers over {c['steady_steps']} steady steps (significant: a step's straggler made the "
               f"others wait {c['threshold_ms']:.1f} ms or more: at least {colls.SHARE:.0%} of the median step, and "
               "above the run's noise unless late in every step)")
    if c["stragglers"]:
        rows = [{**x, "caused_ms": x["wait_caused_ns"] / 1e6, "waited_ms": x["waited_ns"] / 1e6,
                 "pct": 100 * (x["share"] or 0), "in_steps": steps_text(x["steps"]) if x["steps"] else "-"}
                for x in c["stragglers"][:ROWS_SHOWN]]
        out += _table(rows, [("rank", "rank", ""), ("times_last", "last (significant)", "d"),
                             ("caused_ms", "made others wait ms", ".1f"), ("pct", "%", ".0f"),
                             ("waited_ms", "waited itself ms", ".1f"), ("in_steps", "significant in", "")])
        if len(c["stragglers"]) > ROWS_SHOWN:
            out.append(f"  ({_more(c['stragglers']).lstrip('; ')})")
        named = [x for x in c["stragglers"] if x["steps"]]
        out += [f"  {straggler_text(x)}" for x in named] or ["  no significant straggler: the ranks arrive "
                                                             "together within the run's noise"]
    else:
        out.append("  no collective of a steady step seen on more than one rank")
    out += [f"  !! mismatch: group {m['group']} seq {m['seq']} ({m['kind']}): {m['detail']}" for m in c["mismatches"]]
    out += [f"  !! in flight: {in_flight_text(x)}" for x in c["in_flight"]]
    if c["overlap"]:
        out.append("  Communication and compute (mean per steady step; exposed: in a collective with no compute "
                   "running on the rank)")
        out += _table(c["overlap"], [("rank", "rank", ""), ("comm_ms", "in collectives ms", ".2f"),
                                     ("overlapped_ms", "overlapped ms", ".2f"), ("exposed_ms", "exposed ms", ".2f"),
                                     ("exposed_pct", "% of step", ".1f")])
    if c["bandwidth"]:
        out.append("  Bandwidth (transfer: from the last arrival to completion; busbw as NCCL-tests)")
        rows = [{**x, "size": format_bytes(x["bytes"]), "ms": x["transfer_ns"] / 1e6}
                for x in _most(c["bandwidth"], "transfer_ns")]
        out += _table(rows, [("group", "group", ""), ("op", "op", ""), ("calls", "calls", "d"),
                             ("size", "bytes", ""), ("ms", "transfer ms", ".2f"),
                             ("algbw", "algbw GB/s", ".3f"), ("busbw", "busbw GB/s", ".3f")])
        if len(c["bandwidth"]) > ROWS_SHOWN:
            out.append(f"  ({_more(c['bandwidth']).lstrip('; ')})")
    return out


GROUPS_SHOWN = 4
ROWS_SHOWN = 12
"""A run of thousands of ranks has as many groups: the text shows the largest rows, --json all."""


def _most(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return rows if len(rows) <= ROWS_SHOWN else sorted(rows, key=lambda x: -x[key])[:ROWS_SHOWN]


def _more(rows: list[dict[str, Any]]) -> str:
    return f"; {len(rows) - ROWS_SHOWN} more rows in --json" if len(rows) > ROWS_SHOWN else ""


def _clock_text(clock: list[dict[str, Any]]) -> str:
    """One line on how the ranks' clocks were aligned to rank 0's."""
    others = [x for x in clock if x["rank"] != 0]
    if all(x["same_clock"] for x in others):
        return "clocks: every rank reads rank 0's clock (one host): no offset applied"
    apart = [x for x in others if x["measured"] and not x["same_clock"]]
    parts = [f"rank {x['rank']} {x['offset_start'] / 1e6:+.3f} -> {x['offset_end'] / 1e6:+.3f} ms "
             f"(+-{x['rtt'] / 2e6:.3f})" for x in apart]
    if len(apart) > GROUPS_SHOWN:
        starts, ends = [x["offset_start"] / 1e6 for x in apart], [x["offset_end"] / 1e6 for x in apart]
        drift = max(abs(b - a) for a, b in zip(starts, ends))
        parts = [f"{len(apart)} ranks on other hosts, offsets {min(starts):+.3f} to {max(starts):+.3f} ms at start, "
                 f"drift up to {drift:.3f} ms, within +-{max(x['rtt'] for x in apart) / 2e6:.3f} ms"]
    unmeasured = [x["rank"] for x in others if not x["measured"]]
    if unmeasured:
        parts.append(f"ranks {ranks_text(unmeasured)} not measured: their clocks are taken as rank 0's")
    return "clocks aligned to rank 0 (offset at start -> end): " + "; ".join(parts)


def _called_from(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Adds to ``rows`` (table rows of sites) the "called from" cell: the user's line that led to
    a library's line, blank where it is the line itself; the column, or none if all are blank."""
    for r in rows:
        r["called_from"] = user_line(r)
    return [("called_from", "called from", "")] if any(r["called_from"] for r in rows) else []


def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> list[str]:
    """Fixed-width text table: cols are (key, header, format)."""
    cells = [[h for _, h, _ in cols]] + [["-" if r.get(k) is None and f else format(r.get(k), f) if f else
                                          str(r.get(k) if r.get(k) is not None else "") for k, _, f in cols]
                                         for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return ["  " + "  ".join(c.ljust(w) if i in (0, len(cols) - 1) or not cols[i][2] else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in cells]


def _render_compile(c: dict[str, Any]) -> list[str]:
    if not c["frames_compiled"] and not c["graph_runs"]:
        return ["", "Compile", "  no torch.compile activity captured"]
    out = ["", f"Compile ({c['frames_compiled']} frame compiles, {c['compile_ms']:.0f} ms, "
               f"{c['compile_in_steps_ms']:.0f} ms of compiling inside steps; {c['graph_breaks']} graph "
               f"break sites, {c['recompiles']} recompiles)"]
    if c["cache_limit_hit"]:
        out.append("  !! the recompile (cache size) limit was hit: a frame fell back to eager for good")
    if c["break_sites"]:
        out.append("  Graph breaks by site")
        out += _table(c["break_sites"], [("source", "source line", ""), ("reason_class", "class", ""),
                                         ("breaks", "breaks", "d"), ("hits_per_step", "hits/step", ".1f"),
                                         ("frame_ms_per_step", "frame ms/step", ".3f"), ("gb_id", "gb", "")])
        out.append("  (per steady step; frame ms: the graph before the break plus the break's eager code, until the "
                   "resumed frame, compiling left out)")
    for r in c["recompiles_by_frame"]:
        out.append(f"  recompiles of {r['func']}: {r['recompiles']}" + ("  (CACHE LIMIT HIT)" if r["cache_limit_hit"] else ""))
        out += [f"    - {reason}" for reason in r["reasons"][:5]]
    if c["compile_time"]:
        out.append("  Compile time by frame")
        out += _table(c["compile_time"], [("compile_id", "id", ""), ("func", "frame", ""), ("backend", "backend", ""),
                                          ("graph_ops", "ops", "d"), ("total_ms", "ms", ".1f"), ("status", "status", "")])
    for x in c["cache"]:
        rate = "n/a" if x["hit_rate"] is None else f"{100 * x['hit_rate']:.0f}%"
        out.append(f"  cache {x['cache']}: {x['hit']} hits, {x['miss']} misses, {x['bypass']} bypasses ({rate})")
    if c["graph_runs"]:
        out.append("  Compiled graphs at run time")
        out += _table(c["graph_runs"], [("compile_id", "id", ""), ("runs", "runs", "d"),
                                        ("runs_per_step", "runs/step", ".1f"),
                                        ("self_ms_per_step", "self ms/step", ".3f"), ("total_ms", "total ms", ".3f")])
    if c["top_fusions"]:
        out.append("  Top fused kernels")
        out += [f"  {f['kernel']} ({f['compile_id']}): {f['fused']} nodes: {', '.join(f['nodes'][:8])}"
                for f in c["top_fusions"]]
    return out


def _basis_name(basis: str) -> str:
    """How the report names the steps its per-step figures are over (``analysis.steps.basis_steps``)."""
    return {"steady": "steady", "all": "(no steady step: all)"}.get(basis, "no")


def _render_steps(s: dict[str, Any]) -> list[str]:
    out = ["Steps (" + s["run"]["step_numbering"] + ")"]
    for x in s["startup"]:
        out.append(f"  start-up of rank {x['rank']}: {x['ms'] / 1e3:.2f} s before step 0 (from capture start to the "
                   "first module call: imports, model and data set-up); not a step")
    if not s["steps"]:
        out.append("  no completed step (call prof.step() each iteration, or use an optimizer under `record`); "
                   "no per-step figures")
        return out
    out += _table(s["steps"], [("rank", "rank", ""), ("steps", "steps", "d"), ("warmup", "warm-up", "d"),
                               ("steady", "steady", "d"), ("captured", "captured", "d"),
                               ("mean_ms", "mean ms", ".2f"), ("median_ms", "median", ".2f"),
                               ("p90_ms", "p90", ".2f"), ("min_ms", "min", ".2f"), ("max_ms", "max", ".2f")])
    bases = {x["basis"] for x in s["steps"]}
    out.append("  statistics over the steady steps: not a rank's first step, nor steps in which torch.compile "
               "compiled" if bases == {"steady"} else
               "  no steady step on some rank: its statistics are over all its steps, warm-up included")
    shown = s["warmup_steps"][:8]
    if shown:
        out.append("  warm-up steps: " + "; ".join(
            f"rank {w['rank']} step {w['step']} {w['step_ms']:.1f} ms"
            + (f" ({w['compile_ms']:.1f} ms compiling)" if w["compile_ms"] else "") for w in shown)
            + ("; ..." if len(s["warmup_steps"]) > len(shown) else ""))
    return out


def render_text(s: dict[str, Any]) -> str:
    r = s["run"]
    cmd = " ".join(r["command"]) if isinstance(r["command"], list) else (r["command"] or "?")
    out = [f"neuron_prof run {r['path']}",
           f"  command: {cmd}",
           f"  torch {r['torch_version']} on {r['device']}, world size {r['world_size']}, "
           f"ranks {r['ranks']}, started {r['start_time']}", ""]
    found = findings(s)
    if found:
        out.append("Findings")
        out += [f"  {'!!' if f['severity'] == 'high' else '! ' if f['severity'] == 'medium' else '- '} {f['text']}"
                for f in found]
        out.append("")
    out += _render_steps(s)
    if s["step_breakdown"]:
        out += ["", f"Where a {_basis_name(s['ops']['basis'])} step's time goes (mean ms per step)"]
        cols = [("rank", "rank", ""), ("step_ms", "step", ".2f")]
        for p in PHASES:
            label = p.replace("_", " ")
            cols += [(f"{p}_ms", label, ".2f"), (f"{p}_pct", "%", ".0f")]
        out += _table(s["step_breakdown"], cols)
    for t in s["time_split"]:
        out.append(f"  rank {t['rank']}: " + ", ".join(f"{k} {t[f'{k}_ms']:.2f} ms" for k in TIME_KINDS))
    o = s["ops"]
    out += ["", f"Top ops by self time ({o['captured_steps']} {_basis_name(o['basis'])} captured steps, "
                f"{o['events']} op events; the {o['compile_events']} ops run while compiling are left out)"]
    if s["device"]["captured"]:
        out.append("  (host time: on an asynchronous device an op's time is queueing its work; the device's own "
                   "time is under Device, Top kernels)")
    if o["top_by_self_time"]:
        cols = [("name", "op", ""), ("module", "module", ""), ("calls", "calls", "d"),
                ("self_ms", "self ms", ".2f"), ("self_pct", "%", ".1f"), ("total_ms", "total ms", ".2f")]
        if "self_ms_per_step" in o["top_by_self_time"][0]:
            cols.insert(4, ("self_ms_per_step", "ms/step", ".3f"))
        cols.append(("backward", "pass", ""))
        rows = [{**x, "backward": "bwd" if x["backward"] else "", "module": x["module"] or "-"}
                for x in o["top_by_self_time"]]
        out += _table(rows, cols)
    else:
        out.append("  no op events captured")
    sp = s["sync_points"]
    out += ["", f"Sync points ({sp['events']} events: the host waits for the device here)"]
    if sp["by_source"]:
        out += _table([{**x, "source": x["source"] or "?", "elsewhere": x["count"] - x["in_steps"]}
                       for x in sp["by_source"]],
                      [("source", "source line", ""), ("name", "op", ""), ("count", "count", "d"),
                       ("per_step", f"/{_basis_name(s['ops']['basis'])} step", ".1f"),
                       ("elsewhere", "elsewhere", "d"), ("total_ms", "total ms", ".3f"),
                       *([("wait_ms_per_step", "waited ms/step", ".3f"), ("wait_ms", "waited ms", ".3f")]
                         if sp["waits_measured"] else []), ("kind", "why", "")])
        out.append("  (elsewhere: in start-up, warm-up steps or set-up, never a per-step rate"
                   + ("; waited: the host's measured wait for the device inside them" if sp["waits_measured"] else "")
                   + ")")
    else:
        out.append("  none")
    out += _render_device(s["device"])
    out += _render_compile(s["compile"])
    out += _render_memory(s["memory"])
    out += _render_collectives(s["collectives"], s["run"]["world_size"])
    out += _render_metrics(s.get("metrics", []))
    out += _render_dumps(s.get("dumps", []))
    h = s["health"]
    out += ["", "Capture health"]
    for x in h["ranks"]:
        bits = [f"rank {x['rank']}: {'closed cleanly' if x['closed'] else 'did NOT close (killed or crashed)'}",
                f"{x['events_written']} events", f"{x['events_dropped']} dropped"]
        if x["ignored_bytes"]:
            bits.append(f"{x['ignored_bytes']} bytes after the last completed step ignored")
        cut = next((c for c in h["detail_cuts"] if c["rank"] == x["rank"]), None)
        if x["cap_reached_at_step"] is not None:
            what = "disk budget" if cut is not None and cut["by"] == "max_bytes" else "event cap"
            bits.append(f"{what} reached at step {x['cap_reached_at_step']}")
        out.append("  " + ", ".join(bits))
        if cut is not None:
            out.append(f"  rank {x['rank']}: {detail_cut_text(cut)}")
    for f in h["failures"]:
        out.append(f"  rank {f['rank']}: collector {f['collector']} failed: {f['message']}")
    for rank in h["missing_ranks"]:
        out.append(f"  rank {rank}: no folder: the process was killed or crashed before its first step "
                   "(or never started)")
    for c in h["conflicts"]:
        when = _dt.datetime.fromtimestamp(c["time_ns"] / 1e9).strftime("%H:%M:%S") if c["time_ns"] else "?"
        owner = f"pid {c['holder_pid']} {'was writing it' if c['live'] else 'had written it'}"
        out.append(f"  rank {c['rank']}: also claimed by pid {c['pid']} ({' '.join(map(str, c['argv']))[:80]}) "
                   f"at {when}, which wrote nothing ({owner})")
    for d in h["stale_rank_dirs"]:
        out.append(f"  ignored {d}: not this run's, left by an earlier capture into the same directory")
    if h["command_exit"] is not None:
        out.append(f"  the command {describe_exit(h['command_exit'])}")
    return "\n".join(out) + "\n"
