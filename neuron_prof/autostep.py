"""Step detection without user calls: a step ends when the training loop's optimizer steps.

The rule (documented in the README): the first optimizer whose ``step()`` runs becomes the step
clock; each return from its ``step()`` ends one training step. Other optimizers (GAN-style loops,
per-parameter-group optimizers) do not end steps, so a step is one full iteration.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable


class OptimizerStepClock:
    """Calls ``on_step`` after each ``step()`` of the first optimizer that steps."""

    def __init__(self, on_step: Callable[[], None]) -> None:
        self._on_step = on_step
        self._clock: weakref.ref | None = None
        self._handle: Any = None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._handle = register_optimizer_step_post_hook(self._post_step)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._clock is None or self._clock() is None:
            self._clock = weakref.ref(optimizer)
        if self._clock() is optimizer:
            self._on_step()
