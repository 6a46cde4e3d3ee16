"""What the user adds to the running capture by hand: ranges (``with neuron_prof.mark("data"):`` or
``@neuron_prof.mark("fwd")``) and scalars (``neuron_prof.log("lr", lr)``; how they are read:
``neuron_prof.capture.scalars``)."""
from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable, TypeVar

from neuron_prof.capture.ownership import current
from neuron_prof.store.schema import Frame
from neuron_prof.capture.scalars import check_value

F = TypeVar("F", bound=Callable[..., Any])
_MAX_FRAMES = 16


def _caller_stack(depth: int) -> list[Frame]:
    """The user's frames from the caller outwards, at the lines that executed."""
    frames: list[Frame] = []
    f = sys._getframe(depth + 1)
    while f is not None and len(frames) < _MAX_FRAMES:
        code = f.f_code
        if not code.co_filename.endswith(("contextlib.py", "neuron_prof/capture/marks.py")):
            frames.append((code.co_filename, code.co_name, f.f_lineno))
        f = f.f_back
    return frames


class mark:  # noqa: N801 - used like a function, as torch.profiler.record_function is
    """A named range on the calling thread's track; recorded only while a window is capturing."""

    __slots__ = ("name", "_t0", "_stack")

    def __init__(self, name: str) -> None:
        self.name = name
        self._t0 = 0
        self._stack: list[Frame] | None = None

    def __enter__(self) -> "mark":
        sess = current()
        if sess is not None and sess.recording:
            self._stack = _caller_stack(1)
            self._t0 = time.monotonic_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._t0:
            return
        t1 = time.monotonic_ns()
        sess = current()
        if sess is not None and sess.recording:
            sess.append("marks", {"ts": [self._t0], "dur": [t1 - self._t0], "tid": [threading.get_native_id()],
                                  "name": [sess.intern(self.name)],
                                  "stack": [sess.intern_stack(self._stack or [])]})
        self._t0 = 0

    def __call__(self, fn: F) -> F:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with mark(name):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


def log(name: str, value: Any) -> None:
    """Record ``value`` (a number, or a one-element tensor: read at a step boundary, not now) as
    the scalar ``name`` of the current step: tokens, learning rate, grad norm. Does nothing when
    no capture is running; a name or value it cannot record is a one-line ``NeuronProfError``."""
    value = check_value(name, value)
    sess = current()
    if sess is not None:
        sess.scalar(name, value)
