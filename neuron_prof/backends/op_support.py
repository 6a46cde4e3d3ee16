"""Which ops a backend registered in this process runs itself and which it leaves to the CPU,
asked of PyTorch's dispatcher (``neuron-prof port-check``'s "what the ops need").

A run names its ops without their overload (``aten::cumsum``), the profiler's way; the dispatcher
decides per overload (``aten::cumsum``, ``aten::cumsum.out``) what serves a tensor of the
backend's PrivateUse1 key, in this order: a kernel the backend registered for the key; else a
composite kernel (CompositeExplicitAutograd(NonFunctional), CompositeImplicitAutograd), which
runs other ops, each asked in its own right (a structured op's functional form writes through
its ``.out`` overload, an op of the same name); else the backend's boxed fallback, if it
registered one (``TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(...) }``); else nothing: the
op fails on the device. What a boxed fallback does with an op only the backend knows: it is taken
to decide as the emulated neuron device's does, with the ops it leaves out named by a
:class:`Target`; a backend neuron_prof knows nothing of (:func:`shipped_target`) is taken to have
PyTorch's CPU fallback there, as shipped backends do.

The emulated neuron device (``neuron_prof/testing/_neuron.cpp``, ``initial_path``) registers a
boxed fallback for every op and decides inside it, per overload: an op it leaves out on purpose
(``neuron.UNIMPLEMENTED``) falls back to the CPU; an op whose outputs depend on the data or that
draws random numbers, or that returns no tensor, runs on the host after the queue drains (a sync,
not a fallback); an op that returns a view it has no kernel for falls back; any other op is queued
on the device with its outputs' shapes from the op's Meta kernel, and falls back if it has none.
Its list of data-dependent ops is read here as PyTorch's tags ``dynamic_output_shape`` and
``data_dependent_output``, which name the same ops. Where the overloads of a name disagree (8 aten ops on torch 2.13, e.g. ``_fused_adam_`` with a
tensor learning rate), the name's path is ``"mixed"`` and the overloads that fall back are listed.
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch

from neuron_prof.errors import NeuronProfError

PATHS = {
    "kernel": "a kernel of the backend's own",
    "composite": "a composite kernel: runs other ops",
    "device": "the backend's fallback runs it on the device",
    "host": "runs on the host after the device's queue drains (a sync, not a fallback)",
    "cpu": "falls back to the CPU",
    "mixed": "falls back to the CPU for some overloads",
    "missing": "no kernel and no fallback: fails on the device",
    "unknown": "not registered in this process",
}
"""What serves an op on the target: each path and what it means."""
OP_COLUMNS = ["op", "path", "cpu_overloads"]

_KEY = "PrivateUse1"
_COMPOSITES = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd", "CompositeImplicitAutograd")
_ON_HOST_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
_OP_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")
"""What an op's name looks like (``namespace::name``), as against the other events a run's op
table holds (autograd nodes, ``record_function`` ranges such as ``Optimizer.step#SGD.step``)."""


@dataclass(frozen=True)
class Target:
    """A PrivateUse1 backend registered in this process, and what its boxed fallback leaves to the
    CPU. The fallback is taken to decide the rest as the emulated neuron device's does (the module
    docstring): it queues an op with its outputs' shapes from the op's Meta kernel."""

    device: str
    """Its device type, the PrivateUse1 backend's name (``"neuron"``)."""
    cpu_ops: frozenset[str]
    """Op names its boxed fallback leaves to the CPU whatever the overload (``neuron.UNIMPLEMENTED``)."""
    fallback_on_cpu: bool = False
    """Its boxed fallback is PyTorch's CPU fallback (``at::native::cpu_fallback``), as shipped
    backends' are (OpenReg, torch_npu): every op without a kernel of its own runs on the CPU. False:
    it decides as the emulated neuron device's does."""


def shipped_target(device: str) -> Target:
    """A PrivateUse1 backend neuron_prof knows nothing of: an op without a kernel of its own or a
    composite reaches its boxed fallback, taken to be PyTorch's CPU fallback."""
    return Target(device=device, cpu_ops=frozenset(), fallback_on_cpu=True)


def process_target(device: str) -> Target:
    """The PrivateUse1 backend this process registered as ``device``, for asking the dispatcher
    what its ops ran on (a capture's fallbacks): the emulated neuron device where it is the one
    turned on here (its own boxed fallback decides; found among the loaded modules, never
    imported), else a backend as backends ship (:func:`shipped_target`)."""
    emulator = sys.modules.get("neuron_prof.testing.neuron")
    if emulator is not None and device == emulator.BACKEND and emulator.enabled():
        return Target(device=device, cpu_ops=emulator.cpu_ops())
    return shipped_target(device)


def check_registered(target: Target) -> None:
    """Asking about a backend this process has not registered would read every op as missing."""
    name = torch._C._get_privateuse1_backend_name()
    if name != target.device:
        raise NeuronProfError(f"the PrivateUse1 backend of this process is {name!r}, not {target.device!r}: "
                              f"register {target.device!r} before asking about it")


def op_paths(names: Iterable[str], target: Target) -> pd.DataFrame:
    """One row per op name in ``names`` that is an op (see ``_OP_NAME``; other names are left
    out): ``path`` (a key of :data:`PATHS`) and ``cpu_overloads`` (the overloads that fall back
    to the CPU, for ``cpu`` and ``mixed``)."""
    check_registered(target)
    overloads: dict[str, list[str]] = defaultdict(list)
    for qualified in torch._C._dispatch_get_all_op_names():
        overloads[qualified.partition(".")[0]].append(qualified)
    fallback = torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1)
    rows = []
    for name in sorted(set(names)):
        if name in overloads:
            rows.append((name, *_name_path(overloads[name], target, fallback)))
        elif _OP_NAME.match(name):
            rows.append((name, "unknown", []))
    return pd.DataFrame(rows, columns=OP_COLUMNS)


