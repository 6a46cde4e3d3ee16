"""Which file an export may replace: nothing it did not write, unless the user says ``--force``.

The rule, checked on what is at the destination now (``lstat``, then the file's first bytes read
through ``O_NOFOLLOW``):

- nothing there: write;
- a regular file that starts the way export writes this format (a Perfetto trace whose first
  packet names neuron_prof as its writer; Chrome JSON starting ``{"displayTimeUnit":"ns",
  "traceEvents":[``; a protocol-4 pickle of a dict whose first key is ``segments``; gzip
  compressed when the name ends in .gz): replace it, so exporting again just works;
- anything else (a symbolic link, a FIFO, a device, a folder, a file of other content): refuse
  with one line naming the file and ``--force``.

Writing itself never follows a link either way (``neuron_prof.store.safefile.atomic_output`` renames a
new file onto the destination), so with ``--force`` a link is replaced and its target untouched.
"""
from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import kind, read_regular

__all__ = ["HEAD_BYTES", "written_by_export", "check_destination"]

HEAD_BYTES = 256  # the first packet / opening line / pickle header all fit
_WHAT = {"perfetto": "Perfetto trace", "chrome": "Chrome JSON trace", "memory-snapshot": "memory snapshot"}


def written_by_export(fmt: str, head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes, uncompressed) is how export starts a ``fmt`` file."""
    if fmt == "perfetto":  # TracePacket field 1, whose trace_attributes say writer = neuron_prof
        return head[:1] == b"\x0a" and b"neuron_prof" in head[:64]
    if fmt == "chrome":
        return head.startswith(b'{"displayTimeUnit":"ns","traceEvents":[')
    if fmt == "memory-snapshot":  # PROTO 4, FRAME, EMPTY_DICT, MEMOIZE, MARK, 'segments'
        return head.startswith(b"\x80\x04\x95") and head[11:24] == b"}\x94(\x8c\x08segments"
    raise ValueError(f"unknown export format {fmt!r}")


def _head(path: Path) -> bytes:
    head = read_regular(path, HEAD_BYTES, "remove it, choose another -o, or pass --force to replace it")
    if path.name.endswith(".gz"):
        try:
            return zlib.decompressobj(wbits=31).decompress(head, HEAD_BYTES)
        except zlib.error:
            return b""
    return head


def check_destination(path: Path, fmt: str, force: bool) -> None:
    """Raise :class:`NeuronProfError` unless export may write ``fmt`` to ``path`` (rule above)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise NeuronProfError(f"{path}: cannot check the output ({exc.strerror}); choose another -o") from None
    if stat.S_ISDIR(mode):
        raise NeuronProfError(f"{path}: is a directory; pass a file name to -o")
    if force:
        return
    what = _WHAT[fmt]
    if not stat.S_ISREG(mode):
        raise NeuronProfError(f"{path}: is {kind(mode)}, not a {what} neuron_prof wrote; export does not write "
                              "through it: remove it, choose another -o, or pass --force to replace it (a link's "
                              "target is left untouched)")
    try:
        ours = written_by_export(fmt, _head(path))
    except OSError as exc:
        raise NeuronProfError(f"{path}: cannot check the output ({exc}); choose another -o") from None
    if not ours:
        raise NeuronProfError(f"{path}: exists and is not a {what} neuron_prof wrote; choose another -o, or pass "
                              "--force to replace it")
