"""The one table renderer of the reports: a header and rows of cells already written as text, laid
out as a fixed-width terminal table or a Markdown table.

``report``, ``compare`` and ``port-check`` all print through here, so their tables line up alike:
columns two spaces apart, each as wide as its widest cell, numbers right-aligned where the caller
says a column holds numbers, no trailing blanks.
"""
from __future__ import annotations

from typing import Collection, Sequence

from neuron_prof.reports.markdown import md

Row = Sequence[str]


def aligned(head: Row, body: Sequence[Row], right: Collection[int] = (), indent: str = "") -> list[str]:
    """The table as fixed-width lines, each begun with ``indent``; the columns ``right`` (numbers)
    right-aligned, the others left-aligned."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return [indent + "  ".join(x.rjust(w) if i in right else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths)))
            .rstrip() for row in [head, *body]]


def markdown(head: Row, body: Sequence[Row]) -> list[str]:
    """The table in Markdown, every cell run text made inert (``markdown.md``)."""
    return ["| " + " | ".join(map(md, head)) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(map(md, row)) + " |" for row in body)]
