"""Post-import hooks: run a set-up right after the program imports a module, never before.

Standard library only, and importable without the ``neuron_prof`` package: ``record``'s
``sitecustomize`` (which must cost next to nothing in every Python process of the command) loads
this file by its path to start capture at the program's import of torch, and
:mod:`neuron_prof.recording.torchhooks` uses the same registry to hook Dynamo and Inductor when the program
imports them.
"""
from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False  # typing and importlib.abc cost 15 ms: more than the whole sitecustomize
if TYPE_CHECKING:
    import types
    from typing import Any, Callable

__all__ = ["when_imported"]

_lock = threading.RLock()
_waiting: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_finding = threading.local()  # names this thread is looking up through the other finders


class _Loader:
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


class _Finder:
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
