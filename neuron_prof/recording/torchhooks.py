"""How neuron_prof hands torch its Python callbacks without changing what torch does.

Two helpers, for every callback neuron_prof installs into torch (global module hooks, optimizer
step hooks, the compiler collector's wrappers):

* :func:`when_imported` (``neuron_prof.recording.imports``) runs a set-up when a module is
  imported (at once if it already is). A
  collector hooks ``torch._dynamo`` or Inductor only once the program imports them, so starting a
  capture never imports them (about 2 s each on a busy 2-core machine) and a process that never
  compiles never pays for them.
* :func:`hide_from_dynamo` keeps a callback out of ``torch.compile``'s sight. Dynamo meets a
  Python function in two ways. Called while compiled code runs but outside traced code (the
  global hooks of a compiled module, an optimizer hook in the frame that resumes after
  ``opt.step()``'s graph break), it is a *frame*, which Dynamo compiles: a compile id of its own
  that shifts every later one against an uncaptured run, and code that runs as Dynamo rewrote it
  (where ``torch.compiler.is_compiling()`` was true). Called from code Dynamo traces, it is
  *inlined*: a callback's own work (locks, clocks, files) is a graph break, and even one that
  returns at once changes Dynamo's decisions (a frame with an inlined call is compiled where an
  empty one is skipped). A hidden callback is neither: its code and everything it calls run as
  plain Python (the frame strategy Dynamo gives the code it skips, ``SKIP`` recursively), and
  traced code that calls it calls nothing (Dynamo's ``ignore_logging_functions``: no graph
  break, no inlined call). So a hook does not run where its call was traced into a graph (the
  modules inside a compiled module): compiled code runs without it, as it would uncaptured.
"""
from __future__ import annotations

import types
from typing import Any, Callable, Protocol

from neuron_prof.recording.imports import when_imported

__all__ = ["when_imported", "hide_from_dynamo", "skip_frames", "without_ops", "ProfilerWatcher",
           "watch_user_profilers"]


_record_function_switch: Callable[[bool], None] | None = None  # torch's, once torch is imported


def without_ops(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with PyTorch's RecordFunction off on this thread: the torch ops neuron_prof's
    own work runs (detaching a loss, reading it) are no ops of the user's, for neuron_prof's
    observer or torch.profiler. Runs at every step boundary: torch's switch is looked up once."""
    global _record_function_switch
    switch = _record_function_switch
    if switch is None:
        import torch.autograd

        switch = _record_function_switch = torch.autograd._enable_record_function
    switch(False)
    try:
        return fn(*args)
    finally:
        switch(True)


def _code_of(fn: Callable) -> types.CodeType | None:
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def skip_frames(fn: Callable, recursive: bool = True) -> None:
    """Never compile ``fn`` as a Dynamo frame, nor (``recursive``) any frame it calls (Dynamo's
    ``SKIP`` strategy for its code: the per-code setting in torch's C extension, so it imports
    nothing). ``recursive=False`` for a wrapper around torch's own code: what that calls (a user's
    backward hooks) is treated as it would be without the wrapper. Does nothing on a torch
    without it."""
    code = _code_of(fn)
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return
    if code is not None:
        inner = _FrameAction.SKIP if recursive else _FrameAction.DEFAULT
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, inner))


def hide_from_dynamo(fn: types.FunctionType) -> Callable[[], None]:
    """Make ``fn``, the very function object handed to torch, neither a Dynamo frame nor a call in
    traced code; see the module docstring. A plain function, not a bound method: Dynamo deep-copies
    its settings for every compile's metrics, and a method would drag its object along. Returns the
    undo (the frame strategy stays: it concerns neuron_prof's code only)."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"hide_from_dynamo takes a plain function, not {type(fn).__name__}")
    skip_frames(fn)
    state = {"config": None}

    def ignore(_dynamo: types.ModuleType) -> None:
        try:
            import torch._dynamo.config as config

            config.ignore_logging_functions.add(fn)
            state["config"] = config
        except Exception:  # noqa: BLE001 - a torch without it: the callbacks' own guards remain
            pass

    cancel = when_imported("torch._dynamo", ignore)

    def undo() -> None:
        cancel()
        config = state["config"]
        if config is not None:
            config.ignore_logging_functions.discard(fn)
            state["config"] = None

    return undo


class ProfilerWatcher(Protocol):
    """What a collector does when the job turns a torch profiler on or off (``watch_user_profilers``).
    Each method runs inside the job's call and must not raise."""

    def profiler_starting(self, phase: str) -> None:
        """Before torch's ``_prepare_profiler`` (``phase`` "prepare": torch.profiler's warmup) or
        ``_enable_profiler`` ("enable"), on the job's thread."""

    def profiler_start_failed(self) -> None:
        """``_enable_profiler`` raised (the job gets the exception)."""

    def profiler_stopped(self) -> None:
        """After ``_disable_profiler`` returned or raised."""


_watchers: list[ProfilerWatcher] = []
_profiler_originals: dict[str, Callable] = {}


def watch_user_profilers(watcher: ProfilerWatcher) -> Callable[[], None]:
    """Tell ``watcher`` when the job starts or stops a torch profiler: ``torch.autograd.profiler``'s
    ``_prepare_profiler``, ``_enable_profiler`` and ``_disable_profiler`` (what ``torch.profiler``,
    ``emit_nvtx`` and ``emit_itt`` call) are wrapped once, for every watcher: torch keeps one
    profiler state per thread and Kineto one trace per process, so a collector that holds either
    steps aside first. Returns the undo; torch's functions come back with the last watcher gone."""
    import torch.autograd.profiler as profiler

    if not _watchers:
        originals = {name: getattr(profiler, name, None) for name in _WRAPPERS}
        if any(fn is None for fn in originals.values()):
            return lambda: None
        _profiler_originals.update(originals)
        for name, wrapper in _WRAPPERS.items():
            skip_frames(wrapper, recursive=False)
            setattr(profiler, name, wrapper)
    _watchers.append(watcher)

    def undo() -> None:
        if watcher in _watchers:
            _watchers.remove(watcher)
        if not _watchers and _profiler_originals:
            for name, wrapper in _WRAPPERS.items():
                if getattr(profiler, name, None) is wrapper:
                    setattr(profiler, name, _profiler_originals[name])
            _profiler_originals.clear()

    return undo


def _prepare_profiler(*args: Any, **kwargs: Any) -> Any:
    for w in list(_watchers):
        w.profiler_starting("prepare")
    return _profiler_originals["_prepare_profiler"](*args, **kwargs)


def _enable_profiler(*args: Any, **kwargs: Any) -> Any:
    for w in list(_watchers):
        w.profiler_starting("enable")
    try:
        return _profiler_originals["_enable_profiler"](*args, **kwargs)
    except BaseException:
        for w in list(_watchers):
            w.profiler_start_failed()
        raise


def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
    try:
        return _profiler_originals["_disable_profiler"](*args, **kwargs)
    finally:
        for w in list(_watchers):
            w.profiler_stopped()


_WRAPPERS: dict[str, Callable] = {"_prepare_profiler": _prepare_profiler, "_enable_profiler": _enable_profiler,
                                  "_disable_profiler": _disable_profiler}