def _name_path(overloads: list[str], target: Target, fallback: bool) -> tuple[str, list[str]]:
    return name_path({o: _overload_path(o, target, fallback) for o in sorted(overloads)})


def name_path(paths: dict[str, str]) -> tuple[str, list[str]]:
    """An op name's path from its overloads' (overload -> path), and the overloads that fall back
    to the CPU: the overloads that reach the boxed fallback decide (the others are served by a
    kernel or a composite); where they disagree and some fall back, ``"mixed"``."""
    reached = {o: p for o, p in paths.items() if p not in ("kernel", "composite")}
    cpu = [o for o, p in reached.items() if p == "cpu"]
    if not reached:
        return ("kernel" if "kernel" in paths.values() else "composite"), []
    kinds = set(reached.values())
    if len(kinds) == 1:
        return kinds.pop(), cpu
    if cpu:
        return "mixed", cpu
    return ("device" if "device" in kinds else "host"), []


def _overload_path(qualified: str, target: Target, fallback: bool) -> str:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(qualified, _KEY):
        return "kernel"
    if any(has(qualified, k) for k in _COMPOSITES):
        return "composite"
    if not fallback:
        return "missing"
    if target.fallback_on_cpu or qualified.partition(".")[0] in target.cpu_ops:
        return "cpu"
    op = _overload(qualified)
    if op is None:
        return "unknown"
    schema = op._schema
    if any(t in op.tags for t in _ON_HOST_TAGS) or any(
            a.type.kind() == "OptionalType" and a.type.getElementType().kind() == "GeneratorType"
            for a in schema.arguments):
        return "host"
    for r in schema.returns:
        if not (r.type.kind() == "TensorType" or r.type.isSubtypeOf(torch._C.ListType.ofTensors())):
            return "host"  # a value the host reads (a bool, a number)
        if r.alias_info is not None and not r.alias_info.is_write:
            return "cpu"  # a view the backend has no kernel for
    return "device" if has(qualified, "Meta") else "cpu"


def _overload(qualified: str):
    """The ``torch.ops`` overload object of ``ns::name[.overload]`` (None: none has that name,
    e.g. an implementation registered without a schema)."""
    ns, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
