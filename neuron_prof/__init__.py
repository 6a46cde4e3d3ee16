"""neuron_prof: where a PyTorch training step spends its time, on any device.

Public API: ``profile``, ``schedule``, ``mark``, ``log``, ``load``. See the README for examples.
"""
from __future__ import annotations

__version__ = "0.1.0"

from typing import Any

from neuron_prof.marks import mark
from neuron_prof.profile import profile
from neuron_prof.scalars import log
from neuron_prof.schedule import Schedule, schedule

__all__ = ["profile", "schedule", "Schedule", "mark", "log", "load", "Run", "__version__"]


def __getattr__(name: str) -> Any:
    """``load`` and ``Run`` (the reading side, and pandas with it) are imported when first used:
    a process that only captures (every Python process under ``neuron-prof record``) starts
    without them."""
    if name in ("load", "Run"):
        from neuron_prof import run

        return getattr(run, name)
    raise AttributeError(f"module 'neuron_prof' has no attribute {name!r}")
