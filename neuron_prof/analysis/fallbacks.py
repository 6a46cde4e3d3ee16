"""CPU fallbacks found through the dispatcher: ops that ran with a PrivateUse1 device's tensors
but have no kernel there, so PyTorch's boxed CPU fallback ran them on the host.

A backend that reports its fallbacks (a runtime call with ``cpu fallback`` metadata: the emulated
neuron device in full) gives ``run.fallbacks``. Backends as they ship report nothing of them; for
those, the capture asked the dispatcher which op names have no kernel on the device
(``run.op_dispatch``, path ``cpu``) and the fallbacks are those ops in ``run.ops``: the outermost
such op (a composite's inner overload is the same fallback). Inside each, PyTorch's fallback
copies the inputs to the host (``aten::_to_cpu``, a ``_to_copy`` each) and the results back (a
``_to_copy`` to the device, ``_copy_from_and_resize`` for a written argument): those copies give
the bytes each way, and they are the fallback's, not reads of device values (``inside``).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from neuron_prof.analysis.ops import has_ancestor, name_mask
from neuron_prof.backends.op_devices import device_types, input_devices

FALLBACK_PATHS = ("cpu", "mixed")
"""``op_dispatch.path`` values of an op its device leaves to the CPU fallback (``mixed``: some
overloads; the op counts as one where it made the fallback's copy to the host, ``aten::_to_cpu``)."""
NATIVE_PATHS = ("kernel", "device", "host")
"""``op_dispatch.path`` values of an op its device runs itself."""
TO_CPU = "aten::_to_cpu"
COPIES = ("aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::copy_")
"""Copy ops; ``copy_(self=dst, src)`` names its source second, the others first."""
COLUMNS = ["rank", "ts", "dur", "tid", "device", "op", "bytes_to_host", "bytes_from_host", "host_op", "module",
           "source", "user_source", "source_full", "stack", "bwd", "step"]
STRING_COLUMNS = ("device", "op", "host_op", "module", "source", "user_source", "source_full")


def _devices(text: str) -> list[str]:
    return [d.strip() for d in text.split(",")]


def _device_of(devices: str) -> str:
    """The first device of an op's inputs that is not the CPU (``"neuron:0"``)."""
    return next((d for d in input_devices(devices) if d.partition(":")[0] != "cpu"), "")


def _copy_ends(name: str, devices: list[str]) -> tuple[str, str]:
    """(source, destination) device types of a copy op from its recorded devices: ``copy_(dst,
    src)``, ``_copy_from(src, dst)``, ``_to_copy(src, ..., device=dst)`` (no device: no move)."""
    def kind(d: str) -> str:
        return d.split("|")[0].partition(":")[0]
    if name == "aten::copy_":
        return kind(devices[1]) if len(devices) > 1 else "", kind(devices[0])
    if name == "aten::_to_copy":
        return kind(devices[0]), kind(next((d for d in reversed(devices[1:]) if d), devices[0]))
    return kind(devices[0]), kind(devices[1]) if len(devices) > 1 else ""


def _source_bytes(name: str, shapes: str, dtypes: str) -> int:
    """Bytes of a copy's source tensor, from its recorded shape and dtype (0 where not recorded)."""
    import torch

    i = 1 if name == "aten::copy_" else 0
    try:
        shape = json.loads(shapes)[i]
        dtype = getattr(torch, _devices(dtypes)[i].split("|")[0])
        return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    except (ValueError, IndexError, TypeError, AttributeError, RuntimeError):
        return 0


def _owner(parent: np.ndarray, flagged: np.ndarray, max_depth: int) -> np.ndarray:
    """Per op, the row of its nearest flagged ancestor, or itself if flagged (-1: none)."""
    owner = np.where(flagged, np.arange(len(parent)), -1)
    up = np.maximum(parent, 0)
    for _ in range(max_depth):
        owner = np.where((owner < 0) & (parent >= 0), owner[up], owner)
    return owner


def dispatch_paths(ops: pd.DataFrame, dispatch: pd.DataFrame) -> np.ndarray:
    """Per op, what the dispatcher said it ran on there (``op_dispatch.path``) for the first device
    among its inputs it was asked about; "" where none was (CPU ops, ranges)."""
    paths = {str(d): {str(o): str(p) for o, p in zip(g["op"], g["path"])}
             for d, g in dispatch.groupby(dispatch["device"].astype(str), observed=True)} if len(dispatch) else {}
    if ops.empty or not paths:
        return np.full(len(ops), "", dtype=object)
    name_cat, dev_cat = ops["name"].astype("category").cat, ops["devices"].astype("category").cat
    width = len(dev_cat.categories) + 1
    combo = name_cat.codes.to_numpy().astype(np.int64) * width + dev_cat.codes.to_numpy().astype(np.int64)
    pairs, inverse = np.unique(combo, return_inverse=True)  # a few hundred (op, devices) pairs, millions of ops

    def path_of(name: str, devices: str) -> str:
        return next((paths[t][name] for t in sorted(device_types(devices) & paths.keys()) if name in paths[t]), "")

    return np.array([path_of(str(name_cat.categories[p // width]), str(dev_cat.categories[p % width]))
                     for p in pairs], dtype=object)[inverse]


def fallback_ops(ops: pd.DataFrame, kind: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per op, the row of the fallback op it is or lies within (-1: none): an op whose name the
    dispatcher said has no kernel on a device among its inputs (``kind``: :func:`dispatch_paths`),
    outermost of such nesting."""
    if ops.empty:
        return np.full(len(ops), -1, np.int64)
    flagged = kind == "cpu"
    mixed = np.flatnonzero(kind == "mixed")
    if not flagged.any() and not len(mixed):  # a run with no device, or none that fell back
        return np.full(len(ops), -1, np.int64)
    if len(mixed):  # a mixed op counts where it made the fallback's copy to the host
        to_cpu = np.flatnonzero(name_mask(ops, lambda n: n == TO_CPU))
        flagged[np.intersect1d(mixed, parent[to_cpu])] = True
    depth = int(ops["depth"].max())
    outer = flagged & ~has_ancestor(parent, flagged, depth)
    return _owner(parent, outer, depth)


def native_ops(ops: pd.DataFrame, kind: np.ndarray, parent: np.ndarray, owner: np.ndarray) -> pd.DataFrame:
    """(rank, device) of each op the device ran itself by the dispatcher's word (a kernel of its
    own, or its fallback running it there), outermost and outside any CPU fallback: coverage's
    native ops where the backend reports no launches."""
    native = np.isin(kind, NATIVE_PATHS) & (owner < 0)
    if not native.any():
        return pd.DataFrame({"rank": np.zeros(0, np.int32), "device": np.zeros(0, object)})
    mine = np.flatnonzero(native & ~has_ancestor(parent, native, int(ops["depth"].to_numpy().max(initial=0))))
    devices = ops["devices"].iloc[mine].astype("category").cat
    labels = np.array([_device_of(str(d)) for d in devices.categories] + [""], dtype=object)
    return pd.DataFrame({"rank": ops["rank"].to_numpy()[mine], "device": labels[devices.codes.to_numpy()]})


def dispatch_fallbacks(ops: pd.DataFrame, parent: np.ndarray, owner: np.ndarray) -> pd.DataFrame:
    """One row per fallback op (``owner``: :func:`fallback_ops`), in ``run.fallbacks``' layout:
    the op's time, thread, device, line and pass, and the bytes its outermost copies moved each
    way (0 where shapes were not recorded)."""
    rows = np.flatnonzero(owner == np.arange(len(ops)))
    if not len(rows):
        return pd.DataFrame(columns=COLUMNS)
    depth = int(ops["depth"].max())
    copy = (owner >= 0) & name_mask(ops, lambda n: n in COPIES)
    outermost = np.flatnonzero(copy & ~has_ancestor(parent, copy, depth))
    to_host = np.zeros(len(ops), np.int64)
    from_host = np.zeros(len(ops), np.int64)
    sizes: dict[tuple[str, str, str, str], tuple[np.ndarray | None, int]] = {}  # a few distinct copies, many times
    cols = [ops[c].to_numpy() for c in ("name", "shapes", "dtypes", "devices")]
    for i in outermost:
        key = tuple(str(c[i]) for c in cols)
        if key not in sizes:
            name, shapes, dtypes, devices = key
            src, dst = _copy_ends(name, _devices(devices))
            # only a move between the host and a device: the CPU kernel's own copies are neither
            way = to_host if src not in ("cpu", "") and dst == "cpu" else \
                from_host if src == "cpu" and dst not in ("cpu", "") else None
            sizes[key] = (way, _source_bytes(name, shapes, dtypes))
        way, nbytes = sizes[key]
        if way is not None:
            way[owner[i]] += nbytes
    f = ops.iloc[rows]
    return pd.DataFrame({
        "rank": f["rank"].to_numpy(), "ts": f["ts"].to_numpy(np.int64), "dur": f["dur"].to_numpy(np.int64),
        "tid": f["tid"].to_numpy(np.int64),
        "device": [_device_of(d) for d in f["devices"].astype(str)],
        "op": f["name"].astype(str).to_numpy(), "bytes_to_host": to_host[rows], "bytes_from_host": from_host[rows],
        "host_op": f["name"].astype(str).to_numpy(), "module": f["module"].astype(str).to_numpy(),
        "source": f["source"].astype(str).to_numpy(), "user_source": f["user_source"].astype(str).to_numpy(),
        "source_full": f["source_full"].astype(str).to_numpy(), "stack": f["stack"].to_numpy(),
        "bwd": f["bwd"].to_numpy(bool), "step": f["step"].to_numpy()})
