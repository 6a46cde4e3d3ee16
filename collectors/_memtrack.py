"""Python side of the native memory tracker (``_memory.cpp``, built into the engine extension).

Rows (:meth:`MemoryTracker.drain`), one per allocator event, columns of equal length:

==============  =======  ============================================================
ts              int64    ns, ``CLOCK_MONOTONIC``; for BASELINE / LIVE rows the allocation's time
addr            int64    the block's address (with ``device``: the allocation's identity)
bytes           int64    > 0 allocation, < 0 free (OOM: the size that failed)
alloc_ts        int64    time of the allocation the event is about: pairs a free with its alloc
total_allocated int64    the allocator's own total at the event (CUDA: its allocated bytes)
total_reserved  int64    the allocator's reserved bytes (0 where it has none)
tid             int64    OS thread of the event
op, top_op      int32    engine string ids: innermost / outermost open op on that thread
module          int32    engine string id of the module path (0: none)
stack           int32    engine stack id of the user's Python stack (0: none)
device_type     int8     ``c10::DeviceType`` (0 cpu, 1 cuda, 20 PrivateUse1, ...)
device_index    int8     -1 for the CPU
bwd             uint8    the op ran in autograd's backward pass
kind            uint8    a code into ``neuron_prof.store.schema.MEMORY_KINDS``: see below
grad            uint8    an op returned a tensor over the block that carries a ``grad_fn``
                         (the block belongs to an autograd graph; capture windows only)
==============  =======  ============================================================
"""
from __future__ import annotations

import numpy as np

from neuron_prof.recording.torchhooks import watch_user_profilers

# The native event kinds, codes into neuron_prof.store.schema.MEMORY_KINDS: ``alloc``/``free`` during a
# capture window; ``baseline``: made before the window opened and still live then; ``late_free``:
# freed outside a window, allocated (or baselined) in one; ``live``: what was live when
# MemoryTracker.snapshot ran; ``oom``: the allocator reported an out-of-memory (devices that report
# it to the profiler: CUDA, some PrivateUse1 backends); ``unfollowed``: a CPU block still live when
# a window closed, where CPU allocations are not followed between windows (its free is not known:
# what is known of its lifetime ends there).

_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 8: "maia", 9: "xla", 12: "xpu", 13: "mps", 14: "meta",
                 15: "hpu", 19: "mtia"}
_PRIVATEUSE1 = 20


def device_code(device) -> tuple[int, int]:
    """(c10 device type, index) of a ``torch.device``: what the allocator's reports name it by."""
    import torch

    kind = device.type
    if kind == torch._C._get_privateuse1_backend_name():
        code = _PRIVATEUSE1
    else:
        code = next((c for c, name in _DEVICE_TYPES.items() if name == kind), -1)
    return code, -1 if device.index is None else int(device.index)


def device_name(device_type: int, index: int) -> str:
    """``cpu``, ``cuda:0``, ``neuron:1`` (the PrivateUse1 backend's registered name)."""
    if device_type == _PRIVATEUSE1:
        import torch

        name = torch._C._get_privateuse1_backend_name()
    else:
        name = _DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return name if index < 0 else f"{name}:{int(index)}"


