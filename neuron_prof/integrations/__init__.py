"""Training-framework callbacks: a capture that starts with the framework's training loop, ends a
step where the framework's optimizer step ends, and takes samples and tokens per step from the
framework's own state. Optional: each module imports its framework.

    from neuron_prof.integrations.huggingface import NeuronProfCallback   # transformers.Trainer
    from neuron_prof.integrations.lightning import NeuronProfCallback     # lightning.pytorch.Trainer

Under ``neuron-prof record`` a capture is already running; the callbacks then leave the steps to
it (``record --samples-per-step``/``--tokens-per-step`` give throughput).

May import: capture.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from neuron_prof.capture.ownership import current
from neuron_prof.capture.profile import profile
from neuron_prof.capture.schedule import Schedule

log = logging.getLogger("neuron_prof")


class FrameworkCapture:
    """The capture a callback runs: started once, stepped, stopped; or nothing under ``record``."""

    def __init__(self, run_dir: str | os.PathLike, schedule: Schedule | None, tokens_per_step: float | None,
                 profile_kwargs: dict[str, Any]) -> None:
        self.run_dir, self.schedule, self.tokens_per_step = run_dir, schedule, tokens_per_step
        self.profile_kwargs = profile_kwargs
        self.prof: profile | None = None

    def start(self) -> None:
        if self.prof is not None:
            return
        running = current()
        if running is not None:
            log.warning("neuron_prof: already capturing to %s (neuron-prof record?); the callback leaves the "
                        "steps to that capture", running.run_dir)
            return
        self.prof = profile(self.run_dir, schedule=self.schedule, **self.profile_kwargs).start()

    def step(self, samples: float | None = None, tokens: float | None = None) -> None:
        if self.prof is not None:
            self.prof.step(tokens=tokens if tokens is not None else self.tokens_per_step, samples=samples)

    def stop(self) -> None:
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
