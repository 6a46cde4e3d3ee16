"""User-facing errors: one line that names the file and what to do; the CLI exits 2 on them."""
from __future__ import annotations


class NeuronProfError(Exception):
    """A problem with the user's input (a run, a trace, a flag), not a bug in neuron_prof.

    The message is complete on its own: the CLI prints ``neuron-prof: error: <message>`` and
    exits 2 without a traceback.
    """
