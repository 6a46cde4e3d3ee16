"""neuron_prof's browser viewer: a Streamlit app over a run directory (``neuron-prof view RUN``).

``app.py`` is the entry script (navigation), ``data.py`` the cached loading every page shares,
``views/`` one script per page, ``server`` the process ``view`` and the demo start. Pages only lay
out what ``neuron_prof``'s facade and reports compute.

May import: reports, export, analysis, backends, store.
"""

RUN_ENV = "NEURON_PROF_RUN"  # the run directory the viewer shows (``neuron-prof view`` sets it)
DIFF_ENV = "NEURON_PROF_DIFF_RUN"  # a second run for the Compare page (``--compare``)
