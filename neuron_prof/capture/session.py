"""The capture session: owns the collectors, the step clock, the interners and the rank writer.

It implements the Recorder protocol (neuron_prof.recording.api) that collectors write to, and is the
only place that decides when data is kept, flushed and committed. Its parts, one job each: which
steps are captured in detail (``windows``), the step rows and the rank's writer that flushes write
(``flushing``), the always-on ring and its dumps (``dumps``), what it holds between flushes and the
rank's disk budget (``buffer``), which process records and writes the rank's folder
(``ownership``).
"""
from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from neuron_prof.capture.always_on import BACKGROUND_INTERVAL_S, Background, Triggers, exit_by_signal, traceback_frames
from neuron_prof.capture.dumps import SampledDetail
from neuron_prof.capture.flushing import RankOrigin, StepJournal, open_writer
from neuron_prof.capture.buffer import IDLE_FLUSH_INTERVAL_NS, CaptureBuffer
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.interner import Interner
from neuron_prof.capture.ondemand import ControlChannel
from neuron_prof.capture.options import RECORD_ENV, CaptureOptions
from neuron_prof.capture.ownership import claim_process, forget_in_child, rank_and_world, release_process, yields_rank
from neuron_prof.recording.api import Collector, frames_of
from neuron_prof.store.schema import Frame, went_on
from neuron_prof.capture.scalars import ScalarBuffer
from neuron_prof.capture.schedule import Action
from neuron_prof.capture.windows import Windows
from neuron_prof.store.writer import RankWriter

log = logging.getLogger("neuron_prof")

STARTUP_SPAN = "start-up"
SUMMARY_AT_CLOSE_ROWS = 1_000_000
"""A rank that wrote this many op and mark rows has its run's summary stored at close (in the
background: ``summarize_later``); smaller runs are summarised by their first reader, in well
under a second, and stored then."""
SUMMARY_AT_CLOSE_ENV = "NEURON_PROF_SUMMARY_AT_CLOSE_ROWS"


def _make_collectors(names: Iterable[str]) -> list[Collector]:
    from neuron_prof.collectors import REGISTRY
    out = []
    for name in names:
        if name not in REGISTRY:
            raise NeuronProfError(f"unknown collector {name!r}; choose from {', '.join(sorted(REGISTRY))}")
        out.append(REGISTRY[name]())
    return out


