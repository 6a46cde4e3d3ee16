"""The run's summary stored in the run (``RUN/summary.json``), so opening a big run does not
compute it again.

``summarize`` (``summary.build``) of a 10M-op run takes 5-9 s and most of 2 GB, and the viewer's Overview and
``neuron-prof report`` needed it on every open. The summary depends only on the run's committed
data and on the code that computed it, so it is written once (at the end of capture:
:func:`store_summary`; or by the first reader that had to compute it) and read back while both
are unchanged. The file holds ``{"version", "key", "summary"}``; ``key`` is a SHA-256 over
:data:`SUMMARY_VERSION`, the reading side's sources and the pandas/numpy/pyarrow versions, ``top``,
and what the reader read the summary from (:func:`summary_key`), so a run still being written
or written again, a copy with an edited rank.json, or a summary made by other code reads as
stale and is computed again.

The file is untrusted like every run file: read as a regular file only, at most
:data:`MAX_BYTES`, parsed without NaN or deep nesting (``documents.parse``), and used only if
its version and key match and the summary has the types of ``summary.sections``
(``Summary.from_json``).
Anything else (missing, stale, damaged, hostile) is no stored summary: the summary is computed,
never an error. Writing may fail (a read-only run): then nothing is stored.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from neuron_prof.store import documents
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import atomic_output, read_whole
from neuron_prof.analysis.flops import PeakRequest
from neuron_prof.reports.summary.build import TOP_N, command_exit, read_against, summarize
from neuron_prof.reports.summary.codec import NotASummary
from neuron_prof.reports.summary.sections import Summary

__all__ = ["SUMMARY_FILE", "SUMMARY_VERSION", "MAX_BYTES", "counts", "summary_key", "load_summary",
           "write_summary", "run_summary", "store_summary"]

SUMMARY_FILE = "summary.json"
SUMMARY_VERSION = 1
"""The file's layout; bump when it changes (a change of the summary itself changes the code digest)."""
MAX_BYTES = 64 << 20
"""Larger summaries are not stored (nor read): parsing one would cost what computing saves."""

counts = {"stored": 0, "computed": 0}
"""Summaries this process read back (:func:`load_summary`) and computed (:func:`run_summary`):
the evidence tests use that a stored summary was read, which timings cannot give."""

log = logging.getLogger("neuron_prof")


_COMPUTED_BY = ("reports/summary/*", "reports/stored", "reports/records", "store/*", "backends/op_devices",
                "paths", "units", "errors", "analysis/*")
"""The modules of the reading side, which the summary is computed by (``neuron_prof/NAME.py``)."""


