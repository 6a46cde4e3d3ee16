"""``neuron-prof compare``'s document: two runs opened, compared (``analysis.compare``) and
written as text, JSON (a CI gate) or Markdown (a pull request, a migration report)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from neuron_prof.analysis.compare import LOSS_RTOL, TOLERANCE, Side, checklist
from neuron_prof.reports.records import records
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.markdown import md
from neuron_prof.store.run import Run
from neuron_prof.reports.summary.build import peak_for, run_op_stats, with_peak
from neuron_prof.reports.summary.codec import to_json
from neuron_prof.reports.summary.sections import Summary
from neuron_prof.reports.stored import run_summary
from neuron_prof.units import format_bytes

if TYPE_CHECKING:
    from neuron_prof.backends.op_support import Target


class PeakAsked(NamedTuple):
    """The peak a run's MFU is read against: given TFLOP/s, or a known device's (``--peak-device``)."""
    tflops: float | None = None
    device: str | None = None


def side(run: Run, label: str, price_per_hour: float | None = None, summary: Summary | None = None,
         peak: PeakAsked = PeakAsked(), target: Target | None = None) -> Side:
    """What the comparison needs of ``run``; ``summary``: its report summary if at hand (default:
    the stored one when fresh, else computed); ``peak``: what its MFU is against; ``target``: a
    backend registered in this process, to price the ops that fall back there."""
    hosts = {str(rd.meta.get("hostname")) for rd in run.rank_data if rd.meta.get("hostname")}
    summary = summary if summary is not None else run_summary(run)
    if peak.tflops is not None or peak.device is not None:
        summary = with_peak(summary, peak_for(summary, tflops=peak.tflops, device=peak.device))
    fallback_pct = None
    if target is not None:
        from neuron_prof.reports.port import port_check  # asks torch's dispatcher: only with a target
        fallback_pct = float(port_check(run, target).fallbacks["pct"].sum())
    return Side(label=label, summary=summary, metrics=run.metrics, steps=analyze(run).step_kinds,
                ops=run_op_stats(run), hosts=max(1, len(hosts)), price_per_hour=price_per_hour,
                target_fallback_pct=fallback_pct)



PHASES = ("a: summary and ops", "b: summary and ops", "comparing")
"""What ``compare_runs`` reports to its ``progress`` callback, in order."""


def compare_runs(a: Run, b: Run, labels: tuple[str, str] = ("a", "b"),
                 prices: tuple[float | None, float | None] = (None, None), tolerance: float = TOLERANCE,
                 loss_rtol: float = LOSS_RTOL, progress: Callable[[str], None] = lambda phase: None,
                 peaks: tuple[PeakAsked, PeakAsked] = (PeakAsked(), PeakAsked()), target: Target | None = None
                 ) -> dict[str, Any]:
    """The comparison of ``b`` against the baseline ``a``, JSON-ready (``--json``); ``progress``
    is told each of ``PHASES`` as it begins."""
    progress(PHASES[0])
    side_a = side(a, labels[0], prices[0], peak=peaks[0], target=target)
    progress(PHASES[1])
    side_b = side(b, labels[1], prices[1], peak=peaks[1], target=target)
    progress(PHASES[2])
    result = checklist(side_a, side_b, tolerance, loss_rtol)
    return {"runs": {"a": str(a.path), "b": str(b.path)}, "labels": result["labels"],
            "rows": records(result["rows"]), "loss": result["loss"], "graph_breaks": to_json(result["graph_breaks"]),
            "ops": records(result["ops"]), "notes": result["notes"]}


def format_value(v: Any, unit: str) -> str:
    """A checklist value with its unit, as the text, the Markdown and the viewer show it."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit.startswith("bytes"):
        return format_bytes(v, 2) + unit[5:]
    if unit == "ms":
        return f"{v:.3f} ms"
    if unit == "USD":
        return f"${v:.4g}"
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:,.1f}" if unit == "1/s" else f"{v:g}"


def _ratio(r: Any) -> str:
    return "-" if r is None or (isinstance(r, float) and math.isnan(r)) else f"{r:.2f}x"


def _table_rows(c: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    la, lb = c["labels"]["a"], c["labels"]["b"]
    head = ["check", la, lb, f"{lb}/{la}", "verdict", "detail"]
    body = [[r["item"] + (f" ({r['better']} is better)" if r["better"] == "higher" else ""),
             format_value(r["a"], r["unit"]), format_value(r["b"], r["unit"]), _ratio(r["ratio"]), r["verdict"],
             r["detail"] or ""] for r in c["rows"]]
    return head, body


def _ops_rows(c: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    la, lb = c["labels"]["a"], c["labels"]["b"]
    head = ["op", "module", f"{la} ms/step", f"{lb} ms/step", "change ms/step"]
    return head, [[o["name"], o["module"] or "-", f"{o['a_ms_per_step']:.3f}", f"{o['b_ms_per_step']:.3f}",
                   f"{o['change_ms']:+.3f}"] for o in c["ops"]]


def _sites(c: dict[str, Any]) -> list[str]:
    out = []
    for key in ("a_only", "b_only"):
        label = c["labels"][key[0]]
        for s in c["graph_breaks"][key]:
            out.append(f"graph break only in {label}: {s['source']} ({s['reason_class']}): {s['reason']}")
    return out


def render_text(c: dict[str, Any]) -> str:
    la, lb = c["labels"]["a"], c["labels"]["b"]
    lines = [f"neuron_prof compare: {lb} ({c['runs']['b']}) against {la} ({c['runs']['a']})", ""]
    head, body = _table_rows(c)
    lines += _aligned(head, body)
    sites = _sites(c)
    if sites:
        lines += ["", *sites]
    if c["ops"]:
        lines += ["", "ops whose time changed most (self time per steady step, by op and module path):"]
        lines += _aligned(*_ops_rows(c))
    if c["notes"]:
        lines += ["", *(f"note: {n}" for n in c["notes"])]
    return "\n".join(lines) + "\n"


def _aligned(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in [head, *body]]


def _md_table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(map(md, head)) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(map(md, row)) + " |" for row in body)]


def render_markdown(c: dict[str, Any]) -> str:
    la, lb = c["labels"]["a"], c["labels"]["b"]
    lines = [f"## Migration check: {md(lb)} against {md(la)}", ""]
    lines += _md_table(*_table_rows(c)) + [""]
    sites = _sites(c)
    if sites:
        lines += [f"- {md(s)}" for s in sites] + [""]
    if c["ops"]:
        lines += ["### Ops whose time changed most", ""] + _md_table(*_ops_rows(c)) + [""]
    if c["notes"]:
        lines += [f"> {md(n)}" for n in c["notes"]] + [""]
    return "\n".join(lines)
