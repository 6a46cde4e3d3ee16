"""Module-path stack per thread, from global ``nn.Module`` forward (pre-)hooks.

The outermost module on a thread is named by its class name (``TinyTransformer``); modules
called inside it by their ``named_modules()`` path relative to it (``layers.0.self_attn``). A
module that is not a submodule of the outermost one is named ``<parent path>.<ClassName>``. A
module called with no module open that was named inside an outermost one before (a checkpointed
block re-run by the backward pass) keeps that name, and so do the modules it calls.
Each change of the current path is reported as an interned id through ``set_module``.

The hooks cost every module call a few Python calls, so they are attached only while someone reads
the path: while a capture window is on (:meth:`ModuleTracker.window`), until the first module call
has been seen (its time is the end of the process's start-up), and while a process group exists
(collectives, recorded in and out of windows, carry the path of the module that issued them; a
group made while the hooks are off is seen from the next window on). A sampled always-on run pays
for them on its detailed steps only.

Global module hooks and ``torch.compile`` do not mix: when any global forward hook exists, Dynamo
traces a module call through ``Module.__call__`` instead of ``forward`` (which reorders the
compiled graph's inputs, so Inductor's cache keys change), and it guards on the hooks (adding or
removing one recompiles). So the hooks stand down for good at the start of the process's first
Dynamo compile (attached or not at that moment), and are neither installed nor attached again once
Dynamo has compiled something (since its last ``torch._dynamo.reset()``): from then on ops have no
module path (inside compiled code they never had one: a ``Torch-Compiled Region`` range stands for
its modules). Until then the hooks are hidden from Dynamo
(:func:`neuron_prof.recording.torchhooks.hide_from_dynamo`): the hooks of a compiled module never become
compiled frames of their own, and a traced call to them is no call at all.
"""
from __future__ import annotations

import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable

import torch
from torch.nn.modules import module as _nn_module

from neuron_prof.recording.torchhooks import hide_from_dynamo, skip_frames, when_imported

_is_compiling = torch.compiler.is_compiling
# torch warns that global hooks fire once more for torch.compile's OptimizedModule wrapper; the
# tracker names modules inside the wrapper as in the original, so the warning tells users nothing.
_COMPILE_HOOK_MESSAGE = r"Using `torch.compile\(module\)` when there are global hooks on modules"


def _is_compiled_wrapper(m) -> bool:
    return type(m).__name__ == "OptimizedModule" and hasattr(m, "_orig_mod")


def _unwrap(m):
    return m._orig_mod if _is_compiled_wrapper(m) else m


def dynamo_has_compiled() -> bool:
    """Whether compiled code may exist in this process: Dynamo has started compiling a frame since
    it was imported or last reset (``torch._dynamo.reset()`` drops all compiled code)."""
    if "torch._dynamo" not in sys.modules:
        return False
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return getattr(convert_frame, "FRAME_COUNTER", 1) != 0


def _process_group_exists() -> bool:
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return c10d is not None and c10d.is_initialized()


