"""Opening files that a run names or holds, and writing outputs next to them, without following links.

A run directory is someone else's data: copied from a cluster, attached to a bug report, served
by the viewer. It may hold a symbolic link (to ``/etc/shadow``, to ``/dev/zero``), a FIFO that
blocks every reader, or a directory where a file is expected. Checking a path first and opening it
after leaves a gap in which the path can change, so every check here is made on the opened
descriptor: reads open with ``O_NOFOLLOW`` (the final component must not be a link) and
``O_NONBLOCK`` (a FIFO must not hang the open), then ``fstat`` says whether it is a regular file,
and they never read more than the caller expects. Writes never open the destination at all: they
go to a new temporary file in the destination's folder (``O_CREAT|O_EXCL|O_NOFOLLOW``) that
``os.replace`` then renames onto it; a rename replaces a link or another file's name, never
writes through it.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from neuron_prof.errors import NeuronProfError

__all__ = ["NotRegularFile", "ACCESS_ADVICE", "cannot_read", "kind", "open_regular", "read_regular", "read_whole",
           "read_at", "atomic_output"]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(NeuronProfError):
    """``path`` is a symbolic link, a FIFO, a device, a folder ...: not read, not written through."""

    def __init__(self, path: str | os.PathLike, what: str, advice: str = "") -> None:
        self.path, self.what = str(path), what
        super().__init__(f"{path}: is {what}, not a regular file" + (f"; {advice}" if advice else ""))


ACCESS_ADVICE = "give this user read access to it (chmod or chown), or run as a user who has it"


def cannot_read(path: str | os.PathLike, exc: OSError, advice: str = "") -> NeuronProfError:
    """The one-line error for a file or folder the OS refuses to read: it names ``path`` and says
    what to do (no permission: :data:`ACCESS_ADVICE`; another failure: ``advice``)."""
    if isinstance(exc, PermissionError):
        advice = ACCESS_ADVICE
    return NeuronProfError(f"{path}: cannot read it ({exc.strerror or exc})" + (f"; {advice}" if advice else ""))


def kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, as an error message names it."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str | os.PathLike, advice: str = "", follow_links: bool = False) -> BinaryIO:
    """``path`` opened for reading if it is a regular file and not a link; else :class:`NotRegularFile`
    (``advice`` ends its message). A missing file is ``FileNotFoundError`` (it means different
    things to different readers); any other failure to open (no permission, a socket) is a
    NeuronProfError that names the file. ``follow_links``: for a path the user typed (``inspect
    TRACE``), whose link is the user's own; its target must still be a regular file."""
    try:
        fd = os.open(path, _READ_FLAGS & ~os.O_NOFOLLOW if follow_links else _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if not follow_links and os.path.islink(path):  # ELOOP: the final component is a link
            raise NotRegularFile(path, "a symbolic link", advice) from None
        raise cannot_read(path, exc, advice) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, kind(mode), advice)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int, advice: str = "") -> bytes:
    """At most ``limit`` bytes from the start of a regular file (see :func:`open_regular`)."""
    with open_regular(path, advice) as f:
        return f.read(limit)


def read_whole(path: str | os.PathLike, limit: int, advice: str = "", follow_links: bool = False) -> bytes:
    """A whole regular file that has no business being larger than ``limit`` bytes (a JSON
    document); a larger one is a NeuronProfError, not read. ``follow_links``: see :func:`open_regular`."""
    with open_regular(path, advice, follow_links) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise NeuronProfError(f"{path}: is {size} bytes, more than such a file can be ({limit})"
                                  + (f"; {advice}" if advice else ""))
        return read_at(f, 0, size)


def read_at(f: BinaryIO, offset: int, n: int) -> bytes:
    """Exactly ``n`` bytes of ``f`` from ``offset`` (fewer only if the file ends first)."""
    parts, got = [], 0
    while got < n:
        chunk = os.pread(f.fileno(), min(n - got, 1 << 30), offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: int | None = None) -> Iterator[BinaryIO]:
    """A new file that becomes ``path`` when the block ends without an exception (and is removed
    otherwise). Whatever was at ``path`` (a file, a link) is replaced, never written to; whether
    it may be replaced at all is the caller's decision (e.g. ``neuron_prof.export.output``).
    ``mode``: the file's permissions (default: what ``open()`` would make under the umask)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")  # O_EXCL|O_NOFOLLOW
    try:
        with os.fdopen(fd, "wb") as f:
            # what open() would have made, not mkstemp's 0600, unless the caller says
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it, a race with other threads)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022
