"""Run text inside Markdown as the characters it is: never markup, HTML or a link.

A run is someone else's data: its command, file, module and op names, reasons and messages may
hold ``![x](http://host/...)`` (an image a renderer would fetch), ``<img ...>``, a link or a ``|``
that ends a table cell. The viewer's pages and ``neuron-prof compare --markdown`` put every run
string through :func:`md`.
"""
from __future__ import annotations

import re
import string
from typing import Any

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")


def md(value: Any) -> str:
    """``value`` as Markdown that renders as its own characters: every ASCII punctuation mark
    backslash-escaped (CommonMark's rule; it also stops HTML, a table cell's ``|``, Streamlit's
    ``:color[...]`` and ``$math$``), line breaks as spaces (no block of its own)."""
    return _PUNCT.sub(r"\\\1", " ".join(str(value).splitlines()))
