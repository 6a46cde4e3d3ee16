"""What each op that ran on a PrivateUse1 device ran on there, asked of PyTorch's dispatcher at
capture: table ``op_dispatch``.

A backend as it ships reports its kernels to Kineto, if that, and nothing of the ops it leaves to
PyTorch's boxed CPU fallback: those run on the host between two copies (``aten::_to_cpu`` of the
inputs, the results back), which read like the host waiting for the device. The dispatcher knows
which ops the backend has no kernel for; a later reader (``neuron-prof report`` in another
process) does not have the backend, so the question is asked here, once per op name and device
type, for the ops that ran with the device's tensors, by ``neuron_prof.backends.op_support`` (the function
``port-check`` asks it with).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from neuron_prof.backends.op_devices import device_types
from neuron_prof.recording.api import Recorder


class DispatchPaths:
    """Notes the (op, device) pairs of the ops the eager collector drains and appends, for each new
    op name on the PrivateUse1 device, the dispatcher's path for it there (``op_support.PATHS``)."""

    def __init__(self) -> None:
        self.strings: dict[int, str] = {}  # the Recorder's string ids the eager engine interned: their text
        self._pairs: set[int] = set()  # (name id << 32 | devices id) seen
        self._asked: set[str] = set()  # op names asked about
        self._backend: str | None = None
        self._target = None

    def intern(self, intern: Callable[[str], int]) -> Callable[[str], int]:
        """``intern`` (the Recorder's), remembering each id's text: the engine hands each string over once."""
        strings = self.strings

        def remember(s: str) -> int:
            sid = intern(s)
            strings[sid] = s
            return sid
        return remember

    def note(self, rec: Recorder, rows: np.ndarray) -> None:
        """The ops of ``rows`` (the ``ops`` journal's layout): ask about names new on the device."""
        backend = self._backend_name()
        if backend is None or not len(rows):  # a CPU-only job pays nothing more
            return
        pairs = np.unique(rows["name"].astype(np.int64) << 32 | rows["devices"].astype(np.int64))
        new = [int(p) for p in pairs if int(p) not in self._pairs]
        if not new:
            return
        self._pairs.update(new)
        names = sorted({self.strings.get(p >> 32, "") for p in new
                        if backend in device_types(self.strings.get(p & 0xFFFFFFFF, ""))} - self._asked)
        if not names:
            return
        self._asked.update(names)
        from neuron_prof.backends.op_support import op_paths

        paths = op_paths(names, self._target)
        if len(paths):
            rec.append("op_dispatch", {
                "device": np.full(len(paths), rec.intern(backend), np.int32),
                "op": np.array([rec.intern(o) for o in paths["op"]], np.int32),
                "path": np.array([rec.intern(p) for p in paths["path"]], np.int32)})

    def _backend_name(self) -> str | None:
        """The PrivateUse1 backend's name once one is registered (None before: nothing to ask)."""
        if self._target is None:
            import torch

            name = torch._C._get_privateuse1_backend_name()
            if name == "privateuseone":
                return None
            from neuron_prof.backends.op_support import process_target

            self._backend, self._target = name, process_target(name)
        return self._backend
