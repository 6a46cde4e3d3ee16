"""``torch.compile(model, backend="neuron")`` for the emulated device: a TorchDynamo backend that
lowers the graphs itself (not Inductor), as TorchNeuron's does.

Through AOTAutograd (forward and backward graphs of ATen ops), each graph is compiled in three
timed phases, reported as Dynamo compile events (so a capture's ``compile_phases`` holds them):
``neuron lowering`` (the graph's ATen ops; symbolic shapes are refused, as the real backend
cannot compile automatic dynamic shapes: compile with ``dynamic=False``, and a new input shape is
then a recompile), ``neuron partitioning`` (the ops into fusion groups by the eager queue's own
rule, the extension's ``fusion_groups``; ops that only make views join the group they are in) and
``neuron codegen`` (the plan that runs each group as one kernel on the device queue,
``neuron_extension.kernel``). A custom kernel (``neuron.custom_kernel``) stays one opaque node, a
group of its own that runs as the op's own kernel, named after the op. Compiled graphs are cached
by the graph's code and its inputs' metadata (``compile_cache``: cache ``neuron_graph``, hit or
miss) and every group is reported as a fusion (``fusions``: backend ``neuron``, the group's kernel
name and its FX nodes).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from neuron_prof.testing.neuron_extension import CUSTOM_KERNELS, extension, kernel

BACKEND = "neuron"
CACHE = "neuron_graph"
_cache: dict[str, "_Plan"] = {}
_graph_ids = itertools.count()


class NeuronDynamicShapeError(RuntimeError):
    """A graph with symbolic shapes reached the backend."""


class _Plan:
    """A compiled graph: its nodes in order, each with the kernel (group) it runs in."""

    def __init__(self, gm: torch.fx.GraphModule, groups: list[tuple[str, list[torch.fx.Node]]]) -> None:
        self.gm = gm
        self.groups = groups

    def __call__(self, *inputs: Any) -> Any:
        env: dict[torch.fx.Node, Any] = {}
        placeholders = iter(inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
        result = None
        for name, nodes in self.groups:
            # a custom kernel's group is the op's own kernel: the op opens it itself
            with contextlib.nullcontext() if name in CUSTOM_KERNELS else kernel(name):
                for node in nodes:
                    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
                    if node.op == "output":
                        result = args[0]
                    elif node.op == "get_attr":
                        env[node] = getattr(self.gm, node.target)
                    else:
                        env[node] = node.target(*args, **kwargs)
        return result


def _is_view(node: torch.fx.Node) -> bool:
    """Ops that only make metadata (views, getitem of a tuple): they never reach the queue."""
    target = node.target
    if node.op != "call_function":
        return True
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True  # operator.getitem and friends
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _check_static(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    for i, x in enumerate(example_inputs):
        dims = list(x.shape) if isinstance(x, torch.Tensor) else [x]
        if any(isinstance(d, torch.SymInt) for d in dims):
            raise NeuronDynamicShapeError(
                f"neuron: graph input {i} has symbolic shape {list(dims)}: the neuron backend compiles "
                "static shapes only; use torch.compile(..., backend='neuron', dynamic=False) (each new "
                "shape is then a recompile)")


def _cache_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    h = hashlib.sha256(gm.code.encode())
    for x in example_inputs:
        h.update(repr((tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device))
                      if isinstance(x, torch.Tensor) else x).encode())
    return h.hexdigest()


def _partition(gm: torch.fx.GraphModule, graph_name: str) -> list[tuple[str, list[torch.fx.Node]]]:
    nodes = [n for n in gm.graph.nodes if n.op != "placeholder"]
    queued = [n for n in nodes if not _is_view(n) and n.op != "output"]
    numbers = dict(zip(queued, extension().fusion_groups([n.target._schema.name for n in queued])))
    groups: list[tuple[str, list[torch.fx.Node]]] = [(f"{graph_name}_k0", [])]
    current = 0
    for node in nodes:
        g = numbers.get(node, current)
        if g != current:
            current = g
            groups.append((f"{graph_name}_k{g}", []))
        groups[-1][1].append(node)
    # a custom kernel is an op of no known kind, so its group holds no other queued op: the group
    # is named after it (the kernel it opens itself)
    return [(next((n.target._schema.name for n in members if n in numbers
                   and n.target._schema.name in CUSTOM_KERNELS), name), members) for name, members in groups]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The backend's compiler of one ATen graph (AOTAutograd's forward or backward)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.utils import dynamo_timed

    from neuron_prof.collectors.compiler import report_cache, report_fusion

    with dynamo_timed("neuron lowering"):
        _check_static(gm, example_inputs)
        key = _cache_key(gm, example_inputs)
    plan = _cache.get(key)
    report_cache(CACHE, "miss" if plan is None else "hit")
    if plan is None:
        graph_name = f"neuron_graph_{next(_graph_ids)}"
        with dynamo_timed("neuron partitioning"):
            groups = _partition(gm, graph_name)
        with dynamo_timed("neuron codegen"):
            plan = _cache[key] = _Plan(gm, groups)
    for name, nodes in plan.groups:
        report_fusion(BACKEND, name, [n.name for n in nodes if n.op not in ("output", "placeholder")])
    return make_boxed_func(plan)  # AOTAutograd's calling convention (one list of inputs)


def register() -> None:
    """Register ``backend="neuron"`` with TorchDynamo (idempotent)."""
    from torch._dynamo import list_backends, register_backend
    from torch._dynamo.backends.common import aot_autograd

    if BACKEND not in list_backends(exclude_tags=()):
        register_backend(aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph), name=BACKEND)
