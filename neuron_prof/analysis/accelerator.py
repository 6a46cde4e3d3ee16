"""Whether a run ran on an accelerator: the one rule for every figure that speaks of a device.

``run.json``'s ``device`` names the machine's accelerator (``torch.accelerator``), not what the job
used: a CPU loop on a CUDA machine records ``cuda``. So the run's own data decides. It ran on a
device when the device's activity was recorded (kernels, queue flushes, copies), when an op's
inputs or a memory figure name a device other than the host's, or, where no op says its devices
(an imported trace's ops carry none), when the run's metadata names one. Without a device nothing
waits for one: a read of a tensor's value is a read, which an accelerator would make a wait.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from neuron_prof.backends.op_devices import device_types

if TYPE_CHECKING:
    from neuron_prof.store.run import Run

HOST_TYPES = frozenset({"cpu", "meta"})
"""Device types that are no accelerator: the host, and PyTorch's shape-only ``meta`` tensors."""


def ran_on_device(run: Run) -> bool:
    """Whether ``run`` used an accelerator (the module's rule)."""
    if run.device_kernels.size or run.queue_flushes.size or run.device_copies.size:
        return True
    memory = run.memory_steps
    if len(memory) and any(d.partition(":")[0] not in HOST_TYPES for d in _used(memory["device"])):
        return True
    named = [device_types(d) for d in _used(run.ops["devices"])] if len(run.ops) else []
    if any(types - HOST_TYPES for types in named):
        return True
    return not any(named) and str(run.meta.get("device") or "cpu") not in HOST_TYPES


def _used(col: pd.Series) -> list[str]:
    """The distinct values of a column (a categorical's categories that rows use: no per-row work)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy()
        seen = np.bincount(codes[codes >= 0], minlength=len(col.cat.categories)) > 0
        return [str(c) for c in col.cat.categories[seen]]
    return [str(c) for c in col.dropna().unique()]
