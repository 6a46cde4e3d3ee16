"""neuron_prof: where a PyTorch training step spends its time, on any device.

Public API: ``profile``, ``schedule``, ``mark``, ``log`` (capture); ``trigger`` (a running
always-on job's next steps in detail); ``load`` (a run's tables) and ``analyze`` (its analyses).
See the README and docs/python-api.md.
"""
from __future__ import annotations

from typing import Any

from neuron_prof.capture.marks import log, mark
from neuron_prof.capture.profile import profile
from neuron_prof.capture.schedule import Schedule, schedule
from neuron_prof.version import __version__

__all__ = ["profile", "schedule", "Schedule", "mark", "log", "trigger", "load", "Run", "analyze", "RunAnalysis", "__version__"]


def __getattr__(name: str) -> Any:
    """``load``, ``Run``, ``analyze`` and ``RunAnalysis`` (the reading side, and pandas with it) and
    ``trigger`` (``ondemand.request``) are imported when first used: a process that only captures
    (every Python process under ``neuron-prof record``) starts without them."""
    if name in ("load", "Run"):
        from neuron_prof.store import run

        return getattr(run, name)
    if name == "trigger":
        from neuron_prof.capture.ondemand import request

        return request
    if name in ("analyze", "RunAnalysis"):
        from neuron_prof.analysis import run_analysis

        return getattr(run_analysis, name)
    raise AttributeError(f"module 'neuron_prof' has no attribute {name!r}")
