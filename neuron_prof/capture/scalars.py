"""Scalars of the training (the loss, tokens per step, whatever ``neuron_prof.log`` names) as
``metrics`` rows, read without adding a host-device sync inside a step.

A value handed over as a tensor is not read when it is handed over: ``loss.item()`` in a hook
would make an asynchronous device drain its queue at every ``backward()``. A tensor on the host is
read at the boundary of its step (the loss collector hands a host loss over read, as a float). A
tensor on a device is kept (detached: a few bytes each) and read in a batch, ``DEVICE_READ_BATCH``
steps' worth at a time, or once the oldest has waited ``DEVICE_READ_AGE_S``, and at the end of
capture: a read of a device value waits for the device's queue, so it is paid once per batch (the
first read waits, the others find their values ready), at a step boundary, never inside a step.
The rows of a batch are written late, so a ``kill -9`` can lose that many steps of a device's loss
(and the session writes scalars about once a second: a kill -9 loses the last second's). Reading
is neuron_prof's own work: PyTorch's RecordFunction is off on the thread meanwhile, so it is no op
of the user's.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from neuron_prof import forks
from neuron_prof.errors import NeuronProfError
from neuron_prof.store.schema import TABLES, row_dtype
from neuron_prof.recording.torchhooks import without_ops

METRIC_ROW = row_dtype(TABLES["metrics"])
DEVICE_READ_BATCH = 64
DEVICE_READ_AGE_S = 30.0


_thread = threading.local()  # this thread's OS id, once asked (per fork: a forked child's thread has an id of its own)


def _native_thread_id() -> int:
    """``threading.get_native_id()``, asked once per thread: a value is handed over at every
    ``backward()``, and the system call costs more than the rest of the hand-over."""
    known = getattr(_thread, "known", None)
    if known is not None and known[0] == forks.generation():
        return known[1]
    tid = threading.get_native_id()
    _thread.known = (forks.generation(), tid)
    return tid


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "device")


def check_value(name: str, value: Any) -> Any:
    """What ``log`` stores for ``value``: a float, or a one-element tensor detached from its graph
    (so holding it keeps no saved tensors alive). A one-line error for anything else."""
    if not isinstance(name, str) or not name:
        raise NeuronProfError(f"neuron_prof.log: the name must be a non-empty string, not {name!r}")
    if _is_tensor(value):
        if value.numel() != 1:
            raise NeuronProfError(f"neuron_prof.log({name!r}): a tensor of {value.numel()} elements; "
                                  "log a scalar (a one-element tensor or a number)")
        return without_ops(value.detach)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise NeuronProfError(f"neuron_prof.log({name!r}): {type(value).__name__} is not a number") from None


def per_step(tokens: float | None, samples: float | None) -> dict[str, float]:
    """The per-step scalars given (``tokens``, ``samples``), checked (a one-line error for what is
    not a number)."""
    given = {name: v for name, v in (("tokens", tokens), ("samples", samples)) if v is not None}
    return {name: check_value(name, v) for name, v in given.items()}


def _read(rows: list[tuple[int, int, int, Any]]) -> list[tuple[int, int, int, float]]:
    """The rows with their tensors read (a value is a float or a one-element tensor)."""
    return [(ts, tid, name, v if isinstance(v, float) else float(v.item())) for ts, tid, name, v in rows]


class ScalarBuffer:
    """Values handed over since the last step boundary, and device tensors not read yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (ts, tid, name id, float or tensor): appended without the lock (a deque's append and
        # popleft are atomic), so a host value's hand-over takes none
        self._new: deque[tuple[int, int, int, Any]] = deque()
        self._on_device: list[tuple[int, int, int, Any]] = []  # device tensors, oldest first
        self._unsure: list[Any] = []  # device tensors waiting that the user may still hold
        self._ours: list[Any] = []  # device tensors waiting that nothing but this buffer keeps alive

    def ours_alone(self) -> list[Any]:
        """The device tensors waiting here that nothing but this buffer keeps alive (the user's
        loss of a step that ended, which the loop dropped after ``loss.item()``): their memory is
        neuron_prof's, not the user's, and the memory collector takes it off a boundary's live
        bytes, or a loop that keeps nothing would show a leak of one loss a step until the batch
        is read. A storage no tensor of the user's can reach stays so: each is asked until it is.
        (``untyped_storage()`` makes one reference of its own, the alias here the other.) On the
        training thread, at a step boundary (where device values are read, too)."""
        if not self._unsure:
            return self._ours
        import torch  # here: capture can begin before torch is imported (record)

        with self._lock:
            unsure, self._unsure = self._unsure, []
        still = []
        for t in unsure:
            (self._ours if torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2 else still).append(t)
        with self._lock:
            self._unsure[:0] = still
        return self._ours

    def add(self, name_id: int, value: Any) -> None:
        row = (time.monotonic_ns(), _native_thread_id(), name_id, value)
        if isinstance(value, float) or value.is_cpu or type(value) is not sys.modules["torch"].Tensor:
            self._new.append(row)
            return
        with self._lock:  # a plain device tensor: ours_alone asks about it
            self._new.append(row)
            self._unsure.append(value)

    def device_due(self) -> bool:
        """The device values waiting are due to be read (at a step boundary)."""
        waiting = self._on_device
        return bool(waiting) and (len(waiting) >= DEVICE_READ_BATCH
                                  or time.monotonic_ns() - waiting[0][0] >= DEVICE_READ_AGE_S * 1e9)

    def settle(self, final: bool = False, host_only: bool = False) -> np.ndarray | None:
        """At a step boundary: the rows whose values are read now, in the ``metrics`` layout
        (``final``: every value). None when there are none. ``host_only``: off the training
        thread (always-on capture's background writer): device values wait for a step boundary."""
        with self._lock:
            pop = self._new.popleft
            new = [pop() for _ in range(len(self._new))]  # what came meanwhile waits for the next
        ready = []
        for row in new:
            value = row[3]
            (ready if isinstance(value, float) or value.is_cpu else self._on_device).append(row)
        waiting = self._on_device
        if waiting and not host_only and (final or self.device_due()):
            ready += waiting
            self._on_device = []
            self._ours, self._unsure = [], []  # read now: released below, with the rows
        if not ready:
            return None
        values = ready if all(isinstance(r[3], float) for r in ready) else without_ops(_read, ready)
        return np.array(values, dtype=METRIC_ROW)
