"""User ranges: ``with neuron_prof.mark("data"):`` or ``@neuron_prof.mark("fwd")``."""
from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable, TypeVar

from neuron_prof import session as _session
from neuron_prof.recording import Frame

F = TypeVar("F", bound=Callable[..., Any])
_MAX_FRAMES = 16


def _caller_stack(depth: int) -> list[Frame]:
    """The user's frames from the caller outwards, at the lines that executed."""
    frames: list[Frame] = []
    f = sys._getframe(depth + 1)
    while f is not None and len(frames) < _MAX_FRAMES:
        code = f.f_code
        if not code.co_filename.endswith(("contextlib.py", "neuron_prof/marks.py")):
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
        sess = _session.current()
        if sess is not None and sess.recording:
            self._stack = _caller_stack(1)
            self._t0 = time.monotonic_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._t0:
            return
        t1 = time.monotonic_ns()
        sess = _session.current()
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
