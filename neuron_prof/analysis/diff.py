"""Run against run: the headline numbers of two report summaries side by side, each with its
change and whether it got better or worse.

Works on :func:`neuron_prof.report.summarize` dicts, so every number is the report's. ``a`` is
the baseline and ``b`` the run compared with it: ``change = b - a``. Every metric here is
lower-is-better.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

TOLERANCE = 0.05  # relative change of a measured (continuous) number still called "same"

COLUMNS = ["metric", "unit", "a", "b", "change", "change_pct", "verdict", "detail"]


def _step_median(s: dict[str, Any]) -> float | None:
    """Median step time: the median over ranks of each rank's median (the Overview's number)."""
    steps = s.get("steps") or []
    vals = [x["median_ms"] for x in steps if x.get("median_ms") is not None]
    return float(np.median(vals)) if vals else None


def _step_mean(s: dict[str, Any]) -> float | None:
    """Mean step time over the steps each rank's statistics are over (its steady steps)."""
    def count(x: dict[str, Any]) -> int:
        return x["steady"] if x.get("basis") == "steady" else x["steps"]

    steps = [x for x in s.get("steps") or [] if x.get("mean_ms") is not None and x.get("steps")]
    n = sum(count(x) for x in steps)
    return float(sum(x["mean_ms"] * count(x) for x in steps) / n) if n else None


def _top_op(s: dict[str, Any]) -> tuple[float | None, str]:
    """Self time per captured step of the op with the most self time (total self ms without a
    captured step), and its name."""
    top = (s.get("ops") or {}).get("top_by_self_time") or []
    if not top:
        return None, ""
    t = top[0]
    val = t.get("self_ms_per_step", t.get("self_ms"))
    name = str(t.get("name")) + (f" ({t['module']})" if t.get("module") else "")
    return (float(val) if val is not None else None), name


def _memory_peak(s: dict[str, Any]) -> float | None:
    """The highest memory peak of any device (bytes allocated since capture began)."""
    m = s.get("memory") or {}
    if not m.get("captured"):
        return None
    vals = []
    for d in m.get("devices", []):
        vals.append(d.get("peak_between_boundaries") or 0)
        if d.get("peak"):
            vals.append(d["peak"].get("bytes") or 0)
    return float(max(vals)) if vals else None


def _leak_growth(s: dict[str, Any]) -> float | None:
    """Live-memory growth per step of the fastest-growing device (0: no growth)."""
    m = s.get("memory") or {}
    if not m.get("captured"):
        return None
    vals = [float(d["growth_per_step"]) for d in m.get("devices", []) if d.get("growth_per_step") is not None]
    return max(vals) if vals else None


def _metrics(s: dict[str, Any]) -> list[tuple[str, str, float | None, bool, str]]:
    """(metric, unit, value, measured, detail): ``measured`` numbers get the noise tolerance."""
    c = s.get("compile") or {}
    top, top_name = _top_op(s)
    return [
        ("step time (median)", "ms", _step_median(s), True, ""),
        ("step time (mean)", "ms", _step_mean(s), True, ""),
        ("graph break sites", "", c.get("graph_breaks"), False, ""),
        ("graph breaks", "", c.get("graph_break_events"), False, ""),
        ("recompiles", "", c.get("recompiles"), False, ""),
        ("compile time", "ms", c.get("compile_ms"), True, ""),
        ("top op self time", "ms/step", top, True, top_name),
        ("memory peak", "bytes", _memory_peak(s), True, ""),
        ("leak growth", "bytes/step", _leak_growth(s), True, ""),
    ]


def verdict(a: float | None, b: float | None, measured: bool = True, tolerance: float = TOLERANCE) -> str:
    """``better`` / ``worse`` / ``same`` for a lower-is-better number; ``n/a`` when one is missing.
    A measured number within ``tolerance`` (relative to the larger of the two) is ``same``."""
    if a is None or b is None or (isinstance(a, float) and np.isnan(a)) or (isinstance(b, float) and np.isnan(b)):
        return "n/a"
    if a == b:
        return "same"
    if measured and abs(b - a) <= tolerance * max(abs(a), abs(b)):
        return "same"
    return "better" if b < a else "worse"


def compare(summary_a: dict[str, Any], summary_b: dict[str, Any], tolerance: float = TOLERANCE) -> pd.DataFrame:
    """One row per headline metric: ``a`` (baseline), ``b``, ``change`` (b - a), ``change_pct``
    (relative to a; NaN when a is 0 or missing), ``verdict`` (better / worse / same / n/a for b
    against a; lower is better) and ``detail`` (the op names for the top op)."""
    rows = []
    for (name, unit, va, measured, da), (_, _, vb, _, db) in zip(_metrics(summary_a), _metrics(summary_b)):
        va = None if va is None else float(va)
        vb = None if vb is None else float(vb)
        change = vb - va if va is not None and vb is not None else np.nan
        pct = 100 * change / va if va and not np.isnan(change) else np.nan
        detail = f"{da or '-'} -> {db or '-'}" if (da or db) else ""
        rows.append({"metric": name, "unit": unit, "a": np.nan if va is None else va,
                     "b": np.nan if vb is None else vb, "change": change, "change_pct": pct,
                     "verdict": verdict(va, vb, measured, tolerance), "detail": detail})
    return pd.DataFrame(rows, columns=COLUMNS)
