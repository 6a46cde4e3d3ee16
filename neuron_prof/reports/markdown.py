"""Run text inside Markdown as the characters it is: never markup, HTML or a link.

A run is someone else's data: its command, file, module and op names, reasons and messages may
hold ``![x](http://host/...)`` (an image a renderer would fetch), ``<img ...>``, a link, a bare
URL that GFM would make a link, or a ``|`` that ends a table cell. The viewer's pages and ``neuron-prof compare --markdown`` put every run
string through :func:`md`.
"""
from __future__ import annotations

import re
import string
from typing import Any

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")


_AUTOLINK = re.compile(r"(?i)(?=://|@)|(?<=w)(?=ww\.)")
"""Where GFM's literal autolinks start (``https://``, ``www.``, ``a@b.c``): escapes do not stop them
(renderers find them in the text after unescaping, so ``https\\://x.y`` still became a live link)."""
WORD_JOINER = "\u2060"
"""Invisible and zero-width: put at each :data:`_AUTOLINK` place, no renderer sees a link there."""


def md(value: Any) -> str:
    """``value`` as Markdown that renders as its own characters: every ASCII punctuation mark
    backslash-escaped (CommonMark's rule; it also stops HTML, a table cell's ``|``, Streamlit's
    ``:color[...]`` and ``$math$``), a :data:`WORD_JOINER` where a literal autolink would start
    (the text reads the same; a copy holds the joiner), line breaks as spaces (no block of its own)."""
    return _PUNCT.sub(r"\\\1", _AUTOLINK.sub(WORD_JOINER, " ".join(str(value).splitlines())))