def _code_digest() -> str:
    """The sources the summary is computed by (:data:`_COMPUTED_BY`, as they are on disk now) and
    the versions of pandas, numpy and pyarrow: a summary made by other code (an upgrade, an
    edit) is stale whether or not anyone bumped a version. About 1 ms; the capture side's own
    modules are not in it, so changing them keeps stored summaries."""
    import numpy
    import pandas
    import pyarrow
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{pandas.__version__} {numpy.__version__} {pyarrow.__version__}".encode())
    for path in sorted(p for name in _COMPUTED_BY for p in root.glob(f"{name}.py")):
        h.update(b"\0" + str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


_ENDED = ("exit", "end_time_ns")
"""run.json fields ``record`` adds once the command has ended, after every rank closed (and
stored the summary): left out of the key, and the summary's copy (``health.command_exit``)
placed from run.json as read (:func:`_placed`), so the summary stored at capture end stays fresh."""


def summary_key(run: Run, top: int = TOP_N) -> str | None:
    """What the summary of ``run`` was computed from, as one digest: everything the reader read
    (run.json, each rank's rank.json and last commit, which names the committed size and CRC-32
    of every table and journal, the bytes past the commit, the in-flight ring and the step ring's
    steps of a rank that did not close, conflict notes, ignored and missing rank folders), the
    code and ``top``. None for a run with a rank written before checksums (schema 1), whose commit
    does not pin its bytes."""
    if any(rd.meta.get("schema_version", 1) < 2 for rd in run.rank_data):
        return None
    state = {
        "version": SUMMARY_VERSION, "code": _code_digest(), "top": top,
        "meta": {k: v for k, v in run.meta.items() if k not in _ENDED},
        "ranks": [{"dir": rd.dir.name, "meta": rd.meta, "commit": rd.last_commit, "ignored": rd.ignored_bytes,
                   "inflight": None if rd.inflight is None else hashlib.sha256(rd.inflight.tobytes()).hexdigest(),
                   "ring_steps": None if rd.ring_steps is None else hashlib.sha256(rd.ring_steps.tobytes()).hexdigest()}
                  for rd in run.rank_data],
        "stale": [d.name for d in run.stale_rank_dirs], "missing": run.missing_ranks,
        "conflicts": run.conflicts.to_dict("records"),
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def _placed(summary: Summary, run: Run) -> Summary:
    """The summary as ``summarize`` gives it for ``run`` as this reader opened it: the paths in it
    are the run's path as given (relative, moved, copied), not the writer's, and how a recorded
    command ended is run.json's (written after the capture stored the summary)."""
    summary.run.path = str(run.path)
    summary.health.stale_rank_dirs = [str(d) for d in run.stale_rank_dirs]
    summary.health.command_exit = command_exit(run.meta.get("exit"))
    return summary


def load_summary(run: Run, top: int = TOP_N) -> Summary | None:
    """The stored summary of ``run`` if it is fresh and sound; None otherwise (missing, stale, of
    another version, unreadable, damaged or not of ``summarize``'s shape). Never raises for what
    the file holds."""
    key = summary_key(run, top)
    if key is None:
        return None
    path = run.path / SUMMARY_FILE
    try:
        doc = documents.parse(read_whole(path, MAX_BYTES), path, "stored summary", "")
    except (OSError, NeuronProfError):  # missing, a link, FIFO or folder, too large, not JSON
        return None
    if type(doc.get("version")) is not int or doc["version"] != SUMMARY_VERSION or doc.get("key") != key:
        return None
    try:
        summary = Summary.from_json(doc.get("summary"))
    except NotASummary:
        return None
    counts["stored"] += 1
    return _placed(summary, run)


def write_summary(run: Run, summary: Summary, top: int = TOP_N) -> bool:
    """Store ``summary`` (``summarize(run, top)``) in the run; whether it was. Not stored: a run
    without checksums, a summary that JSON cannot hold exactly (NaN) or larger than
    :data:`MAX_BYTES`, something other than a regular file at ``summary.json`` (never replaced),
    or a run directory that cannot be written."""
    key = summary_key(run, top)
    if key is None:
        return False
    try:
        data = json.dumps({"version": SUMMARY_VERSION, "key": key, "summary": summary.to_json()}, allow_nan=False,
                          separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return False
    if len(data) > MAX_BYTES:
        return False
    path = run.path / SUMMARY_FILE
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False  # a link, FIFO or folder someone put there: not ours to replace
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        with atomic_output(path) as f:  # a new file renamed onto the name: readers never see half of it
            f.write(data)
    except OSError:
        return False
    return True


def run_summary(run: Run, top: int = TOP_N, store: bool = True, peaks: PeakRequest = PeakRequest()) -> Summary:
    """``summarize(run, top, peaks)``: read from the run when the stored one is fresh, else computed
    (and, with ``store``, stored for the next reader: a run captured without it, or changed since).
    The stored summary is the one of no peak (``PeakRequest()``, what the capture stores; the peak
    is the reader's): for another request a stored one is read against the peaks asked for
    (``read_against``), never served as it is, and one computed for it is stored as the summary of no
    peak (``summarize`` again, over the same cached analyses)."""
    summary = load_summary(run, top)
    if summary is not None:
        return read_against(summary, peaks)
    summary = summarize(run, top, peaks)
    counts["computed"] += 1
    if store and top == TOP_N:
        write_summary(run, summary if peaks == PeakRequest() else summarize(run, top), top)
    return summary


def store_summary(run_dir: str | os.PathLike) -> bool:
    """For the end of capture: compute the summary of the run in ``run_dir`` and store it in the
    run, if every rank of the run has closed (a rank still writing would make it stale at once;
    the last rank to close stores it) and no fresh one is there already. True when a fresh
    summary is stored afterwards. Never raises: a run that cannot be read (no step completed,
    damaged: ``report`` says so) or written returns False; a failing analysis is logged too. Either
    way the run is left without one, and readers compute it."""
    try:
        run = Run(run_dir)
        if run.missing_ranks or not all(rd.closed for rd in run.rank_data):
            return False
        if load_summary(run) is not None:
            return True
        return write_summary(run, summarize(run))
    except NeuronProfError:
        return False
    except Exception as exc:  # noqa: BLE001 - the training is over; its run must not fail for a cache
        log.warning("neuron_prof: the run's summary was not stored (%s: %s); `neuron-prof report` computes it",
                    type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
        return False


if __name__ == "__main__":  # the end of a big capture (neuron_prof.capture.session.summarize_later)
    import sys

    store_summary(sys.argv[1])
