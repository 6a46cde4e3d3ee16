"""Who records: the one session capturing in this process, and the one process that writes a
rank's folder.

A process records into one session at a time (``claim_process``; ``current`` says which). A
rank's folder belongs to the first process that claims it (``store.RankWriter``): another process
of the same rank writes nothing there and leaves a note saying who tried (``open_rank``), and a
launcher-like process that completed no step yields to the ranks its children wrote
(``yields_rank``). A forked child forgets its parent's session (``forget_in_child``).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.schema import rank_dir_name
from neuron_prof.store.writer import RankClaimed, RankWriter, run_ranks, write_conflict_note

if TYPE_CHECKING:
    from neuron_prof.capture.session import Session

log = logging.getLogger("neuron_prof")

_current: "Session | None" = None
_current_lock = threading.Lock()


def current() -> "Session | None":
    """The session recording in this process, if any."""
    return _current


def claim_process(session: "Session") -> None:
    """Make ``session`` this process's recording session; one at a time."""
    global _current
    with _current_lock:
        if _current is not None:
            raise NeuronProfError(
                f"a neuron_prof session is already recording to {_current.run_dir}; "
                "stop it before starting another (one session per process)")
        _current = session


def release_process(session: "Session") -> None:
    """``session`` no longer records in this process (if it was the one)."""
    global _current
    with _current_lock:
        if _current is session:
            _current = None


def forget_in_child(session: "Session") -> None:
    """In a forked child, right after fork with one thread alive: no lock is taken (another
    thread may have held it)."""
    global _current
    if _current is session:
        _current = None


def rank_and_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a half-initialised process group must not stop the capture
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def device_name() -> str:
    import torch
    acc = getattr(torch, "accelerator", None)
    try:
        dev = acc.current_accelerator() if acc is not None else None
    except Exception:
        dev = None
    return dev.type if dev is not None else "cpu"


def yields_rank(run_dir: Path, run_id: str, rank: int) -> bool:
    """Whether a capture that completed no step leaves ``rank`` to the processes of its run: a
    process with no rank of its own (no process group, no $RANK) that completed no step is a
    launcher-like parent, and any rank of this run written by its children wins."""
    taken = run_ranks(run_dir, run_id)
    return rank in taken or bool(taken and not has_own_rank())


def open_rank(run_dir: Path, rank: int, meta: dict[str, Any], report: bool) -> RankWriter | None:
    """The rank's writer, once this process owns the rank's folder (``meta``: its rank.json).
    None when another process owns it: the owner's files are never touched, and (``report``) a
    note in the run directory says who tried, for the report."""
    try:
        return RankWriter(run_dir / rank_dir_name(rank), meta)
    except RankClaimed as claim:
        if report:
            note = write_conflict_note(run_dir, rank, claim.holder.get("run_id") or meta["run_id"], claim)
            log.warning("neuron_prof: rank %d of %s is claimed by another process (%s); this process (pid %d) "
                        "records nothing (noted in %s)", rank, run_dir, claim, os.getpid(), note.name)
        return None


def has_own_rank() -> bool:
    """Whether a launcher gave this process a rank (or it joined a process group)."""
    if "RANK" in os.environ:
        return True
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False
