"""Opening a run's files as untrusted input: regular files only, never through a symlink, never
more bytes than the reader expects.

Runs travel (copied from clusters, attached to bug reports, served to a team by the viewer), so a
path in a run directory may be a symlink to ``/etc/shadow`` or ``/dev/zero``, a FIFO that blocks
every reader, or a directory. Each reader opens through here, and every such case becomes a
:class:`~neuron_prof.errors.NeuronProfError` that names the file, instead of a hang, an unbounded
read or a disclosed file. The checks are made on the open file descriptor (``O_NOFOLLOW``, then
``fstat``), so swapping the file between a check and the read changes nothing.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from neuron_prof.errors import NeuronProfError

_KIND = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def open_regular(path: Path, what: str, fix: str) -> tuple[int, int]:
    """``(fd, size)`` of the regular file at ``path``; the caller closes ``fd``.

    ``FileNotFoundError`` passes through (a missing file means different things to different
    readers); anything else that is not a readable regular file is a NeuronProfError whose message
    ends with ``fix``. ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a
    writer; it changes nothing for regular files.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NeuronProfError(f"{path}: {what} is a symbolic link; neuron_prof reads only regular files in a "
                                  f"run (a link could point anywhere); {fix}") from None
        raise NeuronProfError(f"{path}: cannot read the {what} ({exc.strerror}); {fix}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = _KIND.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise NeuronProfError(f"{path}: {what} is {kind}, not a regular file; {fix}")
    return fd, st.st_size


def read_at(fd: int, offset: int, n: int) -> bytes:
    """Exactly ``n`` bytes from ``offset`` (fewer only if the file ends first)."""
    parts, got = [], 0
    while got < n:
        chunk = os.pread(fd, min(n - got, 1 << 30), offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_small(path: Path, what: str, fix: str, limit: int) -> bytes:
    """A whole file that has no business being larger than ``limit`` bytes (a JSON document)."""
    fd, size = open_regular(path, what, fix)
    try:
        if size > limit:
            raise NeuronProfError(f"{path}: {what} is {size} bytes, more than one can be ({limit}); {fix}")
        return read_at(fd, 0, size)
    finally:
        os.close(fd)
