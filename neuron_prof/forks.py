"""How many forks this process is a child of: one count for whatever a process keeps that a forked
child must not inherit (a file opened as ``/proc/self``, a thread's cached OS id).

A cache notes the count when it fills and refills when the count has moved, which costs a compare
where asking the pid (a system call) at every use would cost more than what is cached.
"""
from __future__ import annotations

import os

_generation = 0


def generation() -> int:
    """Forks this process is a child of (0 in the process that imported neuron_prof first)."""
    return _generation


def _forked() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
