"""Always-on capture for whole jobs: the detail of the last steps kept in memory, written when
something goes wrong.

A long job cannot afford to write every op to disk, and the step that matters (the one that
hangs, raises, runs out of memory or gets killed by the scheduler) is not known in advance. In
always-on mode the session writes the light tables as usual (step times, compile events,
per-step memory, collectives, failures) about once a second, and keeps the detail tables (ops,
allocations, device queue) of the last ``ring_steps`` steps in a :class:`DetailRing`. A *dump*
writes the ring, the step in flight and one ``dumps`` row per thread named (reason, the steps
it covers, that thread's Python stack) into the run. Dumps happen on:

* an exception that ends the capture (an out-of-memory error included: the memory collector's
  live set goes with it),
* ``SIGUSR1`` (the job goes on) and ``SIGTERM`` (the run is closed, then the process ends as the
  signal would have ended it), where the program has not installed a handler of its own,
* the watchdog: no step completed for ``hang_timeout_s`` (a hang; every thread's stack is
  recorded, so the report says where each one waits),
* ``profile.dump()``, on demand.

Nothing is dumped when the job ends normally: its run holds the light tables only.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from neuron_prof.recording import Frame, batch_len, batch_since

if TYPE_CHECKING:
    from neuron_prof.session import Session

log = logging.getLogger("neuron_prof")

DEFAULT_RING_STEPS = 20
DEFAULT_HANG_TIMEOUT_S = 600.0
DEFAULT_MAX_RING_ROWS = 4_000_000
_UNTIMED = ("kernel_enqueues",)  # rows without a ts: kept with their drain's other rows


@dataclass(frozen=True)
class AlwaysOn:
    """Settings of always-on capture (see the module docstring)."""

    ring_steps: int = DEFAULT_RING_STEPS
    """Steps of detail kept in memory (the step in flight comes on top)."""
    hang_timeout_s: float | None = DEFAULT_HANG_TIMEOUT_S
    """No step completed for this long: a hang, dumped once until steps go on. None: no watchdog."""
    signals: bool = True
    """Dump on SIGUSR1 and SIGTERM (only where the program left them at their default action)."""
    max_ring_rows: int = DEFAULT_MAX_RING_ROWS
    """A bound on the rows the ring holds, whatever the steps: the oldest go first."""

    def __post_init__(self) -> None:
        if self.ring_steps < 1:
            raise ValueError(f"ring_steps must be >= 1, not {self.ring_steps}")
        if self.hang_timeout_s is not None and not self.hang_timeout_s > 0:
            raise ValueError(f"hang_timeout_s must be > 0 (or None: no watchdog), not {self.hang_timeout_s}")
        if self.max_ring_rows < 1:
            raise ValueError(f"max_ring_rows must be >= 1, not {self.max_ring_rows}")


class DetailRing:
    """The detail rows of the last steps, as the collectors handed them over, drain by drain.

    Each drain's batches stay together (a device's kernel-to-enqueue rows have no time of their
    own and go with their drain); rows that began before the oldest kept step are cut at
    :meth:`take`, and whole drains once all their rows are older.
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._drains: deque[tuple[int, dict[str, list[Any]]]] = deque()  # (newest ts, table -> batches)
        self._rows = 0
        self.dropped_rows = 0
        """Rows let go because the ring held ``max_rows``: counted in the run's capture health."""

    def __len__(self) -> int:
        return self._rows

    def add(self, tables: Mapping[str, list[Any]]) -> None:
        tables = {t: list(b) for t, b in tables.items() if b}
        rows = sum(batch_len(b) for batches in tables.values() for b in batches)
        if not rows:
            return
        newest = max((int(np.max(b["ts"])) for t, bs in tables.items() if t not in _UNTIMED
                      for b in bs if batch_len(b)), default=time.monotonic_ns())
        self._drains.append((newest, tables))
        self._rows += rows
        while self._rows > self.max_rows and len(self._drains) > 1:
            self.dropped_rows += self._pop()

    def trim(self, since_ns: int) -> None:
        """Let go of the drains whose rows all began before ``since_ns``."""
        while self._drains and self._drains[0][0] < since_ns:
            self._pop()

    def take(self, since_ns: int) -> dict[str, list[Any]]:
        """Everything held that began at ``since_ns`` or later, by table; the ring is empty after."""
        out: dict[str, list[Any]] = {}
        for _, tables in self._drains:
            for table, batches in tables.items():
                for b in batches:
                    kept = b if table in _UNTIMED else batch_since(b, since_ns)
                    if batch_len(kept):
                        out.setdefault(table, []).append(kept)
        self._drains.clear()
        self._rows = 0
        return out

    def _pop(self) -> int:
        _, tables = self._drains.popleft()
        rows = sum(batch_len(b) for batches in tables.values() for b in batches)
        self._rows -= rows
        return rows


