"""What a person reads: typed results built from the facade and rendered as text, JSON and
Markdown. ``summary/`` (what ``report`` shows: sections, build, codec, text), ``findings`` (its
first lines), ``stored`` (the summary kept in the run), ``compare`` and ``port`` (the other two
commands' results), ``table`` (the one fixed-width table renderer), ``markdown`` (run text made
inert), ``records`` (DataFrames as JSON-ready rows). Display limits (``top``) live here.

May import: analysis, backends, store.
"""
