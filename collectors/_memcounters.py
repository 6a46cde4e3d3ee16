"""The backend's own memory counters, for devices whose allocator does not report to the profiler.

A PrivateUse1 backend's allocator may never call ``c10::reportMemoryUsageToProfiler``: the native
tracker (``_memtrack``) then sees nothing of the device. Every backend keeps a count of its own,
though: ``torch.accelerator.memory_stats(i)`` where its allocator is a c10 ``DeviceAllocator``, else
its device module's ``memory_stats(i)`` or ``memory_allocated(i)`` / ``max_memory_allocated(i)``
(``torch.neuron``: the module named by ``torch._C._get_privateuse1_backend_name()``). They are read
at step boundaries only, one call per device where the stats name both figures: totals, no lines.

Which of the two a device's ``memory_steps`` rows come from is decided once per device, at the first
step boundary where it has a figure: the tracker's, if its allocator reported anything since capture
began (today's rows, untouched: reads of its counters stop); else its counters, once they show
bytes. Each decision is a ``memory_sources`` row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from neuron_prof.store.schema import MEMORY_FIGURES

FROM_EVENTS, FROM_COUNTERS = MEMORY_FIGURES
Reader = Callable[[int], tuple[int, int, int]]
"""Device index -> (allocated bytes, their high-water mark, reserved bytes: 0 where not said)."""
_KEYS = (("allocated_bytes.all.current", "allocated_bytes"),  # c10's DeviceAllocator names; flat ones
         ("allocated_bytes.all.peak", "peak_bytes"),
         ("reserved_bytes.all.current", "reserved_bytes"))


@dataclass(frozen=True)
class Counters:
    """How this process reads its backend's counters: ``api`` names the function (in the run)."""

    backend: str
    devices: int
    api: str
    read: Reader


def find_counters() -> Counters | None:
    """The first way to read the PrivateUse1 backend's counters that works on its device 0; None
    where no backend is registered yet, or it offers none."""
    import torch

    backend = torch._C._get_privateuse1_backend_name()
    module = getattr(torch, backend, None) if backend != "privateuseone" else None
    if module is None or not callable(getattr(module, "device_count", None)):
        return None
    devices = int(module.device_count())
    ways: list[tuple[str, Callable[[], Reader | None]]] = []
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == backend:
        ways.append(("torch.accelerator.memory_stats", lambda: _from_stats(torch.accelerator.memory_stats)))
    if callable(getattr(module, "memory_stats", None)):
        ways.append((f"torch.{backend}.memory_stats", lambda: _from_stats(module.memory_stats)))
    allocated, peak = getattr(module, "memory_allocated", None), getattr(module, "max_memory_allocated", None)
    if callable(allocated) and callable(peak):
        ways.append((f"torch.{backend}.memory_allocated", lambda: _from_functions(allocated, peak)))
    for api, make in ways if devices else ():
        try:
            read = make()
        except Exception:  # noqa: BLE001 - a probe: a way this backend does not support is not taken
            continue
        if read is not None:
            return Counters(backend, devices, api, read)
    return None


def _from_stats(stats: Callable[[int], Mapping]) -> Reader | None:
    """``stats`` as a reader, if its dict names the allocated bytes and their peak (one call a read)."""
    names = stats(0)
    allocated, peak, reserved = (next((k for k in keys if k in names), None) for keys in _KEYS)
    if allocated is None or peak is None:
        return None

    def read(index: int) -> tuple[int, int, int]:
        s = stats(index)
        return int(s[allocated]), int(s[peak]), int(s[reserved]) if reserved else 0

    return read


def _from_functions(allocated: Callable[[int], int], peak: Callable[[int], int]) -> Reader:
    def read(index: int) -> tuple[int, int, int]:
        return int(allocated(index)), int(peak(index)), 0

    read(0)  # the probe: raises where the backend does not support it
    return read


class CounterSampler:
    """Per device of the PrivateUse1 backend: where its ``memory_steps`` rows come from (the module
    docstring), and its counters' rows where they are the source."""

    def __init__(self) -> None:
        self._counters: Counters | None = None
        self._backend = ""  # the backend whose counters were looked for ("": none yet)
        self._backend_name: Callable[[], str] | None = None  # torch's, looked up once
        self._figures: dict[str, str] = {}  # device -> FROM_EVENTS or FROM_COUNTERS

    def rows(self, step: int, ts: int, tracked: list[tuple]) -> tuple[list[tuple], list[tuple]]:
        """The boundary's ``memory_steps`` rows (step, ts, device, live, peak, allocated, reserved):
        the tracker's (``tracked``), and a row read now for each device on its counters; and the
        devices decided at it, as ``memory_sources`` rows (ts, device, figures_from, api). One read
        per device not known to report (none once every device is)."""
        counters = self._find()
        if counters is None:
            return tracked, []
        reported = {r[2] for r in tracked}
        counted, decided = [], []
        for index in range(counters.devices):
            device = f"{counters.backend}:{index}"
            figures = self._figures.get(device)
            if figures == FROM_EVENTS:
                continue
            if figures is None and device in reported:
                self._figures[device] = FROM_EVENTS
                decided.append((ts, device, FROM_EVENTS, ""))
                continue
            allocated, peak, reserved = counters.read(index)
            if figures is None:
                if not (allocated or peak):  # nothing on the device yet: decided when it has something
                    continue
                self._figures[device] = FROM_COUNTERS
                decided.append((ts, device, FROM_COUNTERS, counters.api))
            counted.append((step, ts, device, allocated, peak, allocated, reserved))
        if not counted:
            return tracked, decided
        mine = {r[2] for r in counted}  # a report that came after the decision does not add a second row
        return [r for r in tracked if r[2] not in mine] + counted, decided

    def reading(self) -> bool:
        """Whether a boundary reads any counters now (no backend offering them: ``rows`` passes the
        tracker's rows through). Never raises: a backend whose probe fails answers True, so that
        ``rows`` meets the error where its caller reports it."""
        try:
            return self._find() is not None
        except Exception:  # noqa: BLE001 - rows() raises it again, to a caller that records it
            self._backend = ""  # looked for again by rows()
            return True

    def _find(self) -> Counters | None:
        """Looked for once, when the backend is first registered (under ``record``, after capture
        began). Its name is asked at every boundary; torch's function to ask it is found once."""
        name = self._backend_name
        if name is None:
            import torch

            name = self._backend_name = torch._C._get_privateuse1_backend_name
        backend = name()
        if backend != self._backend:
            self._backend = backend
            self._counters = find_counters()
        return self._counters
