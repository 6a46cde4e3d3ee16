"""The backends ``port-check`` and ``compare --target`` can register in their own process and ask
which ops they run (``op_support``): how to register each, and what it is. Kept apart from
``op_support`` so that a command's parser lists them without importing torch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from neuron_prof.backends.op_support import Target


def _neuron() -> "Target":
    """The emulated neuron device, registered in this process: its boxed fallback leaves
    ``neuron.cpu_ops()`` to the CPU and queues other ops by their Meta kernels."""
    from neuron_prof.backends.op_support import process_target
    from neuron_prof.testing import neuron
    if not neuron.enabled():
        neuron.enable()
    return process_target(neuron.BACKEND)


TARGETS: dict[str, tuple[Callable[[], "Target"], str]] = {
    "neuron": (_neuron, "the emulated neuron device (neuron_prof.testing.neuron; built on first use, about 40 s)")}
"""Name -> (register it in this process and return it, what it is)."""


def register_target(name: str) -> "Target":
    """The target ``name`` (a key of ``TARGETS``), registered in this process."""
    return TARGETS[name][0]()
