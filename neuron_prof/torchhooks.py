"""How neuron_prof hands torch its Python callbacks without changing what torch does.

Two helpers, for every callback neuron_prof installs into torch (global module hooks, optimizer
step hooks, the compiler collector's wrappers):

* :func:`when_imported` runs a set-up when a module is imported (at once if it already is). A
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

import importlib.abc
import sys
import threading
import types
from typing import Any, Callable

__all__ = ["when_imported", "hide_from_dynamo"]

_lock = threading.RLock()
_waiting: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_finding = threading.local()  # names this thread is looking up through the other finders


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for the module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # the module keeps its own loader
        self._loader.exec_module(module)
        _fire(module.__spec__.name)

    def __getattr__(self, name: str) -> Any:  # is_package, get_code, resource readers...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path`` while a callback waits: wraps the loader of a waited-for module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting or fullname in getattr(_finding, "names", ()):
            return None
        names = _finding.__dict__.setdefault("names", set())
        names.add(fullname)
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            names.discard(fullname)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def _fire(name: str) -> None:
    with _lock:
        callbacks = _waiting.pop(name, [])
        _update_finder()
    module = sys.modules.get(name)
    for cb in callbacks:
        if module is not None:
            cb(module)


def _update_finder() -> None:
    present = _FINDER in sys.meta_path
    if _waiting and not present:
        sys.meta_path.insert(0, _FINDER)
    elif not _waiting and present:
        sys.meta_path.remove(_FINDER)


def when_imported(name: str, callback: Callable[[types.ModuleType], None]) -> Callable[[], None]:
    """Call ``callback(module)`` once module ``name`` has been imported, on the importing thread
    right after the module's code ran; at once if it already is. Returns a function that cancels
    the call if it has not happened yet (nothing is left on ``sys.meta_path`` once no callback
    waits). ``callback`` must not raise: an import of the user's must never fail because of us."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return lambda: None
    with _lock:
        _waiting.setdefault(name, []).append(callback)
        _update_finder()

    def cancel() -> None:
        with _lock:
            callbacks = _waiting.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del _waiting[name]
            _update_finder()

    return cancel


def _code_of(fn: Callable) -> types.CodeType | None:
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def skip_frames(fn: Callable) -> None:
    """Never compile ``fn`` as a Dynamo frame, nor any frame it calls (Dynamo's ``SKIP`` strategy
    for its code, recursively: the per-code setting in torch's C extension, so it imports nothing).
    Does nothing on a torch without it."""
    code = _code_of(fn)
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return
    if code is not None:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


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
