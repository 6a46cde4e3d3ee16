"""``neuron_prof.profile``: the torch.profiler-style entry point."""
from __future__ import annotations

import os
import sys
import threading
from typing import Iterable, Sequence

from neuron_prof.capture.always_on import DEFAULT_DETAIL_EVERY, DEFAULT_HANG_TIMEOUT_S, DEFAULT_RING_STEPS
from neuron_prof.recording.api import frames_of
from neuron_prof.capture.autostep import OptimizerStepClock
from neuron_prof.capture.buffer import DEFAULT_MAX_BUFFERED_EVENTS, DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from neuron_prof.capture.options import DEFAULT_COLLECTORS, CaptureOptions
from neuron_prof.capture.ownership import current
from neuron_prof.capture.scalars import per_step
from neuron_prof.capture.schedule import Schedule
from neuron_prof.capture.session import Session, log


class profile:  # noqa: N801 - mirrors torch.profiler.profile
    """Capture a training run into ``run_dir`` (one ``rank-NNNNN/`` folder per rank).

    With no ``schedule`` every step is captured in detail until the rank's folder holds
    ``max_bytes`` (every table and the manifest; ``None``: no limit) or ``max_events`` op and mark
    rows are written; later steps keep their step times and per-step memory only, and the run
    records where detail stopped (the report shows it). Call ``prof.step()`` once per iteration,
    or pass ``auto_step=True`` to end steps when the optimizer steps. ``collectors`` picks the
    event sources (default: eager ops).
    ``origin_ns``: when the capture began (``time.monotonic_ns()``), if before ``start()``: the
    process's start-up is then part of the run (``neuron-prof record`` passes the interpreter's
    start). ``run_id`` and ``yield_if_stepless`` are how ``record`` ties the processes of one
    command into one run (neuron_prof.capture.session.Session says what they do).

    ``mode="always-on"``: for whole jobs. Step times, compile events, per-step memory, losses and
    collectives go to disk for every step (off the training thread, about once a second); op,
    allocation and device detail is captured one step in ``detail_every``, and that of the last
    ``ring_steps`` such steps stays in memory, written on an exception, SIGUSR1, SIGTERM, a hang
    (no step for ``hang_timeout_s`` seconds; None: no watchdog) or :meth:`dump`;
    :meth:`capture_next` (or ``neuron-prof trigger PID``) captures the next steps in full detail
    (neuron_prof.capture.always_on). Takes no ``schedule``. Per-step memory is each device allocator's and
    the process's resident memory; ``follow_cpu_memory=True`` follows the CPU allocator's blocks at
    every step too (its tensor bytes per step, its live set at an out-of-memory error), which
    costs about 150 ns per allocation and free.

    ``tokens_per_step``/``samples_per_step``: what each step trains on, when every step is alike
    (``prof.step(tokens=...)`` gives a step's own). Each step's loss (the scalar ``backward()`` is
    called on, collector ``loss``) and what :func:`neuron_prof.log` names are recorded too.
    """

    def __init__(self, run_dir: str | os.PathLike, *, schedule: Schedule | None = None,
                 collectors: Iterable[str] = DEFAULT_COLLECTORS, auto_step: bool = False,
                 max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS,
                 max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int | None = DEFAULT_MAX_BYTES,
                 command: Sequence[str] | None = None, origin_ns: int | None = None, run_id: str | None = None,
                 yield_if_stepless: bool = False, mode: str = "detail", ring_steps: int = DEFAULT_RING_STEPS,
                 detail_every: int = DEFAULT_DETAIL_EVERY,
                 hang_timeout_s: float | None = DEFAULT_HANG_TIMEOUT_S, follow_cpu_memory: bool = False,
                 tokens_per_step: float | None = None,
                 samples_per_step: float | None = None) -> None:
        options = CaptureOptions(
            run_dir=run_dir, schedule=schedule, collectors=collectors, auto_step=auto_step,
            max_buffered_events=max_buffered_events, max_events=max_events, max_bytes=max_bytes, command=command,
            origin_ns=origin_ns, run_id=run_id, yield_if_stepless=yield_if_stepless, mode=mode, ring_steps=ring_steps,
            detail_every=detail_every, hang_timeout_s=hang_timeout_s, follow_cpu_memory=follow_cpu_memory,
            tokens_per_step=tokens_per_step, samples_per_step=samples_per_step)
        self.session = Session(options)
        self._clock = OptimizerStepClock(self.session.step) if auto_step else None

    @property
    def run_dir(self):
        return self.session.run_dir

    @property
    def step_num(self) -> int:
        return self.session.step_num

    def start(self) -> "profile":
        active = current()
        if active is not None:
            # e.g. a script that calls profile() itself, run under `neuron-prof record`: the outer
            # capture goes on, this one does nothing; never an error inside the user's training
            log.warning("neuron_prof: already recording to %s; profile(%r) is ignored", active.run_dir,
                        str(self.session.run_dir))
            self._clock = None
            return self
        self.session.start()
        if self._clock is not None:
            self._clock.install()
        return self

    def stop(self, exc: BaseException | None = None) -> None:
        """End capture. ``exc``: the exception ending it, if any (an out-of-memory error gets a
        snapshot of what was live); it is never swallowed."""
        if self._clock is not None:
            self._clock.uninstall()
        self.session.stop(exc)

    def step(self, tokens: float | None = None, samples: float | None = None) -> None:
        """End the current training step; ``tokens``/``samples``: what it trained on (throughput
        and cost per token in ``neuron-prof compare``; default: ``tokens_per_step``/``samples_per_step``)."""
        self.session.step(None if tokens is None and samples is None else per_step(tokens, samples))

    def dump(self, reason: str = "on demand") -> bool:
        """Always-on mode: write the last sampled steps' detail into the run now (the job goes on)."""
        return self.session.dump(reason, stacks=[(threading.get_native_id(), frames_of(sys._getframe(1)))])

    def capture_next(self, steps: int) -> None:
        """Always-on mode: capture the next ``steps`` steps in full detail into the run, like a
        scheduled window (what ``neuron-prof trigger PID --steps N`` asks from outside)."""
        self.session.capture_next(steps)

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(exc if isinstance(exc, BaseException) else None)

