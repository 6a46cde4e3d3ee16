"""Step detection without user calls: a step ends when the training loop's optimizer steps.

The rule (documented in docs/capture.md): the first optimizer whose ``step()`` runs becomes the step
clock; each return from its ``step()`` ends one training step. Other optimizers (GAN-style loops,
per-parameter-group optimizers) do not end steps, so a step is one full iteration.

The hook is hidden from Dynamo (:func:`neuron_prof.recording.torchhooks.hide_from_dynamo`). A compiled
optimizer step (``torch.compile(opt.step)``, or ``opt.step()`` inside a compiled training step)
still ends steps: torch's optimizer breaks the graph around its update, and the frame that calls
the post-step hooks has nothing else to compile, so Dynamo leaves it to Python and the hook runs.
Should the hooks' call ever be traced into a graph, the step clock does not see that step (call
``prof.step()`` instead); compiled code is never changed for it.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from neuron_prof.recording.torchhooks import hide_from_dynamo


class OptimizerStepClock:
    """Calls ``on_step`` after each ``step()`` of the first optimizer that steps."""

    def __init__(self, on_step: Callable[[], None]) -> None:
        self._on_step = on_step
        self._clock: weakref.ref | None = None
        self._handle: Any = None
        self._unhide: Callable[[], None] | None = None

    def install(self) -> None:
        from torch.compiler import is_compiling
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._is_compiling = is_compiling
        clock = self

        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            clock._post_step(optimizer, args, kwargs)

        self._unhide = hide_from_dynamo(hook)
        self._handle = register_optimizer_step_post_hook(hook)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._unhide is not None:
            self._unhide()
            self._unhide = None

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._is_compiling():  # traced after all: a no-op rather than a graph break
            return
        if self._clock is None or self._clock() is None:
            self._clock = weakref.ref(optimizer)
        if self._clock() is optimizer:
            self._on_step()
