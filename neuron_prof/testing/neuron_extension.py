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
_SOURCES = ("_neuron.cpp", "_neuron_kineto.cpp")
_HEADERS = ("_neuron_trace.h",)
_ext = None
CUSTOM_KERNELS: set[str] = set()
"""Qualified names (``lib::op``) of the custom ops that run as kernels of their own on the device
(``neuron.custom_kernel``): the compiler leaves each as one node and one kernel."""


def _collectors_folder() -> str:
    import neuron_prof.collectors

    return os.path.dirname(os.path.abspath(neuron_prof.collectors.__file__))


def extension():
    """Build or load the device extension (keyed by its sources, the API header and torch). Its
    Kineto profiler (``_neuron_kineto.cpp``) builds against the libkineto headers torch ships
    (``USE_KINETO``; fmt header-only: the wheel does not export fmt's formatting functions)."""
    global _ext
    if _ext is None:
        from torch.utils.cpp_extension import load

        sources = [os.path.join(_HERE, name) for name in _SOURCES]
        h = hashlib.sha256()
        for path in (*sources, *(os.path.join(_HERE, name) for name in _HEADERS),
                     os.path.join(_collectors_folder(), "neuron_prof_backend.h")):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(torch.__version__.encode())
        kineto = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")
        _ext = load(name=f"neuron_prof_neuron_{h.hexdigest()[:16]}", sources=sources,
                    extra_include_paths=[_collectors_folder(), kineto],
                    extra_cflags=["-O2", "-DNDEBUG", "-DUSE_KINETO", "-DFMT_HEADER_ONLY"], verbose=False)
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
