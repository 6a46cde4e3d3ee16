"""Step rows that survive a kill -9 between commits: a memory-mapped ring of fixed slots in the rank folder.

Outside detail windows (a schedule's wait steps, always-on's unsampled ones, steps after a budget
cut) the session commits step rows about once a second: a commit at every boundary is a journal
write and a manifest line on the training thread. Each step's row also goes, as the step ends,
into slot ``step % slots`` of ``steps.ring`` (schema.STEP_RING): a few plain stores into shared
pages, which the kernel keeps when the process dies, so a ``kill -9`` loses at most the step in
flight. A slot carries the CRC-32 of its row: one torn by the kill fails it and reads as absent.
The session commits before the ring would wrap over a row not committed yet (``room``), and
removes the ring when it closes the rank.
"""
from __future__ import annotations

import mmap
import struct
import zlib
from pathlib import Path

import numpy as np

from neuron_prof.store.safefile import atomic_output
from neuron_prof.store.schema import STEP_RING, STEP_RING_MAGIC, STEP_RING_SLOT

SLOTS = 4096
"""128 KB a rank. The session commits at least every ``SLOTS // 2`` steps (about once a second at
2,000 steps a second; once a second anyway)."""
HEADER = 64  # the layout of schema.INFLIGHT's: magic, slot size, slot count, header size
_ROW = struct.Struct("<i??2xqq")
_SLOT = struct.Struct("<i??2xqqI4x")  # the row, then its CRC-32
_CHECKED = STEP_RING_SLOT.fields["crc"][1]  # the bytes of a slot its crc covers
assert _ROW.size == _CHECKED and _SLOT.size == STEP_RING_SLOT.itemsize


class StepRing:
    """The ring of one rank's capture, mapped for writing (the session's lock held)."""

    def __init__(self, rank_dir: Path, slots: int = SLOTS) -> None:
        """Made whole under a temporary name, then renamed into place: a process killed while
        making it leaves no half-made ring for readers to refuse."""
        self.slots = slots
        self.path = rank_dir / STEP_RING
        self.room = slots // 2
        """Steps the session may leave uncommitted: the ring never laps a row it still needs."""
        with atomic_output(self.path) as f:
            f.write(struct.pack("<4q", STEP_RING_MAGIC, STEP_RING_SLOT.itemsize, slots, HEADER).ljust(HEADER, b"\0"))
            f.truncate(HEADER + slots * STEP_RING_SLOT.itemsize)
            f.flush()
            self._map = mmap.mmap(f.fileno(), 0)  # MAP_SHARED, read and write: outlives the file's fd

    def put(self, step: int, ts: int, dur: int, active: bool, complete: bool) -> None:
        """Step ``step``'s row, in its slot (about a microsecond: no system call)."""
        crc = zlib.crc32(_ROW.pack(step, active, complete, ts, dur))
        _SLOT.pack_into(self._map, HEADER + step % self.slots * _SLOT.size, step, active, complete, ts, dur, crc)

    def remove(self) -> None:
        """Unmapped and deleted, once the rank is closed: its tables hold every step, and its
        folder only what the disk budget counts (and the fixed files)."""
        self._map.close()
        self.path.unlink(missing_ok=True)


def intact(slots: np.ndarray) -> np.ndarray:
    """Which of ``slots`` (a ring's, as STEP_RING_SLOT) hold a whole row: their CRC-32 matches
    (a slot never written, or torn by the kill, does not)."""
    raw = slots.view(np.uint8).reshape(len(slots), STEP_RING_SLOT.itemsize)[:, :_CHECKED]
    return np.fromiter((zlib.crc32(r) for r in raw), np.uint32, len(slots)) == slots["crc"]
