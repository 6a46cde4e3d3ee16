"""The backends ``port-check`` and ``compare --target`` can register in their own process and ask
which ops they run (``op_support``): which module registers each, and what it is. Kept apart from
``op_support`` so that a command's parser lists them without importing torch.

A target is named by the module that registers it and is imported by that name only when asked
for, as a plugin is: the profiler imports no backend (the emulated ``neuron`` device included,
DESIGN.md), and a real one (torch_neuronx, torch_npu) would be one more line here."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from neuron_prof.backends.op_support import Target


class KnownTarget(NamedTuple):
    """A backend by name: ``register`` is ``"module:function"``, a function that registers the
    backend in this process (once) and returns its PrivateUse1 name; ``what`` is what it is."""
    register: str
    what: str


TARGETS: dict[str, KnownTarget] = {
    "neuron": KnownTarget("neuron_prof.testing.neuron:register_target",
                          "the emulated neuron device (neuron_prof.testing.neuron; built on first use, about 40 s)")}
"""Name -> how to register it and what it is."""


def register_target(name: str) -> "Target":
    """The target ``name`` (a key of ``TARGETS``), registered in this process."""
    from neuron_prof.backends.op_support import process_target
    module, function = TARGETS[name].register.split(":")
    return process_target(getattr(importlib.import_module(module), function)())