class Session:
    """One capture in one process (one rank). Use ``neuron_prof.profile`` rather than this directly."""

    def __init__(self, options: CaptureOptions) -> None:
        self.run_dir = Path(options.run_dir)
        # one id per capture: every process of one `record` shares record's; a session of its own
        # (the profile() API) has its own. rank.json carries it, so a folder's owner is known.
        self.run_id = options.run_id or uuid.uuid4().hex
        self._run_id_scope = "command" if options.run_id else "process"
        self._origin_ns = options.origin_ns  # capture start when given (record: the interpreter's start)
        # a capture that completes no step writes nothing if its rank is already this run's
        # (record's launcher-like processes: the ranks they start write the run)
        self.yield_if_stepless = options.yield_if_stepless
        # capture began with the process (origin_ns, record): until its first module call the
        # process is starting up (imports, model and data set-up), and that is not step 0
        self._first_call_ns: int | None = None
        # scalars every step has (record --tokens-per-step): logged at each boundary unless the
        # step's own call gives them
        self.step_scalars = {name: float(v) for name, v in options.step_scalars().items()}
        self.max_buffered_events = options.max_buffered_events
        command = options.command
        self.command = list(command) if command is not None else [sys.executable, *sys.argv]
        self.collectors = _make_collectors(options.collectors)
        self._on_step = [c for c in self.collectors if hasattr(c, "on_step")]
        self._excluders = [c for c in self.collectors if hasattr(c, "exclude")]
        self.step_num = 0
        self._interner = Interner()
        self._buffer = CaptureBuffer(options.max_events, options.max_bytes)
        self._scalars = ScalarBuffer()
        self._scalar_ids: dict[str, int] = {}  # a scalar's name -> its string id (a loss per backward())
        self._failed: set[str] = set()
        self._writer: RankWriter | None = None
        self._lock = threading.RLock()
        self._step_start = 0
        self._started = False
        self._closed = False
        self._journal = StepJournal()
        # always-on (neuron_prof.capture.always_on): sampled steps' detail goes to a ring, written by dumps;
        # steps asked for on demand (capture_next) go to disk like a scheduled window's
        self.always_on = always_on = options.always_on()
        self._windows = Windows(options.schedule, always_on, self._buffer)
        self._detail = SampledDetail(always_on) if always_on else None
        self._triggers: Triggers | None = None
        self._background: Background | None = None
        self._channel: ControlChannel | None = None  # on-demand requests (neuron-prof trigger PID)
        self._deferred: tuple[str, list[Frame], int | None] | None = None
        self._quiet_until = 0  # steps before this one end with _quiet_step (_quiet_horizon)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (s := ref()) is not None and s._forked())

    # ---- Recorder protocol
    def intern(self, s: str) -> int:
        with self._lock:
            return self._interner.string(s)

    def intern_stack(self, frames: Sequence[Frame]) -> int:
        with self._lock:
            return self._interner.stack(frames)

    def append(self, table: str, columns: Mapping[str, Any]) -> None:
        with self._lock:
            self._buffer.pending[table].append(columns)

    def scalar(self, name: str, value: Any) -> None:
        """A scalar of the current step (a float, or a one-element detached tensor read at a
        step boundary: see neuron_prof.capture.scalars), in and out of detail windows."""
        sid = self._scalar_ids.get(name)
        if sid is None:
            sid = self._scalar_ids[name] = self.intern(name)
        self._scalars.add(sid, value)

    def kept_for_us(self) -> list[Any]:
        """Device tensors alive only because the session has not read them yet (scalars)."""
        return self._scalars.ours_alone()

    def dropped(self, table: str, n: int) -> None:
        with self._lock:
            self._buffer.dropped[table] += int(n)

    def training_began(self, ts: int) -> None:
        if self._first_call_ns is None:
            self._first_call_ns = int(ts)

    def failure(self, collector: str, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        with self._lock:
            first = collector not in self._failed
            self._failed.add(collector)
            self._buffer.pending["failures"].append(
                {"ts": [time.monotonic_ns()], "collector": [collector], "message": [msg]})
        if first:
            log.warning("neuron_prof: collector %r failed (%s); %s; training goes on", collector, msg,
                        "the events are counted as dropped and it went on" if went_on(collector)
                        else "it is off for this run")

    def rank_file(self, name: str) -> int | None:
        """An fd of a new file ``name`` in this rank's folder, outside the manifest (a collector's
        memory-mapped ring). The folder is made now if no flush has made it yet, with a first
        commit, so a process killed before its first step still leaves a readable rank. None
        when this process may not write the rank (another owns it)."""
        with self._lock:
            if self._closed:
                return None
            made = self._writer is None
            writer = self._ensure_writer(final=False, now=True)
            if writer is None:
                return None
            if made:
                writer.commit(self.step_num, {"dropped": {}, "written": {}, "cap_reached_at_step": None})
            return writer.side_file(name)

    @property
    def closing(self) -> bool:
        """True from the final flush on: collectors hand over what is still open."""
        return self._closed

    @property
    def follows_cpu_memory(self) -> bool:
        return self.always_on is None or self.always_on.follow_cpu_memory

    # ---- lifecycle
    @property
    def recording(self) -> bool:
        """True while detailed capture is on (warmup or active step)."""
        return self._windows.on

    def start(self) -> "Session":
        claim_process(self)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self._start_ns = self._origin_ns if self._origin_ns is not None else time.monotonic_ns()
        for c in list(self.collectors):
            self._guard(c, c.install, self)
        self._step_start = self._buffer.last_commit = time.monotonic_ns()
        self._enter_step()
        self._started = True
        if self.always_on is not None:
            self._triggers = Triggers(self, self.always_on)
            self._triggers.install()
            try:
                self._channel = ControlChannel.open(self.run_dir, rank_and_world()[0])
            except (NeuronProfError, OSError) as exc:
                log.warning("neuron_prof: no on-demand capture for this job (%s)", exc)
            hang = self.always_on.hang_timeout_s
            self._background = Background(self._tick, min(BACKGROUND_INTERVAL_S, hang / 4 if hang else BACKGROUND_INTERVAL_S))
            self._background.start()
        atexit.register(self._stop_at_exit)
        return self

    def step(self, scalars: Mapping[str, float] | None = None) -> None:
        """End the current step and begin the next (call once per training iteration).
        ``scalars``: numbers of this step (tokens, samples), with ``step_scalars`` as defaults."""
        if not self._started or self._closed:
            return
        if self.step_num < self._quiet_until and not (self.step_scalars or scalars) and not self._scalars.device_due():
            self._quiet_step()
            return
        if self.step_scalars or scalars:
            for name, value in {**self.step_scalars, **(scalars or {})}.items():
                self.scalar(name, value)
        with self._lock:
            now = time.monotonic_ns()
            if self.step_num == 0 and self._origin_ns is not None:
                self._split_startup()
            action = self._windows.action(self.step_num)
            self._append_step(now, complete=True, action=action)
            if self._detail is None or self._scalars.device_due():
                self._settle_scalars(final=False)  # always-on: host values are read by _tick
            for c in self._on_step:
                self._guard(c, c.on_step, self.step_num, now)
            if self._windows.requested:
                self._begin_on_demand()
            mark = now
            if self._windows.on and self._windows.ends_after(self.step_num):
                # a window closing: the ops open on this thread (torch.optim's step range, whose
                # post-hook ends the step) end here, in this step's data (reopened by _enter_step)
                mark = self._own_work_since(mark)
                self._set_window(False)
            if self._detail is not None:
                self._always_on_step_end(action, now)
            elif self._flush_due(action, now):
                self._flush(keep=action is Action.RECORD)
            self.step_num += 1
            # the next step begins after our own work: steps are contiguous but for these gaps
            # (a window that was on in this step: ops still open on this thread must not count it)
            self._step_start = self._own_work_since(mark) if self._windows.on or mark != now else time.monotonic_ns()
            self._enter_step()
            if self._triggers is not None:
                self._triggers.step_done(self._step_start)
            self._quiet_until = self._quiet_horizon()
        if self._deferred is not None:
            self._run_deferred()

    def _quiet_step(self) -> None:
        """The end of an always-on step that changes nothing but the step rows and the per-step
        tables (``_quiet_horizon``): what ``step`` does for such a step, without asking again
        at every boundary what the horizon already answered (a launch-bound step pays every µs
        of this, at every step of the job)."""
        with self._lock:
            now = time.monotonic_ns()
            n = self.step_num
            self._append_step(now, complete=True, action=Action.NONE)
            for c in self._on_step:
                self._guard(c, c.on_step, n, now)
            self.step_num = n + 1
            self._step_start = time.monotonic_ns()
            if self._triggers is not None:
                self._triggers.step_done(self._step_start)
        if self._deferred is not None:
            self._run_deferred()

    def _quiet_horizon(self) -> int:
        """Always-on: the first step whose end needs the whole boundary; steps before it, from the
        one beginning now, end with ``_quiet_step``. Those are the steps recorded in no detail
        and followed by one recorded in none, while the step ring has room for their rows and no
        window, request or dump is pending. What can change the answer later (``capture_next``,
        a signal's dump) sets the horizon back to 0; a device value due, or scalars given to
        ``step``, take the whole boundary at that step."""
        windows, ring = self._windows, self._journal.ring
        if (self._detail is None or windows.on or windows.requested or ring is None or self._deferred is not None
                or windows.on_demand[1] > self.step_num):
            return 0
        n = self.step_num
        # the step before the next sampled one turns the window on at its end; the ring must never
        # lap a row
        return min(self.always_on.next_sampled(n) - 1, n + ring.room - len(self._journal.rows) - 1)

    def dump(self, reason: str = "on demand", stacks: list[tuple[int, list[Frame]]] | None = None) -> bool:
        """Always-on capture: write the detail of the last steps and of the step in flight into
        the run now, with a ``dumps`` row per thread in ``stacks`` ((OS tid, frames innermost
        first); default: the caller's). False if capture is not running."""
        if self._detail is None:
            raise NeuronProfError("dump() needs always-on capture: neuron_prof.profile(..., mode=\"always-on\")")
        if stacks is None:
            stacks = [(threading.get_native_id(), frames_of(sys._getframe(1)))]
        with self._lock:
            if not self._started or self._closed:
                return False
            self._write_dump(reason, stacks)
        self._run_deferred()
        return True

    def capture_next(self, steps: int) -> None:
        """Always-on capture: capture the next ``steps`` steps (from the next step boundary on) in
        full detail, written to the run like a scheduled window's. Safe from any thread (the
        on-demand channel's, a signal handler)."""
        if self._detail is None:
            raise NeuronProfError("capture_next() is for always-on capture: neuron_prof.profile(..., "
                                  "mode=\"always-on\"); a detail capture records every step already")
        self._windows.request(steps)
        self._quiet_until = 0  # the next boundary begins the window

    def request_dump(self, reason: str, frames: list[Frame], then_exit: int | None = None) -> None:
        """A signal handler's dump. A signal that lands in the session's own work (its lock held
        by this thread) waits for that work to end rather than re-enter a flush half done.
        ``then_exit``: a signal to end the process with, once the run is closed."""
        if self._lock._is_owned():  # noqa: SLF001 - the RLock's own test (threading.Condition uses it)
            self._deferred = (reason, frames, then_exit)
            self._quiet_until = 0
            return
        try:
            if self._detail is not None and self.dump(reason, [(threading.get_native_id(), frames)]):
                if then_exit is not None:
                    self.stop()
        finally:
            if then_exit is not None:
                exit_by_signal(then_exit)

    def stop(self, exc: BaseException | None = None) -> None:
        """End capture: the step in progress is kept as incomplete, everything is committed.

        ``exc``: the exception that ends the capture, if any (collectors may record what it
        says, e.g. the memory collector on an out-of-memory error); it is not handled here.
        """
        if not self._started or self._closed:
            return
        if self._background is not None:
            self._background.stop()  # its last tick ends before the final flush
        if self._channel is not None:
            self._channel.close()
        with self._lock:
            self._closed = True
            if self._triggers is not None:
                self._triggers.uninstall()
            if exc is not None:
                for c in self.collectors:
                    if hasattr(c, "on_error"):
                        self._guard(c, c.on_error, self, exc, self.step_num)
                if self._detail is not None:
                    self._write_dump(f"exception: {type(exc).__name__}: {exc}".strip()[:2000],
                                     [(threading.get_native_id(), traceback_frames(exc))])
            self._flush(keep=self._windows.action(self.step_num) is Action.RECORD, final=True)
            self._journal.close()
            self._set_window(False)
            for c in self.collectors:
                self._guard(c, c.uninstall)
            if self._writer is not None and self._buffer.events_written() >= _summary_at_close_rows():
                summarize_later(self.run_dir)
        self._release()
        self._run_deferred()

    def _stop_at_exit(self) -> None:
        # a script that dies of an exception has it in sys.last_value by the time atexit runs
        self.stop(getattr(sys, "last_value", None))

    # ---- internals
    def _flush_due(self, action: Action, now: int) -> bool:
        """Detail steps flush at every boundary (what a kill -9 can lose is the step in flight);
        other steps flush about once a second, their rows in the step ring meanwhile."""
        return (action is not Action.NONE or now - self._buffer.last_commit >= IDLE_FLUSH_INTERVAL_NS
                or self._journal.due())

    def _begin_on_demand(self) -> None:
        """capture_next's steps begin with the next step (a window already open on demand grows)."""
        steps = self._windows.begin_on_demand(self.step_num)
        log.warning("neuron_prof: capturing steps %d-%d in full detail (on demand) into %s", steps[0],
                    steps[-1], self.run_dir)

    def _always_on_step_end(self, action: Action, now: int) -> None:
        """A sampled step's detail goes to the ring, with no disk write; a step captured on demand
        is written at its end (a kill -9 loses at most the step in flight, as in a window); the
        step-level rows of every step wait for the background thread (``_tick``), in the step ring
        meanwhile, unless the step journal is due (``flushing.StepJournal.due``)."""
        if action is Action.NONE:
            if self._journal.due():
                self._commit_steps()
            return
        windows = self._windows
        if windows.is_on_demand(self.step_num):
            self._flush(keep=True)
            if self.step_num + 1 == windows.on_demand[1] and self._channel is not None:
                self._channel.done(list(range(*windows.on_demand)))
            return
        self._flush(keep=True, write=False)
        self._detail.keep(self.step_num, self._step_start)

    def _tick(self) -> None:
        """The background thread's periodic work: the step-level rows to disk, on-demand
        requests, a hang check."""
        with self._lock:
            if self._closed:
                return
            # polled and applied under the lock: a step boundary in between would answer this
            # request (channel.done) with the steps of the window that was ending
            requested = self._channel.poll() if self._channel is not None else None
            if requested:
                self.capture_next(requested)
            if self._journal.rows or time.monotonic_ns() - self._buffer.last_commit >= IDLE_FLUSH_INTERVAL_NS:
                self._commit_steps()
        if self._triggers is not None:
            self._triggers.check_hang()

    def _commit_steps(self) -> None:
        """Always-on: the step-level rows and the host's scalars to disk (lock held)."""
        self._settle_scalars(final=False, host_only=True)
        self._flush(keep=True)

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self.request_dump(*deferred)

    def _write_dump(self, reason: str, stacks: list[tuple[int, list[Frame]]]) -> None:
        """The ring, the step in flight and one ``dumps`` row per thread, committed (lock held).
        ``dumped_steps`` names the sampled steps it wrote whole."""
        now, first = self._detail.add_dump_rows(self, self._buffer, reason, stacks, self.step_num)
        for c in self.collectors:  # where the job is: collectives in flight, device queues
            if hasattr(c, "on_dump"):
                self._guard(c, c.on_dump, self, now)
        self._detail.dumping = True
        try:
            self._flush(keep=True)
        finally:
            self._detail.dumping = False
        log.warning("neuron_prof: always-on dump (%s): the detail of steps %d-%d is in %s", reason, first,
                    self.step_num, self.run_dir)

    def _enter_step(self) -> None:
        self._set_window(self._windows.action(self.step_num) is not Action.NONE)

    def _set_window(self, on: bool) -> None:
        if on != self._windows.on:
            self._windows.on = on
            for c in list(self.collectors):
                self._guard(c, c.window, on)

    def _own_work_since(self, t0: int) -> int:
        """Our own work on this thread since ``t0`` is kept out of the ops open on it; returns now."""
        t1 = time.monotonic_ns()
        for c in self._excluders:
            self._guard(c, c.exclude, t1 - t0)
        return t1

    def _split_startup(self) -> None:
        """Step 0 begins at the first module call, if one came before the first step ended;
        the time before it is the run's start-up span."""
        began = self._first_call_ns
        if began is None or began <= self._step_start:
            return
        self._buffer.pending["spans"].append({"ts": [self._start_ns], "dur": [began - self._start_ns],
                                       "tid": [threading.get_native_id()], "name": [self.intern(STARTUP_SPAN)]})
        self._step_start = began

    def _append_step(self, now: int, complete: bool, action: Action) -> None:
        # active: its detail is on disk (always-on: a step captured on demand; a sampled step's
        # only if a dump writes it, which names it in ``dumped_steps``)
        active = action is Action.RECORD and (self._detail is None or self._windows.is_on_demand(self.step_num))
        self._journal.add((self.step_num, self._step_start, now - self._step_start, active, complete))

    def _settle_scalars(self, final: bool, host_only: bool = False) -> None:
        try:
            rows = self._scalars.settle(final, host_only)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be read (a device error)
            self.failure("metrics", exc)
            return
        if rows is not None:
            self._buffer.pending["metrics"].append(rows)

    def _guard(self, collector: Collector, fn, *args) -> None:
        """Run a collector callback; a failing collector is switched off, training goes on."""
        if collector.name in self._failed:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - never break the user's training
            self.failure(collector.name, exc)
            try:
                collector.uninstall()
            except Exception:
                pass

    def _flush(self, keep: bool, final: bool = False, write: bool = True) -> None:
        """Collectors hand over what they hold; ``write``: it goes to disk (else it waits, detail
        aside: that goes to the ring)."""
        for c in self.collectors:
            self._guard(c, c.flush, self, keep)
        if self._detail is not None:
            self._detail.into_ring(self._buffer, self._windows.is_on_demand(self.step_num), self._step_start)
        if not write:
            return
        self._buffer.keep_or_discard_events(keep)
        if final:
            self._settle_scalars(final=True)
        if final and (self._writer is not None or self._buffer.pending or self.step_num > 0):
            # the step in progress when capture ends: kept, but not counted as a training step
            self._append_step(time.monotonic_ns(), complete=False, action=self._windows.action(self.step_num))
        steps = self._journal.take()
        if steps is not None:
            self._buffer.pending["steps"].append(steps)
        writer = self._ensure_writer(final)
        if writer is None:
            return  # nothing to write yet, or nothing this process may write (see _ensure_writer)
        self._buffer.write(writer, self._interner, self.step_num, final)

    def _ensure_writer(self, final: bool, now: bool = False) -> RankWriter | None:
        """The rank's writer, made at the first flush that has data, once this process owns the
        rank's folder. None: nothing to write yet, or another process owns the folder (the
        capture then ends here: see ``_refuse``), or a capture that completed no step yields to
        the process that wrote its rank."""
        if self._writer is not None or not (self._buffer.pending or now):
            return self._writer
        rank, world = rank_and_world()
        stepless = final and self.step_num == 0
        if stepless and self.yield_if_stepless and yields_rank(self.run_dir, self.run_id, rank):
            return None
        origin = RankOrigin(
            run_dir=self.run_dir, run_id=self.run_id, run_id_scope=self._run_id_scope, command=self.command,
            start_ns=self._start_ns, clock_offset_ns=self._clock_offset_ns,
            collectors=[c.name for c in self.collectors], schedule=self._windows.schedule,
            max_buffered_events=self.max_buffered_events, max_events=self._buffer.max_events,
            max_bytes=self._buffer.max_bytes)
        self._writer = open_writer(origin, rank, world, stepless, report=not (stepless and self.yield_if_stepless))
        if self._writer is None:
            self._refuse(final)
            return None
        if not final:
            self._journal.open_ring(self._writer, self.failure)
        return self._writer

    def _refuse(self, final: bool) -> None:
        """Another process owns this rank's folder (``ownership.open_rank``): this capture ends,
        writing nothing."""
        self._buffer.pending.clear()
        if final:
            return  # stop() is ending the capture already
        self._closed = True
        if self._triggers is not None:
            self._triggers.uninstall()
        if self._background is not None:
            self._background.stop(join=False)  # maybe waiting for the lock this thread holds
        if self._channel is not None:
            self._channel.close()
        self._set_window(False)
        for c in self.collectors:
            self._guard(c, c.uninstall)
        self._release()

    def _forked(self) -> None:
        """In a forked child: the parent's capture (and its open files) stay the parent's. Runs
        right after fork, one thread alive: no lock is taken (another thread may have held it)."""
        self._closed = True
        self._writer = None
        if self._triggers is not None:
            self._triggers.forget()
        if self._background is not None:
            self._background.forget()
        self._channel = None  # the parent's announcement stays the parent's
        forget_in_child(self)
        atexit.unregister(self._stop_at_exit)

    def _release(self) -> None:
        release_process(self)
        atexit.unregister(self._stop_at_exit)


def _summary_at_close_rows() -> int:
    try:
        return int(os.environ.get(SUMMARY_AT_CLOSE_ENV, SUMMARY_AT_CLOSE_ROWS))
    except ValueError:
        return SUMMARY_AT_CLOSE_ROWS


def summarize_later(run_dir: Path) -> None:
    """Store the run's summary from a process of its own (``neuron_prof.reports.stored``), so the
    first ``report`` or viewer page of a big run reads it instead of computing it (seconds to
    tens of seconds), and the training process exits without waiting. A shell starts it in the
    background and exits at once: nothing is left for this process to reap."""
    env = {k: v for k, v in os.environ.items() if k != RECORD_ENV}  # not a process of the run
    try:
        subprocess.run(["/bin/sh", "-c", 'exec "$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable, "-m",
                        "neuron_prof.reports.stored", str(run_dir)], env=env, timeout=10, check=False,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("neuron_prof: the run's summary is left to its first reader (%s)", exc)

