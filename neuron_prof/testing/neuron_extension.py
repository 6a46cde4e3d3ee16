"""The emulated device's C++ extension (``_neuron.cpp``), built once per source and torch version
(torch's extension cache) and loaded once per process: what the device (``neuron``) turns on and
its compiler (``neuron_compile``) runs kernels on and asks for fusion groups. Both import it here,
so neither imports the other's insides."""
from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator

import torch

__all__ = ["CUSTOM_KERNELS", "extension", "kernel"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = "_neuron.cpp"
_ext = None
CUSTOM_KERNELS: set[str] = set()
"""Qualified names (``lib::op``) of the custom ops that run as kernels of their own on the device
(``neuron.custom_kernel``): the compiler leaves each as one node and one kernel."""


def _collectors_folder() -> str:
    import neuron_prof.collectors

    return os.path.dirname(os.path.abspath(neuron_prof.collectors.__file__))


def extension():
    """Build or load the device extension (keyed by its source, the API header and torch)."""
    global _ext
    if _ext is None:
        from torch.utils.cpp_extension import load

        header = os.path.join(_collectors_folder(), "neuron_prof_backend.h")
        h = hashlib.sha256()
        for path in (os.path.join(_HERE, _SOURCE), header):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(torch.__version__.encode())
        _ext = load(name=f"neuron_prof_neuron_{h.hexdigest()[:16]}", sources=[os.path.join(_HERE, _SOURCE)],
                    extra_include_paths=[_collectors_folder()], extra_cflags=["-O2", "-DNDEBUG"], verbose=False)
    return _ext


@contextlib.contextmanager
def kernel(name: str) -> Iterator[None]:
    """Every op the calling thread enqueues inside runs as one kernel named ``name`` (what a
    compiler does with a fusion group; ``neuron_prof.testing.neuron_compile`` uses it). The kernel
    runs once the block ends; a flush inside (a sync point, a fallback) ends it early, and the
    rest of the block is a second kernel of the same name."""
    ext = extension()
    ext.begin_kernel(name)
    try:
        yield
    finally:
        ext.end_kernel()
