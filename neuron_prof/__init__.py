"""neuron_prof: where a PyTorch training step spends its time, on any device.

Public API: ``profile``, ``schedule``, ``mark``, ``load``. See the README for examples.
"""
from __future__ import annotations

__version__ = "0.1.0"

from neuron_prof.marks import mark
from neuron_prof.profile import profile
from neuron_prof.run import Run, load
from neuron_prof.schedule import Schedule, schedule

__all__ = ["profile", "schedule", "Schedule", "mark", "load", "Run", "__version__"]