def frames_of(frame: FrameType | None, limit: int = 64) -> list[Frame]:
    """A Python stack as (file, function, line), innermost first."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_filename, getattr(code, "co_qualname", code.co_name), frame.f_lineno or 0))
        frame = frame.f_back
    return out


def traceback_frames(exc: BaseException, limit: int = 64) -> list[Frame]:
    """Where ``exc`` was raised, innermost first."""
    tb, frames = exc.__traceback__, []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, getattr(code, "co_qualname", code.co_name), tb.tb_lineno or 0))
        tb = tb.tb_next
    return frames[::-1][:limit]


def thread_stacks() -> list[tuple[int, list[Frame]]]:
    """Every Python thread's (OS tid, stack), the watchdog's own left out."""
    by_ident = {t.ident: t.native_id for t in threading.enumerate()}
    me = threading.get_ident()
    return [(by_ident.get(ident) or 0, frames_of(frame))
            for ident, frame in sys._current_frames().items() if ident != me]


class Triggers:
    """What starts a dump besides an exception: signals and the hang watchdog."""

    def __init__(self, session: "Session", settings: AlwaysOn) -> None:
        self._session = session
        self._settings = settings
        self._saved: dict[int, Any] = {}
        self._handlers: dict[int, Callable[[int, FrameType | None], None]] = {
            signal.SIGUSR1: self._on_usr1, signal.SIGTERM: self._on_term}
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.last_step_ns = time.monotonic_ns()
        """When the last step completed (or capture began): what the watchdog measures from."""

    def install(self) -> None:
        if self._settings.signals:
            self._install_signals()
        if self._settings.hang_timeout_s is not None:
            self._watchdog = threading.Thread(target=self._watch, name="neuron_prof watchdog", daemon=True)
            self._watchdog.start()

    def uninstall(self) -> None:
        self._stop.set()
        for signum, previous in self._saved.items():
            try:
                if signal.getsignal(signum) is self._handlers.get(signum):
                    signal.signal(signum, previous)
            except (ValueError, OSError):  # not the main thread (a stop at exit elsewhere): leave it
                pass
        self._saved.clear()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join(timeout=5)

    def forget(self) -> None:
        """In a forked child (one thread, no watchdog): the signals get the parent's handlers back,
        so a worker process dies of SIGTERM and SIGUSR1 as it would without capture."""
        for signum, previous in self._saved.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, OSError):
                pass
        self._saved.clear()
        self._watchdog = None

    def step_done(self) -> None:
        self.last_step_ns = time.monotonic_ns()

    # ---- signals
    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("neuron_prof: always-on capture started off the main thread: no SIGUSR1/SIGTERM dumps")
            return
        for signum, handler in self._handlers.items():
            if signal.getsignal(signum) is signal.SIG_DFL:  # a program's own handler is never replaced
                self._saved[signum] = signal.signal(signum, handler)

    def _on_usr1(self, signum: int, frame: FrameType | None) -> None:
        self._session.request_dump("signal SIGUSR1", frames_of(frame))

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._session.request_dump("signal SIGTERM", frames_of(frame), then_exit=signal.SIGTERM)

    # ---- watchdog
    def _watch(self) -> None:
        timeout_ns = int(self._settings.hang_timeout_s * 1e9)
        fired_for = None
        while not self._stop.wait(min(1.0, self._settings.hang_timeout_s / 4)):
            last = self.last_step_ns
            if last == fired_for or time.monotonic_ns() - last < timeout_ns:
                continue
            fired_for = last  # once per hang: a step completing re-arms it
            waited = (time.monotonic_ns() - last) / 1e9
            try:
                self._session.dump(f"hang: no step completed for {waited:.0f} s", stacks=thread_stacks())
            except Exception as exc:  # noqa: BLE001 - the job goes on whatever happens here
                log.warning("neuron_prof: the hang dump failed (%s: %s)", type(exc).__name__, exc)


def exit_by_signal(signum: int) -> None:
    """End the process as ``signum``'s default action would (its exit status says so)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
