"""Always-on capture for whole jobs: step-level data for every step, full detail sampled, the
detail of the last sampled steps kept in memory and written when something goes wrong.

A long job cannot afford to record every op of every step: even a RecordFunction observer that
does nothing costs 1.14-1.21x on a launch-bound step. In always-on mode the session writes the
light tables (step times, compile events, per-step memory, collectives, losses, failures) for
every step (per-step memory: each device's allocator at every step, the CPU's resident memory;
the CPU allocator's blocks are followed in sampled steps only, unless ``follow_cpu_memory``), off
the training thread about once a second (:class:`Background`), and captures full op, allocation
and device detail one step in ``detail_every`` only (step 1, then every
``detail_every`` steps): the collectors' window is off in between, the op observer detached, so
those steps pay nothing for it. The detail of the last ``ring_steps`` sampled steps stays in a
:class:`DetailRing`. A *dump* writes the ring, the step in flight and one ``dumps`` row per thread
named (reason, the steps it covers, that thread's Python stack) into the run. Dumps happen on:

* an exception that ends the capture (an out-of-memory error included: the memory collector's
  live set goes with it),
* ``SIGUSR1`` (the job goes on) and ``SIGTERM`` (the run is closed, then the process ends as the
  signal would have ended it), where the program has not installed a handler of its own,
* the watchdog: no step completed for ``hang_timeout_s`` (a hang; every thread's stack is
  recorded, so the report says where each one waits),
* ``profile.dump()``, on demand.

``neuron-prof trigger PID`` (neuron_prof.capture.ondemand) and ``profile.capture_next(n)`` capture the next
``n`` steps in full detail straight to the run, like a scheduled window. Nothing is dumped when the
job ends normally: its run holds the light tables and any steps captured on demand.
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

from neuron_prof.recording.api import batch_len, batch_since, frames_of
from neuron_prof.store.schema import Frame

if TYPE_CHECKING:
    from neuron_prof.capture.session import Session

log = logging.getLogger("neuron_prof")

DEFAULT_RING_STEPS = 20
DEFAULT_DETAIL_EVERY = 100
BACKGROUND_INTERVAL_S = 1.0
DEFAULT_HANG_TIMEOUT_S = 600.0
DEFAULT_MAX_RING_ROWS = 4_000_000
_UNTIMED = ("kernel_enqueues",)  # rows without a ts: kept with their drain's other rows


@dataclass(frozen=True)
class AlwaysOn:
    """Settings of always-on capture (see the module docstring)."""

    ring_steps: int = DEFAULT_RING_STEPS
    """Sampled steps whose detail is kept in memory (the step in flight comes on top)."""
    detail_every: int = DEFAULT_DETAIL_EVERY
    """Full detail one step in this many (step 1, then every ``detail_every``); 1: every step."""
    hang_timeout_s: float | None = DEFAULT_HANG_TIMEOUT_S
    """No step completed for this long: a hang, dumped once until steps go on. None: no watchdog."""
    signals: bool = True
    """Dump on SIGUSR1 and SIGTERM (only where the program left them at their default action)."""
    max_ring_rows: int = DEFAULT_MAX_RING_ROWS
    """A bound on the rows the ring holds, whatever the steps: the oldest go first."""
    follow_cpu_memory: bool = False
    """Follow CPU allocations between sampled steps too: the CPU's live and peak tensor bytes at
    every step and its live set on an out-of-memory error, for about 150 ns per allocation and
    free (c10's CPU allocator keeps a size table under a mutex for every block once memory is
    reported; 1.1x a launch-bound step). Off, the CPU's per-step memory is the process's resident
    memory, and its allocations are seen inside sampled steps; devices' allocators are followed
    at every step either way."""

    def sampled(self, step: int) -> bool:
        """Whether ``step`` is one of the sampled steps captured in detail into the ring."""
        return step % self.detail_every == 1 % self.detail_every

    def next_sampled(self, step: int) -> int:
        """The first sampled step after ``step``."""
        return step + 1 + (1 - (step + 1)) % self.detail_every

    def __post_init__(self) -> None:
        if self.ring_steps < 1:
            raise ValueError(f"ring_steps must be >= 1, not {self.ring_steps}")
        if self.detail_every < 1:
            raise ValueError(f"detail_every must be >= 1, not {self.detail_every}")
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
    """What starts a dump besides an exception: signals, and the hang watchdog that runs on the
    :class:`Background` thread."""

    def __init__(self, session: "Session", settings: AlwaysOn) -> None:
        self._session = session
        self._settings = settings
        self._saved: dict[int, Any] = {}
        self._handlers: dict[int, Callable[[int, FrameType | None], None]] = {
            signal.SIGUSR1: self._on_usr1, signal.SIGTERM: self._on_term}
        self.last_step_ns = time.monotonic_ns()
        """When the last step completed (or capture began): what the watchdog measures from."""
        self._fired_for: int | None = None

    def install(self) -> None:
        if self._settings.signals:
            self._install_signals()

    def uninstall(self) -> None:
        for signum, previous in self._saved.items():
            try:
                if signal.getsignal(signum) is self._handlers.get(signum):
                    signal.signal(signum, previous)
            except (ValueError, OSError):  # not the main thread (a stop at exit elsewhere): leave it
                pass
        self._saved.clear()

    def forget(self) -> None:
        """In a forked child (one thread, no background thread): the signals get the parent's
        handlers back, so a worker process dies of SIGTERM and SIGUSR1 as it would without capture."""
        for signum, previous in self._saved.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, OSError):
                pass
        self._saved.clear()

    def step_done(self, now_ns: int) -> None:
        self.last_step_ns = now_ns

    def check_hang(self) -> None:
        """Dump once per hang (no step completed for ``hang_timeout_s``): a step completing
        re-arms it. Called by the background thread."""
        if self._settings.hang_timeout_s is None:
            return
        last = self.last_step_ns
        if last == self._fired_for or time.monotonic_ns() - last < self._settings.hang_timeout_s * 1e9:
            return
        self._fired_for = last
        waited = (time.monotonic_ns() - last) / 1e9
        try:
            self._session.dump(f"hang: no step completed for {waited:.0f} s", stacks=thread_stacks())
        except Exception as exc:  # noqa: BLE001 - the job goes on whatever happens here
            log.warning("neuron_prof: the hang dump failed (%s: %s)", type(exc).__name__, exc)

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


class Background:
    """The thread that does always-on capture's periodic work off the training thread: about
    once a second (sooner when the hang timeout is short) it runs ``tick``, which writes the
    step-level rows buffered since the last time, answers on-demand requests and watches for a
    hang. The step boundary itself then does no disk write."""

    def __init__(self, tick: Callable[[], None], interval_s: float) -> None:
        self._tick = tick
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="neuron_prof always-on", daemon=True)
        self._thread.start()

    def stop(self, join: bool = True) -> None:
        """No tick after this one; ``join``: wait for a tick in progress to end."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def forget(self) -> None:
        """In a forked child: the thread is the parent's."""
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - the job goes on whatever happens here
                log.warning("neuron_prof: always-on background work failed (%s: %s)", type(exc).__name__, exc)


def exit_by_signal(signum: int) -> None:
    """End the process as ``signum``'s default action would (its exit status says so)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
