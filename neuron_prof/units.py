"""How byte counts read everywhere (report, findings, trace labels, viewer): one spelling."""
from __future__ import annotations


def format_bytes(n: float, digits: int = 1) -> str:
    """Bytes with a binary unit, like the allocator's block sizes: ``2.0 MiB``, ``24.1 KiB``, ``16 B``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"