class MemoryTracker:
    """The memory functions of the engine extension, plus the torch.profiler hand-over.

    Only one profiler state can own a thread's allocator reports; torch.profiler refuses to start
    while ours is there. So while tracking, ``torch.autograd.profiler._enable_profiler`` (what
    ``torch.profiler.profile``, ``emit_nvtx`` and ``emit_itt`` call) first steps our tracker
    aside on that thread and ``_disable_profiler`` puts it back: a torch.profiler session inside
    a neuron_prof capture works. While it runs, the allocator reports go to it alone (torch finds
    its state by a static cast of the thread's one slot, so ours cannot sit in front of it and
    pass reports on): what is allocated then is not seen, and what is freed then stays counted
    as live. :meth:`held_since_last_call` tells the collector which step boundaries that spoils.
    """

    def __init__(self, ext) -> None:
        from neuron_prof.collectors._engine import journal_rows

        self._ext = ext
        lay = ext.mem_layout()
        self.dtype = np.dtype({"names": [f[0] for f in lay["fields"]], "offsets": [f[1] for f in lay["fields"]],
                               "formats": [f[2] for f in lay["fields"]], "itemsize": lay["itemsize"]})
        self.row_dtype = journal_rows("memory_events", ext.mem_row_layout()["fields"])
        self._unwatch = _nothing
        self._held = False  # the job's profiler has the allocator reports now
        self._held_since = False  # ... or had them at some moment since held_since_last_call

    def start(self, max_events: int, follow_cpu: bool = True) -> None:
        """Track from now on. ``follow_cpu`` False: CPU allocations only inside windows (the CPU
        allocator keeps no size table and reports nothing in between; devices are followed)."""
        err = self._ext.mem_start(int(max_events), bool(follow_cpu))
        if err:
            raise RuntimeError(err)
        self._unwatch = watch_user_profilers(self)

    # ---- the job's torch.profiler (neuron_prof.recording.torchhooks.ProfilerWatcher)
    def profiler_starting(self, phase: str) -> None:
        if phase == "enable" and self._ext.mem_suspend():
            self._held = self._held_since = True

    def profiler_start_failed(self) -> None:
        self._take_back()

    def profiler_stopped(self) -> None:
        self._take_back()

    def held_since_last_call(self) -> bool:
        """Whether the job's profiler had the allocator reports at any moment since the last call
        (the collector calls at every step boundary): live bytes there are not what the
        allocator holds, and their difference from the boundary before is not the step's."""
        held, self._held_since = self._held_since, self._held
        return held

    def _take_back(self) -> None:
        from torch._C._autograd import _profiler_enabled

        self._ext.mem_resume()  # a no-op while another profiler state holds the thread's slot
        self._held = self._held and bool(_profiler_enabled())

    def stop(self) -> None:
        self._ext.mem_stop()
        self._unwatch()
        self._unwatch = _nothing

    def set_detail(self, on: bool) -> None:
        """Window on: every event, attributed. Off: totals, lifetimes of emitted blocks, the ring."""
        self._ext.mem_set_detail(bool(on))

    def drain(self) -> tuple[np.ndarray, int]:
        """Events since the last drain, and how many were dropped at the buffer cap."""
        data, dropped = self._ext.mem_drain()
        return np.frombuffer(data, dtype=self.dtype), int(dropped)

    def rows(self, events: np.ndarray, rec, engine) -> np.ndarray:
        """Native ``events`` (this tracker's ``dtype``) as ``memory_events`` journal rows with the
        Recorder ``rec``'s ids: the native side maps every column; ``rec`` is asked for each
        string, stack (through the op ``engine``) and device once per ``start``."""
        whole = events.base  # a drain's rows are its bytes: passed on as they are, not copied
        data = whole if type(whole) is bytes and len(whole) == events.nbytes else np.ascontiguousarray(events).tobytes()
        strings, stacks, devices = self._ext.mem_unmapped(data)
        packed = self._ext.mem_pack(
            data,
            [(i, rec.intern(s)) for i, s in zip(strings, engine.strings_of(strings))] if strings else [],
            [(i, rec.intern_stack(f) if f else 0) for i, f in zip(stacks, engine.stacks_of(stacks))] if stacks else [],
            [((t, i), rec.intern(device_name(t, i))) for t, i in devices])
        return np.frombuffer(packed, dtype=self.row_dtype)

    def totals(self) -> list[tuple[int, int, int, int, int, int]]:
        """Per device: (type, index, live bytes, peak since the last call, allocator allocated, reserved)."""
        return self._ext.mem_totals()  # ints already: read at every step boundary, so nothing more

    def block_bytes(self, blocks: list[tuple[int, int, int]]) -> list[int]:
        """The reported size of each live block (device type, index, address); 0 where none is live."""
        return self._ext.mem_block_bytes(blocks)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything live now (kind ``live``) and the last events of any kind (newest last)."""
        live, ring = self._ext.mem_snapshot()
        return np.frombuffer(live, dtype=self.dtype), np.frombuffer(ring, dtype=self.dtype)


def _nothing() -> None:
    pass
