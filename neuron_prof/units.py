"""How byte counts read everywhere (report, findings, trace labels, viewer): one spelling; and
how a byte count written by a person or a program (a command-line size, an out-of-memory
message) is read: one meaning."""
from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.I)
_PREFIXES = {"k": 1, "m": 2, "g": 3, "t": 4}
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1, **{p + "b": 1000**n for p, n in _PREFIXES.items()},
          **{p + suffix: 1024**n for p, n in _PREFIXES.items() for suffix in ("", "ib")}}
"""Lower-case unit -> bytes (``parse_bytes``)."""


def format_bytes(n: float, digits: int = 1) -> str:
    """Bytes with a binary unit, like the allocator's block sizes: ``2.0 MiB``, ``24.1 KiB``, ``16 B``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"


def format_count(n: float) -> str:
    """A count in a few digits, like ``format_bytes`` with decimal units: ``950``, ``12.3k``, ``4.1M``."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def parse_bytes(text: str) -> int:
    """A byte count: a number and an optional unit, ``300000``, ``4096 bytes``, ``20.00 MiB``,
    ``500MB``, ``512M`` (fractions of a byte dropped).

    Units mean what SI and IEC say, whoever wrote them (case does not matter): ``kB``, ``MB``,
    ``GB``, ``TB`` are powers of 1000; ``KiB``, ``MiB``, ``GiB``, ``TiB`` powers of 1024. A bare
    ``K``, ``M``, ``G``, ``T`` (no ``B``) is binary, as coreutils and torch's own settings read
    it, so ``512M`` is 512 MiB; ``B``, ``byte``, ``bytes`` or nothing: bytes. ``ValueError`` for
    anything else (a negative number, an unknown unit)."""
    m = _SIZE.fullmatch(text.strip())
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if unit is None:
        raise ValueError(f"not a byte count: {text!r}")
    number = m.group(1)
    return int(number) * unit if number.isdigit() else int(float(number) * unit)
