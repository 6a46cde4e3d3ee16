"""A Hugging Face ``transformers.TrainerCallback`` that captures a ``Trainer.train()`` run.

    from neuron_prof.integrations.huggingface import NeuronProfCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[NeuronProfCallback("runs/hf")])

A step ends where the Trainer's ``global_step`` advances (after the optimizer step, the scheduler
step and ``zero_grad``), so step N is the Trainer's ``global_step`` N+1. Each step records its
samples (``per_device_train_batch_size`` x ``gradient_accumulation_steps``, per rank), its tokens
(this rank's share of ``state.num_input_tokens_seen``'s advance when the Trainer counts tokens,
``include_num_input_tokens_seen``; else ``tokens_per_step``) and, through the ``loss`` collector,
the loss ``backward()`` ran on: with gradient accumulation its sum over the micro-batches, which is
what the Trainer logs as the step's loss.
"""
from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from neuron_prof.integrations import FrameworkCapture
from neuron_prof.capture.schedule import Schedule


class NeuronProfCallback(TrainerCallback):
    """``run_dir``, ``schedule`` and any other ``neuron_prof.profile`` argument; ``tokens_per_step``
    for a Trainer that does not count tokens."""

    def __init__(self, run_dir: str | os.PathLike, schedule: Schedule | None = None,
                 tokens_per_step: float | None = None, **profile_kwargs: Any) -> None:
        self.capture = FrameworkCapture(run_dir, schedule, tokens_per_step, profile_kwargs)
        self._tokens_seen = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._tokens_seen = state.num_input_tokens_seen or 0
        self.capture.start()

    def on_step_end(self, args, state, control, **kwargs):
        seen = state.num_input_tokens_seen or 0
        tokens = (seen - self._tokens_seen) / max(args.world_size, 1) if seen > self._tokens_seen else None
        self._tokens_seen = seen
        self.capture.step(samples=args.per_device_train_batch_size * args.gradient_accumulation_steps, tokens=tokens)

    def on_train_end(self, args, state, control, **kwargs):
        self.capture.stop()
