"""The porting inventory of a run (``neuron-prof port-check``): the lines of its code that call
what only CUDA has, and what the ops a target backend leaves to the CPU cost.

Pure functions: source text and DataFrames in, DataFrames out. Reading the run's files and asking
the target's dispatcher which ops fall back are ``neuron_prof.reports.port``'s and
``neuron_prof.backends.op_support``'s jobs.

Call sites are found in the syntax tree, not by matching text, so a comment or a string that
mentions ``torch.cuda.synchronize()`` is no call site, and an alias is followed (``import torch
as th`` makes ``th.cuda.synchronize()`` one; ``from torch.utils.cpp_extension import
load_inline`` makes both the import and each ``load_inline(...)`` call one).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Collection

import numpy as np
import pandas as pd

SITE_KINDS: dict[str, str] = {
    "cuda_call": 'a CUDA-only call: use .to("{device}"), or .to(device) with the device chosen once',
    "torch_cuda": "CUDA's device module: use torch.accelerator, which serves every device (or torch.{device})",
    "cuda_device": 'the CUDA device by name: use "{device}", or torch.accelerator.current_accelerator()',
    "triton": "a Triton kernel, which runs on GPUs only: write it for {device}, or use the ops it replaces",
    "cpp_extension": "a C++/CUDA extension: its kernels must be built for {device}",
    "flash_attn": "flash-attn's CUDA kernels: use torch.nn.functional.scaled_dot_product_attention",
}
"""Each kind of call site, and what to change it to (``{device}``: the target)."""
SITE_COLUMNS = ["line", "end_line", "kind", "text"]

_MODULES = {"torch.cuda": "torch_cuda", "triton": "triton", "torch.utils.cpp_extension": "cpp_extension",
            "flash_attn": "flash_attn"}
"""What a dotted name under each of these modules is a call site of."""
_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")
_TEXT_MAX = 80
_BRACKET_SPACE = re.compile(r"(?<=[(\[{]) | (?=[)\]}])")
"""A space that a line break inside brackets leaves when a site's code is put on one line."""


def call_sites(source: str) -> pd.DataFrame:
    """The call sites in a Python file's text, one row each, by line: ``line``
    and ``end_line`` (the lines whose execution a run's stacks would show: the site's simple
    statement, or the site itself in a compound statement's header), ``kind`` (a key of
    :data:`SITE_KINDS`) and ``text`` (the site's code on one line). A ``SyntaxError`` if it is
    not Python."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    rows = []
    for node in ast.walk(tree):
        kind = _site_kind(node, aliases, parent)
        if kind is not None:
            shown = _shown(node, parent)
            text = _BRACKET_SPACE.sub("", " ".join((ast.get_source_segment(source, shown) or "").split()))
            if shown in getattr(parent.get(shown), "decorator_list", ()):
                text = "@" + text
            if len(text) > _TEXT_MAX:
                text = text[:_TEXT_MAX - 3] + "..."
            span = _statement(node, parent)
            rows.append((span.lineno, span.end_lineno, kind, text))
    return pd.DataFrame(sorted(rows), columns=SITE_COLUMNS)


def _shown(node: ast.AST, parent: dict[ast.AST, ast.AST]) -> ast.AST:
    """The code that shows a site: a call with its arguments, a string with what it is part of
    (``device == "cuda"``, ``torch.device("cuda", 0)``, ``device = "cuda"``), else the site."""
    up = parent.get(node)
    if isinstance(up, ast.Call) and up.func is node:
        return up
    if isinstance(node, (ast.Constant, ast.JoinedStr)) and up is not None and not (
            isinstance(up, ast.stmt) and hasattr(up, "body")):
        return up
    return node


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Name -> the dotted name it was imported as, from every import in the file."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _module_kind(dotted: str | None) -> str | None:
    for module, kind in _MODULES.items():
        if dotted is not None and (dotted == module or dotted.startswith(module + ".")):
            return kind
    return None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` of a chain of attributes on a name, its first name resolved through the imports."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _site_kind(node: ast.AST, aliases: dict[str, str], parent: dict[ast.AST, ast.AST]) -> str | None:
    """The kind of call site ``node`` is, if it is one. A name is one where it is called or
    decorates (``flash_attn_func(...)``, not ``if triton is not None``); a chain of attributes
    wherever it is read, once, at its longest (``torch.cuda.synchronize``, not ``torch.cuda`` in it)."""
    if isinstance(node, ast.Import):
        return next((k for k in (_module_kind(a.name) for a in node.names) if k), None)
    if isinstance(node, ast.ImportFrom):
        return None if node.level or not node.module else next(
            (k for k in (_module_kind(f"{node.module}.{a.name}") for a in node.names) if k), None)
    if isinstance(node, ast.Constant):
        return "cuda_device" if isinstance(node.value, str) and _CUDA_DEVICE.match(node.value) else None
    if isinstance(node, ast.JoinedStr):  # f"cuda:{rank}"
        head = node.values[0] if node.values else None
        return "cuda_device" if isinstance(head, ast.Constant) and head.value == "cuda:" else None
    up = parent.get(node)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        used = (isinstance(up, ast.Call) and up.func is node) or node in getattr(up, "decorator_list", ())
        return _module_kind(aliases.get(node.id, node.id)) if used else None
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and not isinstance(up, ast.Attribute):
        kind = _module_kind(_dotted(node, aliases))
        if kind is None and node.attr == "cuda" and isinstance(up, ast.Call) and up.func is node:
            return "cuda_call"
        return kind
    return None


def _statement(node: ast.AST, parent: dict[ast.AST, ast.AST]) -> ast.AST:
    """What a run's stacks show of a site's execution: its simple statement, or in a compound
    statement's header (an ``if`` test, a decorator) the site itself."""
    up = node
    while not isinstance(up, ast.stmt):
        up = parent[up]
    return node if hasattr(up, "body") else up


