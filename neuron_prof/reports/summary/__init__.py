"""The run's summary: what ``neuron-prof report`` shows, built once and read by every front end.

``sections`` holds its types (one dataclass per section and per kind of row), ``build`` makes
one from a run (``summarize``), ``codec`` turns it into JSON and back (``Summary.to_json``,
``Summary.from_json``), ``text`` renders it for the terminal (``render_text``).
"""
