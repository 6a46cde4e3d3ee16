"""On-demand capture of a running job: ``neuron-prof trigger PID`` and ``neuron_prof.trigger``.

A job in always-on mode records full detail one step in N. When someone wants a closer look now
(a slow phase, a PrivateUse1 device that Kineto's on-demand path does not cover), restarting the
job loses the state they want to see. So each capturing always-on process *announces* itself,
and anyone of the same user can ask it to capture its next N steps in full detail.

The channel is files, because they need nothing running beside the job (no port, no thread that
listens) and the session's background thread already wakes about once a second:

* a per-user folder, ``$XDG_RUNTIME_DIR/neuron_prof`` or else ``/tmp/neuron_prof-<uid>``, made with
  mode 0700 and refused unless it is a real folder (not a link) of this user that nobody else may
  write: another user must never plant an announcement or a request;
* ``<pid>.json``: the announcement (pid, the pid's start time, run directory, rank), written
  atomically by :meth:`ControlChannel.open`, removed by :meth:`ControlChannel.close`. The start
  time (``/proc/<pid>/stat``) makes an announcement left by a killed process worthless to the next
  process that gets its pid;
* ``<pid>-<id>.request``: a request for N steps, written atomically by :func:`request`, consumed
  by :meth:`ControlChannel.poll`;
* ``<pid>-<id>.done``: the steps that were captured, written by :meth:`ControlChannel.done` for the
  requester that waits (``wait_s``), who removes it.

Every file is opened without following links and must be a regular file; nothing here reads a
run directory or writes outside the folder.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import atomic_output

__all__ = ["ControlChannel", "TriggerResult", "request", "runtime_folder"]

log = logging.getLogger("neuron_prof")

_ANNOUNCE = "{pid}.json"
_REQUEST_SUFFIX = ".request"
_DONE_SUFFIX = ".done"
_MAX_FILE = 64 << 10  # an announcement or a request is a few hundred bytes
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_START_FIX = "start the job with neuron-prof record --always-on or profile(mode=\"always-on\")"
_WAIT_POLL_S = 0.1


@dataclass(frozen=True)
class TriggerResult:
    """What :func:`request` got: the process asked, the run and rank it writes, and the steps it
    captured in full detail (once it said so; [] when the request did not wait)."""

    pid: int
    run_dir: Path
    rank: int
    steps: list[int] = field(default_factory=list)


def runtime_folder(make: bool = False) -> Path:
    """This user's folder of announcements and requests (the module docstring says where), made
    if ``make``. Raises NeuronProfError if it is not safe to use: a link, another user's, or one
    that others may write."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    uid = os.getuid()
    folder = Path(base) / "neuron_prof" if base and os.path.isabs(base) else Path(f"/tmp/neuron_prof-{uid}")
    if make:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise NeuronProfError(f"{folder}: cannot make the on-demand folder ({exc.strerror or exc})") from None
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return folder
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise NeuronProfError(f"{folder}: not a private folder of this user (a link, another user's, or open to "
                              "others); remove it so neuron_prof can make its own")
    return folder


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22): with the pid,
    it names one process, even after the pid is reused. None if there is no such process."""
    fields = _stat(pid)
    try:
        return None if fields is None else int(fields[19])
    except (ValueError, IndexError):
        return None


class ControlChannel:
    """A capturing always-on process's end of the channel (the session's background thread polls it)."""

    def __init__(self, folder: Path, pid: int, start: int, run_dir: Path, rank: int) -> None:
        self.folder = folder
        self.pid = pid
        self._start = start
        self.run_dir = run_dir
        self.rank = rank
        self._answering: list[str] = []
        """Ids of the requests polled and not yet answered: :meth:`done` answers them."""
        self._lock = threading.Lock()  # poll (the background thread) and done (the training thread)
        self._prefix = f"{pid}-"

    @classmethod
    def open(cls, run_dir: Path, rank: int) -> "ControlChannel":
        """Announce this process (pid, start time, run directory, rank). Raises NeuronProfError if
        the per-user folder cannot be used (the caller goes on without on-demand capture)."""
        folder = runtime_folder(make=True)
        pid = os.getpid()
        start = process_start(pid)
        if start is None:
            raise NeuronProfError(f"/proc/{pid}/stat: cannot read this process's start time; on-demand capture is off")
        channel = cls(folder, pid, start, Path(run_dir).absolute(), int(rank))
        for stale in channel._mine(_REQUEST_SUFFIX, _DONE_SUFFIX):  # a killed process's, whose pid this is now
            _unlink(folder / stale)
        _write_atomic(folder / _ANNOUNCE.format(pid=pid), {
            "pid": pid, "start": start, "run_dir": str(channel.run_dir), "rank": channel.rank})
        return channel

    def poll(self) -> int | None:
        """The steps requested since the last poll (the most any one request asked for: the next N
        steps hold the next M < N), the requests consumed; None when there is none. One listing of
        a small folder: cheap enough for once a second."""
        if os.getpid() != self.pid:
            return None  # a forked child: the parent's channel
        steps = None
        for name in self._mine(_REQUEST_SUFFIX):
            path = self.folder / name
            doc = _read_json(path)
            _unlink(path)
            if doc is None or doc.get("start") != self._start:
                continue  # unreadable, or meant for an earlier process with this pid
            n = doc.get("steps")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                steps = max(steps or 0, n)
                if doc.get("wait"):
                    with self._lock:
                        self._answering.append(name[len(self._prefix):-len(_REQUEST_SUFFIX)])
        return steps

    def done(self, steps: list[int]) -> None:
        """The steps captured for the requests polled so far, for each requester that waits."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            answering, self._answering = self._answering, []
        for rid in answering:
            try:
                _write_atomic(self.folder / f"{self._prefix}{rid}{_DONE_SUFFIX}",
                              {"steps": [int(s) for s in steps], "run_dir": str(self.run_dir), "rank": self.rank})
            except OSError as exc:
                log.warning("neuron_prof: could not answer an on-demand request (%s)", exc)

    def close(self) -> None:
        """Withdraw the announcement and the requests not yet taken (a waiting requester then
        learns the job ended). In a forked child it does nothing: the files are the parent's."""
        if os.getpid() != self.pid:
            return
        _unlink(self.folder / _ANNOUNCE.format(pid=self.pid))
        for name in self._mine(_REQUEST_SUFFIX):
            _unlink(self.folder / name)

    def _mine(self, *suffixes: str) -> list[str]:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return sorted(n for n in names if n.startswith(self._prefix) and n.endswith(suffixes))


