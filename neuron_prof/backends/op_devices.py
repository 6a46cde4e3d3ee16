"""An op's ``devices`` metadata (``ops.devices``, the eager engine's: ``collectors/_engine.py``):
one comma-separated entry per input, empty for a non-tensor, a tensor list's devices joined by
``|`` (``"neuron:0,,neuron:0|cpu"``). Read here once for the capture (which ops ran on a device)
and the analyses (which device a fallback or kernel belongs to). No torch, no pandas."""
from __future__ import annotations


def input_devices(devices: str) -> list[str]:
    """Every device an op's inputs name, in order, tensor lists flattened (``"neuron:0"``, ``"cpu"``)."""
    return [d.strip() for part in devices.split(",") for d in part.split("|") if d.strip()]


def device_types(devices: str) -> set[str]:
    """The device types an op's inputs name (``{"neuron", "cpu"}``)."""
    return {d.partition(":")[0] for d in input_devices(devices)}
