"""What a collector's hook does with an exception it caught: account for it in Capture health.

A hook runs inside the user's program (a torch function we wrapped, a backend's report, a step
boundary). An exception of ours must never reach training, and must never vanish either: every
handler on a hook either re-raises (the exception is the user's), or says what was lost. Which,
the handler decides where it catches:

- **the collector cannot go on** (a hook that will not go in, a torch whose shape changed, a hook
  that cannot be put back): the collector tears itself down and calls ``rec.failure(name, exc)``.
  The session then counts that collector as off (its ``failures`` row, one warning). That is the
  Recorder's own call; nothing here adds to it.
- **one event is lost on a data path** (a record that could not be built, filed or parsed):
  :meth:`HookGuard.lost`. It counts the event with ``rec.dropped(table, n)`` (the rank's per-table
  dropped counts; ``run.health``'s ``events_dropped``, Capture health's "N dropped"), and the first
  loss of each table also records the exception with ``rec.failure`` under the label
  ``"<collector> (<table>)"``.

Why a failure row for the first lost event of a table: a dropped count alone reads like the buffer
cap (the same counter) and says nothing of why; the message is what a bug report needs. Why only
the first: a hook that fails on every event must not write a row (and a warning) per event; later
losses of that table are counted. Why the label and not the collector's name: the session switches
off the collector a failure names (``Session._guard`` skips its flush, window and uninstall), and
one odd event must not cost the rest of the capture, nor leave its hooks in torch.

Why a method the handler calls, not a decorator or context manager around the hook: a device
backend's ``report_*`` runs per op, and a ``try``/``except`` whose handler calls :meth:`lost` costs
nothing until something raises (CPython 3.11's zero-cost exceptions) where a wrapper would add a
call layer to every op; and a hook that wraps torch's function calls the original inside it, whose
exceptions are the user's and must reach them unchanged: only our bookkeeping around that call is
guarded, which a decorator on the whole wrapper could not tell apart.

Handlers that stay silent are control flow where nothing is lost (a probe whose "no answer" is an
answer: no compile in progress on this thread); each says so in a comment.
"""
from __future__ import annotations

from neuron_prof.recording.api import Recorder
from neuron_prof.store.schema import lost_events_label


class HookGuard:
    """One collector's account of events its hooks lost, kept in the recorder it is attached to.

    Hooks run on any thread: the set of tables already named is checked without a lock, so two
    threads losing the first event of one table at once may both record its message (two rows,
    harmless); the counts go through the recorder, which locks.
    """

    def __init__(self, collector: str) -> None:
        self.collector = collector
        self._rec: Recorder | None = None
        self._named: set[str] = set()  # tables whose first loss has its failure row

    def attach(self, rec: Recorder | None) -> None:
        """Account to ``rec`` from now on (at install); None at uninstall: a hook someone left
        wrapped around ours may still run, with no capture to account to."""
        self._rec = rec
        self._named = set()

    def lost(self, table: str, exc: BaseException, n: int = 1) -> None:
        """``n`` events of ``table`` were lost to ``exc``; ``n=0``: none that can be counted (a side
        record for later processes could not be kept; a device trace that could not be read, whose
        stretch the collector records as a gap), but the message is."""
        rec = self._rec
        if rec is None:
            return
        if n:
            rec.dropped(table, n)
        if table not in self._named:
            self._named.add(table)
            rec.failure(lost_events_label(self.collector, table), exc)
