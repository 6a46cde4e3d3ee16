"""``neuron_prof.profile``: the torch.profiler-style entry point."""
from __future__ import annotations

import os
from typing import Iterable, Sequence

from neuron_prof.autostep import OptimizerStepClock
from neuron_prof.schedule import Schedule
from neuron_prof.session import (DEFAULT_COLLECTORS, DEFAULT_MAX_BUFFERED_EVENTS, DEFAULT_MAX_BYTES,
                                 DEFAULT_MAX_EVENTS, Session, current, log)


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
    command into one run (neuron_prof.session.Session says what they do).
    """

    def __init__(self, run_dir: str | os.PathLike, *, schedule: Schedule | None = None,
                 collectors: Iterable[str] = DEFAULT_COLLECTORS, auto_step: bool = False,
                 max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS,
                 max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int | None = DEFAULT_MAX_BYTES,
                 command: Sequence[str] | None = None, origin_ns: int | None = None, run_id: str | None = None,
                 yield_if_stepless: bool = False) -> None:
        self.session = Session(run_dir, schedule, collectors, max_buffered_events=max_buffered_events,
                               max_events=max_events, max_bytes=max_bytes, command=command, run_id=run_id,
                               origin_ns=origin_ns, yield_if_stepless=yield_if_stepless)
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

    def step(self) -> None:
        """End the current training step."""
        self.session.step()

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(exc if isinstance(exc, BaseException) else None)
