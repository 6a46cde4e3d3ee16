"""A PyTorch Lightning ``Callback`` that captures a ``Trainer.fit()`` run (``lightning.pytorch``,
or the older ``pytorch_lightning`` package).

    from neuron_prof.integrations.lightning import NeuronProfCallback
    trainer = lightning.pytorch.Trainer(max_steps=100, callbacks=[NeuronProfCallback("runs/pl")])

A step ends where the Trainer's ``global_step`` advances (an optimizer step: every
``accumulate_grad_batches`` batches), so step N is the Trainer's ``global_step`` N+1. Each step
records its samples (the batches' first dimension, per rank), ``tokens_per_step`` when given and,
through the ``loss`` collector, the loss ``backward()`` ran on: with gradient accumulation the sum
over the micro-batches of the loss Lightning divides by ``accumulate_grad_batches``, i.e. their mean.
"""
from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package of Lightning before 2.0's rename
    from pytorch_lightning import Callback

from neuron_prof.integrations import FrameworkCapture
from neuron_prof.capture.schedule import Schedule


def batch_size(batch: Any) -> int:
    """The first dimension of the batch's first tensor (a tensor, a sequence or a mapping of them)."""
    if hasattr(batch, "shape"):
        return int(batch.shape[0]) if len(batch.shape) else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_size(item)
        if n:
            return n
    return 0


class NeuronProfCallback(Callback):
    """``run_dir``, ``schedule`` and any other ``neuron_prof.profile`` argument."""

    def __init__(self, run_dir: str | os.PathLike, schedule: Schedule | None = None,
                 tokens_per_step: float | None = None, **profile_kwargs: Any) -> None:
        self.capture = FrameworkCapture(run_dir, schedule, tokens_per_step, profile_kwargs)
        self._global_step = 0
        self._samples = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._global_step, self._samples = trainer.global_step, 0
        self.capture.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._samples += batch_size(batch)
        if trainer.global_step != self._global_step:  # this batch ended an optimizer step
            self._global_step = trainer.global_step
            self.capture.step(samples=self._samples)
            self._samples = 0

    def on_train_end(self, trainer, pl_module) -> None:
        self.capture.stop()