def request(pid: int, steps: int, wait_s: float | None = None) -> TriggerResult:
    """Ask process ``pid`` (capturing in always-on mode) to capture its next ``steps`` steps in full
    detail. ``wait_s``: wait up to that long for it to say which steps it captured (None: do not
    wait; the steps are then []). Raises NeuronProfError, one line, when ``pid`` runs no always-on
    capture or ended, or (waiting) it did not answer in time; ValueError for ``steps < 1``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, not {steps!r}")
    start = process_start(pid)
    if start is None:
        raise NeuronProfError(f"no process {pid} (it ended, or the pid is wrong)")
    folder = runtime_folder()
    doc = _read_json(folder / _ANNOUNCE.format(pid=pid))
    if doc is None or doc.get("start") != start:
        raise NeuronProfError(f"process {pid} runs no always-on capture{_announced_below(folder, pid)}; {_START_FIX}")
    rid = uuid.uuid4().hex
    _write_atomic(folder / f"{pid}-{rid}{_REQUEST_SUFFIX}",
                  {"steps": steps, "start": start, "wait": wait_s is not None, "time": time.time()})
    result = TriggerResult(pid=pid, run_dir=Path(str(doc.get("run_dir"))), rank=int(doc.get("rank", 0)))
    if wait_s is None:
        return result
    answer = _wait_for(folder, pid, start, rid, wait_s)
    return TriggerResult(pid=pid, run_dir=result.run_dir, rank=result.rank, steps=answer)


def _wait_for(folder: Path, pid: int, start: int, rid: str, wait_s: float) -> list[int]:
    done = folder / f"{pid}-{rid}{_DONE_SUFFIX}"
    deadline = time.monotonic() + wait_s
    while True:
        doc = _read_json(done)
        if doc is not None:
            _unlink(done)
            return [int(s) for s in doc.get("steps", [])]
        if process_start(pid) != start or not (folder / _ANNOUNCE.format(pid=pid)).exists():
            raise NeuronProfError(f"process {pid} ended its capture before it captured the steps asked for")
        if time.monotonic() >= deadline:
            raise NeuronProfError(f"process {pid} captured no step within {wait_s:g} s (is it still stepping?); "
                                  "the request stands: its next steps are captured when it steps again")
        time.sleep(_WAIT_POLL_S)


def _announced_below(folder: Path, pid: int) -> str:
    """", but its child process 124 does" where ``pid`` is a launcher (record, torchrun) whose
    descendants capture: what the user most likely meant."""
    try:
        names = os.listdir(folder)
    except OSError:
        return ""
    announced = [int(n[:-len(".json")]) for n in names if n.endswith(".json") and n[:-len(".json")].isdigit()]
    below = sorted(p for p in announced if _descends_from(p, pid))
    if not below:
        return ""
    one = len(below) == 1
    return (f", but its child process{'' if one else 'es'} {', '.join(map(str, below))} "
            f"do{'es' if one else ''} (trigger {'that pid' if one else 'one of them'})")


def _descends_from(child: int, ancestor: int) -> bool:
    for _ in range(64):  # a process tree is never this deep; the bound is against a loop
        fields = _stat(child)
        if fields is None or len(fields) < 2 or not fields[1].isdigit():
            return False
        child = int(fields[1])  # the parent
        if child == ancestor:
            return True
        if child <= 1:
            return False
    return False


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields after the command name (field 3 on), None if there is no such
    process. The name, in parentheses, may hold spaces and parentheses itself: split after the last."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        return text[text.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def _read_json(path: Path) -> dict | None:
    """A small regular file's JSON object, read without following a link; None otherwise."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > _MAX_FILE:
            return None
        doc = json.loads(os.read(fd, _MAX_FILE))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) else None


def _write_atomic(path: Path, doc: dict) -> None:
    """``doc`` as ``path``, which appears whole or not at all (a new 0600 file renamed onto it)."""
    with atomic_output(path, mode=0o600) as f:
        f.write(json.dumps(doc).encode())


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
