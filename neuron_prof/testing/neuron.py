"""An emulated ``neuron`` device, for trying and testing neuron_prof where there is no Trainium.

``enable(devices=1)`` builds (once; cached by torch's extension cache) and loads a C++ extension
that registers PyTorch's PrivateUse1 backend under the name ``neuron``, the registration path
TorchNeuron takes. Then ``torch.device("neuron:0")``, ``t.to("neuron")``, ``model.to("neuron")``,
``t.neuron()``, ``t.is_neuron``, ``torch.neuron.synchronize()`` and ``torch.neuron.device_count()``
work, and ops on neuron tensors behave as on an asynchronous device:

- **Memory** lives in host RAM, through an allocator that reports every allocation and free to
  PyTorch's profiler (``c10::reportMemoryUsageToProfiler``, as a real backend's allocator does),
  with a capacity (``capacity_bytes``): beyond it, allocation raises ``torch.OutOfMemoryError``
  naming the requested size.
- **The eager queue**: an op computes its outputs' shapes on the host (the op's Meta kernel),
  allocates them, enqueues the work on the current stream and returns; one device thread per
  stream runs the stream's queue in order, each op by the op's CPU kernel over the device's memory
  with ``DEVICE_THREADS`` intra-op threads, so results are bitwise those of the CPU with as many.
  Consecutive queued ops of one stream are fused into one kernel by a rule on op kinds in queue
  order:
  pointwise ops (and copies) join a kernel that has not started and holds pointwise ops, or one
  matmul or reduction followed by pointwise ops (an epilogue), up to ``max_fused`` ops. Each
  kernel pays ``launch_us`` of launch cost (a spin on the device thread), so fusing pays, and
  the device thread frees nothing: the tensors a kernel held are released on the host thread.
  Fusion is adaptive, as on the real device: ops fuse only while they wait in the queue.
- **Streams and events**, through PyTorch's device-generic interfaces (``torch.Stream("neuron")``,
  ``torch.Event("neuron")``, ``torch.accelerator``, the autograd engine's stream handling) and
  as ``torch.neuron.Stream``, ``torch.neuron.Event(enable_timing=...)``,
  ``torch.neuron.stream(s)``, ``current_stream()``, ``default_stream()``, ``set_stream(s)``:
  stream 0 is each device's default stream, new streams come from a pool of 7 per device. Each
  stream has its own queue and device thread, so kernels of different streams run at the same
  time, and the current stream is per host thread and device. ``Event.record()`` puts a marker on
  the stream's queue that completes the event when the stream reaches it (the event's timestamp,
  what ``elapsed_time`` reads); ``Stream.wait_event(e)`` puts one where the stream stops until
  ``e``'s latest record completed. ``Tensor.record_stream`` needs nothing more: a kernel holds the
  tensors it uses, so memory is freed only once all work using it ran, on every stream.
- **Pinned memory**: ``pin_memory()`` allocates host memory the device knows, and
  ``t.to("neuron", non_blocking=True)`` from it queues the copy on the current stream reading it
  in place (no staging copy, no host wait); from pageable memory, or blocking, the source is
  copied on the host first, then the copy queued.
- **Flushes**: the host waits for every stream of the device when it needs a value (``.item()``,
  ``.cpu()``, printing, ``nonzero`` and other data-dependent ops), before a CPU fallback, and on
  ``synchronize()``; for one stream on ``Stream.synchronize()`` and when ``max_queue`` ops are
  queued on it; for one event's record on ``Event.synchronize()``. Random ops draw from the CPU generator on the host, in
  program order (the same numbers as on the CPU), after a flush.
- **CPU fallback**: ops in :data:`UNIMPLEMENTED`, and ops without a Meta kernel, run through
  PyTorch's boxed CPU fallback: flush, copy the inputs to the host, run the CPU kernel, copy the
  results back.
- **Custom kernels**: :func:`custom_kernel` makes a function of ATen ops a custom op
  (``torch.library``), as an NKI kernel registered for the device is: one kernel of its own on
  the queue, forward and backward, also under ``torch.compile(backend="neuron")``.
- **Mixed precision**: ``torch.autocast(device_type="neuron", dtype=torch.bfloat16)`` (or
  float16) casts by PyTorch's generic autocast lists, the ones CUDA uses, registered for the
  PrivateUse1 autocast key (matmuls and convolutions in the lower precision; norms, softmax,
  exp/log and losses in fp32; the CPU's own lists keep more in bf16). Its casts are queued ops.
  ``torch.utils.checkpoint`` (reentrant or not) runs on the device as on the CPU.
- **Collectives**: the process-group backend ``"neuron"`` (``init_process_group("neuron")``; DDP,
  FSDP2, DTensor): gloo moves the data, each collective on neuron tensors is one kernel on the
  device's communication stream (stream 8) after the issuing stream's work so far, and its
  ``Work`` (and the ``Work``'s future) makes the waiting stream wait for it, not the host.

Not emulated: stream priorities, interprocess events, the device's own random number generator,
real kernel speed (device time is the CPU's time plus the launch cost; the streams share the host's
cores), and out= tensors that must be resized by the op.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from neuron_prof.testing import neuron_compile
from neuron_prof.testing.neuron_extension import CUSTOM_KERNELS, extension, kernel

BACKEND = "neuron"
DEVICE_THREADS = 1
"""Intra-op threads each device thread computes with (``torch.set_num_threads``): a device of its
own, not a second team fighting the host's for the cores. Results are bitwise the CPU's computing
with this many threads (a parallel reduction's order depends on the thread count)."""
UNIMPLEMENTED = ("aten::embedding_dense_backward", "aten::cumsum", "aten::sort", "aten::topk",
                 "aten::linalg_vector_norm")
"""Ops left out of the device on purpose (as in ``_neuron.cpp``): they fall back to the CPU."""

_lock = threading.Lock()


def _index(device) -> int:
    """A device index from ``None`` (the current device), an int, a string or a ``torch.device``."""
    if device is None:
        return torch.accelerator.current_device_index()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.accelerator.current_device_index() if index is None else index


class Stream(torch.Stream):
    """A stream of the neuron device (``torch.Stream`` with torch.cuda.Stream's methods): a new one
    from the device's pool, or an existing one by ``stream_id``, ``device_index`` and
    ``device_type``."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, torch.device(BACKEND, _index(device)), priority=priority)

    def wait_event(self, event: torch.Event) -> None:
        """Work queued on this stream from now on waits until ``event`` completed."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Work queued on this stream from now on waits for the work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        """Records ``event`` (a new one if None) on this stream and returns it."""
        event = Event() if event is None else event
        event.record(self)
        return event


class Event(torch.Event):
    """An event of the neuron device (``torch.Event``; timing off by default, as torch.cuda.Event):
    ``record(stream)``, ``wait(stream)`` (default: the current stream), ``query()``,
    ``synchronize()`` and ``elapsed_time(end)`` in milliseconds between the device's timestamps."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, BACKEND, enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event's completion to ``end_event``'s (both recorded, completed
        and timing). torch.Event's own takes only an exact ``torch.Event`` as ``end_event``."""
        return extension().elapsed_time(self.event_id, end_event.event_id)


