"""Text from a run, placed on a page as the characters it is: never Markdown, HTML or a link.

A run is someone else's data: its recorded command, file, module, op and thread names, reasons
and messages may hold ``![x](http://host/...)`` (an image the browser would fetch), ``<img ...>``
or a link. Streamlit renders Markdown in ``st.markdown``, captions, alerts, metric labels and
values, and Plotly renders a little HTML in hover text, axis and legend labels. So every run
string goes into those through :func:`md` or :func:`plot`; where a whole string is the content,
a literal widget (``st.code``, ``st.text``, a dataframe cell) shows it instead.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np

from neuron_prof.reports.markdown import md

__all__ = ["md", "plot", "plot_array"]


def plot(value: Any) -> str:
    """``value`` for Plotly text that renders HTML tags (hover, legend, tick labels): escaped."""
    return html.escape(str(value), quote=False)


def plot_array(values: Any) -> np.ndarray:
    """:func:`plot` of every element, as an object array (customdata, category rows)."""
    return np.array([plot(v) for v in values], dtype=object)
