"""Inductor's fusion decisions (kernel -> FX nodes), read where Inductor generates each kernel.

The compiler collector wraps ``torch._inductor.debug.set_kernel_post_grad_provenance_tracing``,
which Inductor calls for every kernel it generates (fused kernels and extern calls alike) with the
scheduler nodes the kernel covers, whatever ``trace.provenance_tracking_level`` says (at level 0,
the default, it returns at once). The post-grad FX nodes behind those scheduler nodes carry their
history (``meta["from_node"]``), which names the nodes of the graph Dynamo handed to Inductor.
Turning provenance tracking on would give the same facts, but that setting is part of Inductor's
FX-graph cache key: every switch between captured and uncaptured runs would recompile everything.

An FX-graph (or AOT-autograd) cache hit generates no kernel, so the kernels of each graph compiled
under capture are also kept in a side record, a small JSON file per compiled graph named by the
graph's code key (``CompiledFxGraph.cache_key``, the key of its generated module) in
``neuron_prof/fusions/`` inside Inductor's cache directory. A hit of a graph that was compiled
without capture has no record, and no fusion rows.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any, Iterable

Kernels = list[tuple[str, list[str]]]  # (kernel name, names of the FX nodes fused into it)

_KEY = re.compile(r"^[A-Za-z0-9_]{1,200}$")


def fused_nodes(node_schedule: Any, is_extern: bool, pre_grad_graph_id: int | None) -> list[str]:
    """Names of the nodes of Dynamo's graph behind a kernel: for each post-grad node of the
    kernel, the pre-grad nodes it came from (``from_node``, recursively), else its own name (nodes
    made by the joint graph or the backward pass have no pre-grad origin)."""
    if is_extern:
        origin = getattr(node_schedule, "origin_node", None)
        origins: Iterable[Any] = [origin] if origin is not None else getattr(node_schedule, "origins", ())
    else:
        origins = [o for snode in node_schedule
                   for o in getattr(getattr(snode, "node", None), "origins", ())]  # markers have no node
    out: dict[str, None] = {}
    for origin in origins:
        for name in _pre_grad_names(origin, pre_grad_graph_id) or [origin.name]:
            out[str(name)] = None
    return list(out)


def _pre_grad_names(node: Any, graph_id: int | None) -> list[str]:
    names: dict[str, None] = {}
    stack = list(reversed(node.meta.get("from_node") or ()))
    while stack:
        source = stack.pop()
        if getattr(source, "graph_id", None) == graph_id:
            names[source.name] = None
        stack.extend(reversed(getattr(source, "from_node", None) or ()))
    return list(names)


class FusionRecord:
    """The kernels of compiled graphs by code key: this process's compiles, then the side files."""

    def __init__(self) -> None:
        self._known: dict[str, Kernels] = {}

    @staticmethod
    def _path(key: str) -> str | None:
        if not _KEY.match(key):
            return None
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return os.path.join(cache_dir(), "neuron_prof", "fusions", f"{key}.json")

    def remember(self, key: str | None, kernels: Kernels) -> None:
        """Keep ``kernels`` for the graph with code key ``key`` (written atomically: another process
        may read it at once)."""
        if not key or not kernels:
            return
        self._known[key] = kernels
        path = self._path(key)
        if path is None or os.path.exists(path):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"kernels": kernels}, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def recall(self, key: str | None) -> Kernels:
        """The kernels of the graph with code key ``key`` ([] if it was compiled without capture);
        raises if its record cannot be read (the caller counts the loss)."""
        if not key:
            return []
        if key in self._known:
            return self._known[key]
        path = self._path(key)
        if path is None:
            return []
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:  # compiled without capture: no record, nothing is lost
            return []
        # a record that cannot be read raises: the caller counts the cache hit's fusions as lost
        kernels = [(str(k), [str(n) for n in nodes]) for k, nodes in data["kernels"]]
        self._known[key] = kernels
        return kernels