def mark_ran(sites: pd.DataFrame, lines: Collection[int]) -> pd.DataFrame:
    """``sites`` of one file with ``ran``: whether any of a site's lines is among ``lines`` (the
    file's lines in the run's stacks)."""
    seen = np.array(sorted(set(lines)), dtype=np.int64)
    lo = np.searchsorted(seen, sites["line"].to_numpy(np.int64), side="left")
    hi = np.searchsorted(seen, sites["end_line"].to_numpy(np.int64), side="right")
    return sites.assign(ran=hi > lo)


OP_COST_COLUMNS = ["op", "calls", "self_ns", "pct", "lines"]


def op_costs(ops: pd.DataFrame, self_ns: np.ndarray, names: Collection[str]) -> pd.DataFrame:
    """The ops named ``names``, one row per name, most time first: ``calls``, ``self_ns`` (the sum
    of ``self_ns``, each row's run-time self time), ``pct`` (that, in percent of all of ``ops``'
    self time) and ``lines`` (the user's lines that ran them, ``user_source``, most time first)."""
    total = float(self_ns.sum())
    hit = ops["name"].isin(list(names)).to_numpy()
    if not hit.any():
        return pd.DataFrame(columns=OP_COST_COLUMNS)
    rows = pd.DataFrame({"op": ops["name"].to_numpy()[hit].astype(str), "self_ns": self_ns[hit],
                         "line": ops["user_source"].to_numpy()[hit].astype(str)})
    by_line = rows.groupby(["op", "line"], sort=False)["self_ns"].sum().reset_index()
    by_line = by_line[by_line["line"] != ""].sort_values(["op", "self_ns", "line"], ascending=[True, False, True])
    out = rows.groupby("op")["self_ns"].agg(calls="size", self_ns="sum").reset_index()
    out["pct"] = 100.0 * out["self_ns"] / total if total > 0 else 0.0
    out["lines"] = [by_line.loc[by_line["op"] == op, "line"].tolist() for op in out["op"]]
    return out.sort_values(["self_ns", "op"], ascending=[False, True], ignore_index=True)[OP_COST_COLUMNS]


def verdict(sites: int, fallbacks: pd.DataFrame, no_kernel: int, unknown: int, device: str) -> str:
    """One line: "runs as is", or what stands in the way (call sites to change, ops that fall
    back to the CPU and their share of op time, ops outside aten with no kernel for ``device``,
    ops this process does not know)."""
    parts = []
    if sites:
        parts.append(f"{sites} call site{'s' if sites != 1 else ''} to change")
    if len(fallbacks):
        n = len(fallbacks)
        parts.append(f"{n} op{'s' if n != 1 else ''} fall{'' if n != 1 else 's'} back: "
                     f"{fallbacks['pct'].sum():.1f}% of op time")
    if no_kernel:
        parts.append(f"{no_kernel} custom op{'s' if no_kernel != 1 else ''} without a {device} kernel")
    if unknown:
        parts.append(f"{unknown} op{'s' if unknown != 1 else ''} not registered in this process")
    return ", ".join(parts) or "runs as is"
