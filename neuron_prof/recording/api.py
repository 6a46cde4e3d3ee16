"""The recording API: everything a collector may know of the session.

Collectors import this module, ``neuron_prof.recording.torchhooks`` (how to hand torch a callback
without changing what torch does) and the store's table definitions (``neuron_prof.store.schema``);
never the session, the viewer, an exporter or another collector (DESIGN.md). The session
implements it.
"""
from __future__ import annotations

import importlib.util
import os
from types import FrameType
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from neuron_prof.store.schema import Frame


def framework_prefixes() -> list[str]:
    """File-name prefixes of code that is not the user's: torch and its sibling packages,
    neuron_prof (its collectors included) and frozen modules. Collectors leave such frames out
    of user stacks."""
    out = ["<frozen"]
    for pkg in ("torch", "functorch", "torchgen", "neuron_prof"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            out.append(os.path.join(os.path.abspath(loc), ""))
    collectors = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "collectors", "")
    out.append(collectors)  # installed as neuron_prof.collectors from a folder beside neuron_prof/
    return list(dict.fromkeys(out))


Batch = Mapping[str, Any]
"""What collectors hand the Recorder for one table: its columns, or its rows as a structured array
of the table's journal layout (``schema.row_dtype``; indexing it by a column name works alike)."""


def batch_len(batch: Batch) -> int:
    return len(batch) if isinstance(batch, np.ndarray) else len(next(iter(batch.values()), ()))


def batch_since(batch: Batch, t0: int) -> Batch:
    """The rows of ``batch`` that began at ``t0`` or later (its ``ts`` column)."""
    ts = np.asarray(batch["ts"])
    if not len(ts) or ts.min() >= t0:
        return batch
    keep = ts >= t0
    return batch[keep] if isinstance(batch, np.ndarray) else {k: np.asarray(v)[keep] for k, v in batch.items()}


class Recorder(Protocol):
    """Where collectors put what they captured. Ids it hands out are valid for this rank's run."""

    def intern(self, s: str) -> int:
        """Id of ``s`` in the rank's ``strings`` table (0 is the empty string)."""

    def intern_stack(self, frames: Sequence[Frame]) -> int:
        """Id of a Python stack (innermost frame first) in the ``stacks`` table (0 = no stack)."""

    def append(self, table: str, columns: Batch) -> None:
        """Buffer rows for ``table`` (columns, or rows in its journal layout, which a journaled
        table stores as they are); the session writes them at the next flush."""

    def scalar(self, name: str, value: Any) -> None:
        """A scalar of the current step (``metrics``): a float, or a one-element tensor detached
        from its graph, which the session reads at a step boundary (never inside the step)."""

    def kept_for_us(self) -> list[Any]:
        """Device tensors that nothing but neuron_prof keeps alive now (the scalars it has not
        read yet): the memory collector charges their blocks to neuron_prof, not to the user."""

    def dropped(self, table: str, n: int) -> None:
        """Count ``n`` events of ``table`` lost to the buffer cap (shown as capture health)."""

    def failure(self, collector: str, exc: BaseException) -> None:
        """Record that a collector failed; logs once per collector, never raises."""

    def training_began(self, ts: int) -> None:
        """The process's first top-level module call began at ``ts`` (the end of its start-up
        when capture began with the process)."""

    def rank_file(self, name: str) -> int | None:
        """An fd of a new file in this rank's folder, outside the tables (a ring a collector maps
        so that what it holds survives kill -9); None if this process may not write the rank."""

    @property
    def closing(self) -> bool:
        """True in the capture's final flush: hand over what is still open."""

    @property
    def follows_cpu_memory(self) -> bool:
        """Whether CPU allocations are followed outside detail windows too (always-on capture
        leaves them to its sampled steps unless asked: see neuron_prof.capture.always_on.AlwaysOn)."""


class Collector(Protocol):
    """One event source. Lifecycle: install → (window on/off, flush)* → uninstall."""

    name: str

    def install(self, rec: Recorder) -> None:
        """Hook into torch; capture stays off until ``window(True)``."""

    def window(self, on: bool) -> None:
        """Switch detailed capture on (warmup/active steps) or off (wait steps, between windows)."""

    def flush(self, rec: Recorder, keep: bool) -> None:
        """Hand buffered events to ``rec.append`` (``keep=False``: warmup data, discard it)."""

    def uninstall(self) -> None:
        """Remove every hook; the process must be as if the collector never ran."""

    # Optional (the session calls them when a collector has them):
    #   on_step(step: int, ts: int) -> None          every step boundary, windows or not: keep it cheap
    #   on_error(rec, exc: BaseException, step: int)  the capture ends with this exception
    #   on_dump(rec, ts: int) -> None                an always-on dump at ts (any thread): append what
    #                                                 says where the job is now (collectives in flight,
    #                                                 device queues), beside the threads' stacks
    #   exclude(ns: int) -> None                      the session's own work at a step boundary just
    #                                                 took ns on the calling thread: ops open there
    #                                                 (torch.optim's step range) must not count it


def frames_of(frame: FrameType | None, limit: int = 64) -> list[Frame]:
    """A Python stack as (file, function, line), innermost first."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_filename, getattr(code, "co_qualname", code.co_name), frame.f_lineno or 0))
        frame = frame.f_back
    return out