class ModuleTracker:
    def __init__(self, set_module: Callable[[int], None], intern: Callable[[str], int],
                 on_first_call: Callable[[int], None] | None = None) -> None:
        self._set = set_module
        self._intern = intern
        self._on_first_call = on_first_call  # called once, with the time of the first root call
        self._tls = threading.local()
        # id(root) -> (weakref(root), root path id, {id(child): (weakref(child), path, path id)})
        self._roots: dict[int, tuple[weakref.ref, str, dict[int, tuple[weakref.ref, str, int]]]] = {}
        # each submodule named inside a root: (the submodule, that root's paths)
        self._named_in: dict[int, tuple[weakref.ref, dict[int, tuple[weakref.ref, str, int]]]] = {}
        self._hooks: tuple[Callable, Callable] | None = None  # (pre, post) from install to uninstall
        self._handles: list = []  # while attached
        self._window = False
        self._unhide: list[Callable[[], None]] = []
        self._filter: Any = None
        self._watch: Callable[[], None] | None = None  # cancels or undoes the compile-start watch
        self.stood_down = False
        """True once the hooks were left out or removed for ``torch.compile`` (module docstring)."""

    # -- install / uninstall
    def install(self) -> None:
        """Make the hooks and attach them (until the first module call, at least: see the module
        docstring); nothing once Dynamo has compiled."""
        if self._hooks is not None or self.stood_down:
            return
        if dynamo_has_compiled():
            self.stood_down = True
            return
        tracker = self

        def pre_hook(module, args) -> None:
            tracker._pre_hook(module, args)

        def post_hook(module, args, output) -> None:
            tracker._post_hook(module, args, output)

        self._unhide = [hide_from_dynamo(pre_hook), hide_from_dynamo(post_hook)]
        self._hooks = (pre_hook, post_hook)
        warnings.filterwarnings("ignore", message=_COMPILE_HOOK_MESSAGE, category=UserWarning)
        self._filter = warnings.filters[0]
        self._watch = None
        cancel = when_imported("torch._dynamo", self._watch_compiles)  # may run at once
        self._watch = self._watch or cancel
        self._attach()

    def window(self, on: bool) -> None:
        """A capture window opens (hooks attached) or closes (detached, unless still needed)."""
        self._window = on
        if on:
            self._attach()
        elif not getattr(self._tls, "stack", None):  # else when this thread's outermost call ends
            self._detach_if_unneeded()

    def _attach(self) -> None:
        if self._handles or self._hooks is None or self.stood_down:
            return
        if dynamo_has_compiled():  # new hooks would change what Dynamo guards on: never again
            self.stood_down = True
            return
        pre_hook, post_hook = self._hooks
        pre = _nn_module.register_module_forward_pre_hook(pre_hook)
        try:
            post = _nn_module.register_module_forward_hook(post_hook, always_call=True)
        except TypeError:  # torch without always_call
            post = _nn_module.register_module_forward_hook(post_hook)
        self._handles = [pre, post]

    def _detach_if_unneeded(self) -> None:
        """Out of a window, once the first module call was seen: remove the hooks unless a process
        group exists. Every thread's stack starts afresh when they come back (a thread inside a
        module call meanwhile names its next call from the top)."""
        if not self._handles or self._window or self._on_first_call is not None or _process_group_exists():
            return
        self._remove_hooks()
        self._tls = threading.local()
        self._set(0)

    def _watch_compiles(self, dynamo: Any) -> None:
        """Stand down at the start of every Dynamo compile (the first one that comes). Hooked on
        the instance's ``run_start_callbacks``, which runs before Dynamo traces a frame: a
        registered start callback would not survive ``torch._dynamo.reset()``."""
        handler = getattr(dynamo, "callback_handler", None)
        original = getattr(handler, "run_start_callbacks", None)
        if original is None:  # a torch without it: stand down now rather than change its graphs
            self._stand_down()
            return
        tracker = self

        def run_start_callbacks(args: Any) -> None:
            tracker._stand_down()
            original(args)

        skip_frames(run_start_callbacks)
        handler.run_start_callbacks = run_start_callbacks

        def undo() -> None:
            if vars(handler).get("run_start_callbacks") is run_start_callbacks:
                del handler.run_start_callbacks

        self._watch = undo

    def _stand_down(self) -> None:
        """Remove the hooks for good; ops from now on (on this thread: the module being compiled
        was pushed, and its post-hook will not run) have no module path."""
        self.stood_down = True
        if self._handles:
            self._remove_hooks()
            self._tls.stack = []
            self._set(0)

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def uninstall(self) -> None:
        self._remove_hooks()
        if self._watch is not None:
            self._watch()
            self._watch = None
        for undo in self._unhide:
            undo()
        self._unhide = []
        self._hooks = None
        self._roots.clear()
        self._named_in.clear()
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            getattr(warnings, "_filters_mutated", lambda: None)()  # invalidate cached lookups
        self._filter = None

    # -- naming
    def _root_entry(self, root: torch.nn.Module):
        ent = self._roots.get(id(root))
        if ent is None or ent[0]() is not root:
            path = type(_unwrap(root)).__name__
            ent = (weakref.ref(root), path, {})
            if len(self._roots) > 4096:
                self._roots = {k: v for k, v in self._roots.items() if v[0]() is not None}
                self._named_in = {k: v for k, v in self._named_in.items() if v[0]() is not None}
            self._roots[id(root)] = ent
            ent[2][id(root)] = (ent[0], path, self._intern(path))
        return ent

    def _child(self, root: torch.nn.Module, child: torch.nn.Module, parent_path: str):
        ent = self._root_entry(root)
        paths = ent[2]
        hit = paths.get(id(child))
        if hit is not None and hit[0]() is child:
            return hit[1], hit[2]
        # (re)index the root's submodules: modules may have been added since last time
        for name, m in root.named_modules():
            if _is_compiled_wrapper(root):  # torch.compile(module): paths inside the original
                name = name[len("_orig_mod."):] if name.startswith("_orig_mod.") else \
                    ("" if name == "_orig_mod" else name)
            if id(m) not in paths or paths[id(m)][0]() is not m:
                if not name:
                    name = ent[1]
                ref = weakref.ref(m)
                paths[id(m)] = (ref, name, self._intern(name))
                if m is not root:
                    self._named_in[id(m)] = (ref, paths)
        hit = paths.get(id(child))
        if hit is not None and hit[0]() is child:
            return hit[1], hit[2]
        path = f"{parent_path}.{type(child).__name__}"
        pid = self._intern(path)
        paths[id(child)] = (weakref.ref(child), path, pid)
        return path, pid

    # -- hooks (hot: keep them short)
    def _pre_hook(self, module, args):
        if _is_compiling():
            return
        try:
            stack = self._tls.stack
        except AttributeError:
            stack = self._tls.stack = []
        if stack:
            paths = stack[0][3]
            hit = paths.get(id(module))
            if hit is not None and hit[0]() is module:
                path, pid = hit[1], hit[2]
            else:
                path, pid = self._child(stack[0][0], module, stack[-1][1])
        else:
            if self._on_first_call is not None:
                first, self._on_first_call = self._on_first_call, None
                first(time.monotonic_ns())
            named = self._named_in.get(id(module))
            if named is not None and named[0]() is module:  # a submodule called on its own: re-run
                paths = named[1]
                path, pid = paths[id(module)][1], paths[id(module)][2]
            else:
                ent = self._root_entry(module)
                paths = ent[2]
                path, pid = ent[1], paths[id(module)][2]
        stack.append((module, path, pid, paths))
        self._set(pid)

    def _post_hook(self, module, args, output):
        if _is_compiling():
            return
        stack = getattr(self._tls, "stack", None)
        if not stack:
            return
        if stack[-1][0] is module:
            stack.pop()
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is module:
                    del stack[i:]
                    break
            else:
                return
        if stack:
            self._set(stack[-1][2])
        else:
            self._set(0)
            if not self._window:  # the first call seen, or a window closed inside this call
                self._detach_if_unneeded()

    def current_path(self) -> str | None:
        stack = getattr(self._tls, "stack", None)
        return stack[-1][1] if stack else None
