"""The size and SHA-256 of each source file a capture's stacks name, so that whatever shows source
later shows only the file that ran.

A run names files by path, and a path proves nothing when the run is read: the file may have been
edited since, or the run's maker may have put a link to a secret at that path. So capture hashes
each file its stacks name, once per file (table ``source_files``), and a reader shows a file only
if the bytes it reads now are those bytes (``viewer/source.py``; docs/viewer.md, "Security").
Both sides read through :func:`read_source`: links resolved first, then a regular file of at most
``MAX_SOURCE_BYTES`` opened without following a link.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.safefile import open_regular, read_at

MAX_SOURCE_BYTES = 8 * 2**20
"""A larger file is not hashed at capture nor shown: no source file of a training script is this big."""


@dataclass(frozen=True)
class SourceDigest:
    """What capture read of one file: ``size`` bytes with SHA-256 ``sha256`` (hex), or, where it
    could not read it, size -1, no hash and ``error`` saying why."""
    size: int
    sha256: str
    error: str = ""


def read_source(path: str | os.PathLike) -> bytes:
    """The whole file ``path`` resolves to (every link followed first), if that is a regular file of at
    most ``MAX_SOURCE_BYTES``; else OSError or NeuronProfError. The resolved path is opened without
    following a link, so a link swapped in after resolving is refused, not followed."""
    with open_regular(os.path.realpath(path)) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_SOURCE_BYTES:
            raise NeuronProfError(f"{path}: is {size} bytes, more than a source file neuron_prof reads "
                                  f"({MAX_SOURCE_BYTES})")
        return read_at(f, 0, size)


def digest_of(data: bytes) -> SourceDigest:
    return SourceDigest(len(data), hashlib.sha256(data).hexdigest())


def digest(path: str | os.PathLike) -> SourceDigest:
    """The file ``path`` names, as :func:`read_source` reads it, or why it could not (never raises:
    a file capture cannot read is recorded as such, and training goes on)."""
    try:
        return digest_of(read_source(path))
    except (OSError, ValueError, NeuronProfError) as exc:  # ValueError: a name no path can have (a NUL in it)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return SourceDigest(-1, "", str(exc) if isinstance(exc, NeuronProfError) else f"{path}: {why}")


def source_rows(files: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """``source_files`` rows for ``files`` ((string id, path) each, a path relative to the current
    folder as the interpreter recorded it)."""
    digests = [digest(name) for _, name in files]
    return {"file": np.array([sid for sid, _ in files], dtype=np.int32),
            "size": np.array([d.size for d in digests], dtype=np.int64),
            "sha256": [d.sha256 for d in digests], "error": [d.error for d in digests]}