def _as_neuron_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    """The calling thread's current stream of ``device`` (default: the current device)."""
    return _as_neuron_stream(torch.accelerator.current_stream(_index(device)))


def default_stream(device=None) -> Stream:
    """The default stream (id 0) of ``device``."""
    s = torch.accelerator.current_stream(_index(device))
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the calling thread's current stream of its device (and that device current)."""
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Ops inside go to stream ``s`` (None: no change); the previous stream and device come back
    after."""
    if s is None:
        yield
        return
    device, before = torch.accelerator.current_device_index(), torch.accelerator.current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(before)
        torch.accelerator.set_device_index(device)


def _device_module(ext) -> types.ModuleType:
    """``torch.neuron``: what PyTorch and users ask of a device module."""
    mod = types.ModuleType("torch.neuron")
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.device_count = ext.device_count
    mod.current_device = ext.current_device

    def set_device(device) -> None:
        ext.set_device(torch.device(BACKEND, device).index if not isinstance(device, int) else device)

    def synchronize(device=None) -> None:
        """Wait until every op queued on the device (default: the current one) has run."""
        ext.synchronize(ext.current_device() if device is None else torch.device(BACKEND, device).index
                        if not isinstance(device, int) else device)

    def memory_stats(device=None) -> dict:
        return ext.memory_stats(ext.current_device() if device is None else int(torch.device(device).index or 0))

    mod.set_device = set_device
    mod.synchronize = synchronize
    mod.memory_stats = memory_stats
    mod.memory_allocated = lambda device=None: memory_stats(device)["allocated_bytes"]
    mod.max_memory_allocated = lambda device=None: memory_stats(device)["peak_bytes"]
    mod.manual_seed = lambda seed: None  # random numbers come from the CPU generator
    mod.manual_seed_all = lambda seed: None
    mod.set_launch_us = lambda us: ext.set_launch_ns(int(us * 1000))
    # a backend bug, for tests of what a capture does with a trace it cannot read: op names reported
    # to the profiler with a raw quote in their metadata (the trace's JSON no longer parses)
    mod.set_trace_fault = ext.set_trace_fault
    # the ground truth of what a profiler shows of the device: per (device, stream), the kernels that
    # ran while a trace recorded and their device time in ns (``reset``: from zero after this call)
    mod.traced_kernels = lambda reset=False: ext.traced_kernels(reset)
    # torch.autocast(device_type="neuron") and torch.utils.checkpoint ask this of a device module
    mod.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]
    mod.Stream, mod.Event, mod.stream = Stream, Event, stream
    mod.current_stream, mod.default_stream, mod.set_stream = current_stream, default_stream, set_stream
    return mod


_modes: tuple | None = None  # the first enable()'s modes: the device keeps them for the process


def enable(devices: int = 1, launch_us: float = 20.0, capacity_bytes: int = 8 << 30, max_queue: int = 256,
           max_fused: int = 16, report: bool = True, *, kineto: str = "full", allocator_reports: bool = True,
           cpu_fallback: Iterable[str] = (), registered_kernels: bool = False) -> types.ModuleType:
    """Turn the device on (idempotent in one process; the device count cannot change), register
    ``torch.compile(backend="neuron")`` (:mod:`neuron_prof.testing.neuron_compile`) and return
    ``torch.neuron``. ``report``: hand the device's queue state to neuron_prof's backend hook API
    (recorded only while a capture runs).

    Modes that make the device behave as backends ship, for trying a profiler against them (fixed
    by the first call in a process):

    - ``kineto``: what its Kineto profiler reports: ``"full"`` (kernels, copies, runtime calls,
      events, correlation ids and metadata) or ``"kernels"`` (kernels only: no runtime calls, no
      copies or events, no correlation ids, no metadata);
    - ``allocator_reports``: False keeps the allocator's counters (``memory_stats()``,
      ``memory_allocated()``, ``max_memory_allocated()``) but reports no allocation to the profiler;
    - ``cpu_fallback``: ops (``"aten::mse_loss"``) left to the boxed CPU fallback beside
      :data:`UNIMPLEMENTED`;
    - ``registered_kernels``: a kernel registered for each op the device runs, so that only the ops
      it leaves to the CPU reach its boxed fallback and PyTorch's dispatcher says which those are
      (else one boxed fallback serves every op and decides inside)."""
    global _modes
    if kineto not in ("full", "kernels"):
        raise ValueError(f"kineto must be 'full' or 'kernels', not {kineto!r}")
    modes = (kineto, bool(allocator_reports), frozenset(cpu_fallback), bool(registered_kernels))
    with _lock:
        ext = extension()
        if _modes is None and ext.device_count() == 0:
            ext.set_modes(modes[1], sorted(modes[2]))
            ext.set_kineto_kernels_only(kineto == "kernels")
            _modes = modes
        elif _modes is not None and modes != _modes:
            raise RuntimeError("neuron: the device's modes are fixed by the first enable() in a process")
        ext.init(devices, int(launch_us * 1000), int(capacity_bytes), int(max_queue), int(max_fused))
        if torch._C._get_privateuse1_backend_name() != BACKEND:
            torch.utils.rename_privateuse1_backend(BACKEND)
            torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
            torch._register_device_module(BACKEND, _device_module(ext))
        if registered_kernels:
            ext.register_kernels()
        neuron_compile.register()
        _register_collectives(ext)
        if report:
            from neuron_prof.collectors.device import backend_api

            ext.connect(backend_api())
        return sys.modules.get("torch.neuron") or torch.neuron


def enabled() -> bool:
    """Whether :func:`enable` turned the device on in this process."""
    return "torch.neuron" in sys.modules and torch._C._get_privateuse1_backend_name() == BACKEND


def register_target() -> str:
    """The device as a ``port-check --target`` (``neuron_prof.backends.targets``): enabled in this
    process if it is not yet, its boxed fallback leaving :func:`cpu_ops` to the CPU and queueing
    other ops by their Meta kernels; returns its backend name."""
    if not enabled():
        enable()
    return BACKEND


def cpu_ops() -> frozenset[str]:
    """The ops the device leaves to the CPU fallback: :data:`UNIMPLEMENTED` and ``enable``'s
    ``cpu_fallback``."""
    return frozenset(UNIMPLEMENTED) | (_modes[2] if _modes else frozenset())


def _register_collectives(ext) -> None:
    """The process-group backend ``"neuron"`` (``_neuron.cpp``'s collectives: gloo moves the data,
    the device's communication stream queues it), for the cpu and neuron devices, through
    PyTorch's public registration: ``init_process_group("neuron")`` (or ``"cpu:gloo,neuron:neuron"``)
    runs DDP, FSDP2 and DTensor on neuron tensors."""
    import torch.distributed as dist

    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return

    def create(store, rank: int, size: int, timeout):
        return ext.collective_backend(dist.ProcessGroupGloo(store, rank, size, timeout), rank, size)

    dist.Backend.register_backend(BACKEND, create, devices=["cpu", BACKEND])
    _accelerator_default(dist)


def _accelerator_default(dist) -> None:
    """``init_process_group()`` with no backend on the device: ``nccl`` is CUDA's default, and this
    device's is its own, beside gloo for CPU tensors (``"cpu:gloo,neuron:neuron"``). PyTorch picks a
    custom accelerator's backend alone and names gloo, which it did not create, the group's default
    ("Could not find backend type 1 for Process Group with name gloo" once DDP asks for it), so the
    device's module supplies the default, as a device's own package does."""
    from torch.distributed import distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, "_neuron_default", False):
        return

    @functools.wraps(original)
    def init_process_group(backend=None, *args, **kwargs):
        if backend is not None or not torch.accelerator.is_available() \
                or torch.accelerator.current_accelerator().type != BACKEND:
            return original(backend, *args, **kwargs)
        original(f"cpu:gloo,{BACKEND}:{BACKEND}", *args, **kwargs)
        # the group's default backend (what DDP's logger and hooks ask for): the device's
        c10d._get_default_group()._set_default_backend(c10d.ProcessGroup.BackendType.CUSTOM)

    init_process_group._neuron_default = True
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def custom_kernel(name: str, *, mutates_args: Iterable[str] | str = ()) -> Callable[[Callable], Any]:
    """Decorator: ``fn`` (typed tensors in and out, written with ATen ops) becomes the custom op
    ``name`` (``"lib::op"``), as a kernel written with NKI and registered with ``torch.library``
    is on TorchNeuron. On the device it runs as one kernel of its own named ``name``: the ops it is
    written with are queued into that kernel, never fused with their neighbours, and it pays one
    launch; elsewhere (the CPU) the op is ``fn`` itself, the reference the kernel must match.
    Under ``torch.compile(backend="neuron")`` it stays one opaque node of the graph and one
    kernel. Its fake implementation (shapes for the compiler) is ``fn`` on fake tensors; a
    backward is registered as on any custom op, ``op.register_autograd(...)`` (a backward that is
    a custom kernel too is a kernel of its own). Returns the op (``torch.library.CustomOpDef``)."""
    def register(fn: Callable) -> Any:
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)

        def on_device(*args, **kwargs):
            with kernel(name):
                return fn(*args, **kwargs)

        # PrivateUse1 by its own name: a kernel may be defined before enable() names it "neuron"
        op.register_kernel("privateuseone")(on_device)
        op.register_fake(fn)
        CUSTOM_KERNELS.add(name)
        return op

    return register
