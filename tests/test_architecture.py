"""The import structure of neuron_prof, read from the source with ``ast`` (nothing is imported):

1. no import cycle among the installed modules (``neuron_prof/``, and ``collectors/``, ``viewer/``,
   ``examples/`` as they are installed: ``neuron_prof.collectors`` ...), counting module-level and
   function-local imports alike: a loop that only runs inside a function is still a loop, one
   refactor away from an ImportError at startup;
2. no upward import: no module reaches for the package face ``neuron_prof/__init__.py`` (``import
   neuron_prof``, ``from neuron_prof import X`` for an X that is not a submodule): the face imports
   the capture side, so whatever imports it imports all of that, and it is for users, not for the
   library itself;
3. one module per command: no module under ``neuron_prof/cli/`` imports another cli module (the
   dispatcher ``cli/__init__`` imports the commands);
4. the CLI is a leaf: nothing outside ``neuron_prof/cli/`` imports from ``neuron_prof.cli`` but the
   entry point ``neuron_prof.cli.main``; library logic a command needs lives in the library.
5. layers: each folder (``neuron_prof/store/``, ``capture/``, ..., ``collectors/``, ``viewer/``) says
   in its ``__init__`` docstring what it may import (``May import: a, b.``); every import from one
   folder into another is one it declares, the declarations form a layer order (no two folders
   that may import each other, directly or not), and the root's few helper modules (errors,
   units, paths, version, progress) import no folder. The C++ sources are held to the same
   order: an ``#include "x.h"`` names a header of the source's own folder or of one it may import;
6. nothing imports the emulated device (``neuron_prof.testing``) but the demo command, the tests,
   benchmarks and examples (port-check's targets load a backend by its module name, as a plugin).

Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PACKAGE_DIRS = {"neuron_prof": "neuron_prof", "neuron_prof.collectors": "collectors",
                "neuron_prof.viewer": "viewer", "neuron_prof.examples": "examples"}
"""Installed package -> source folder (pyproject's ``[tool.setuptools.package-dir]``)."""

ENTRY_POINTS = {"neuron_prof.__main__", "neuron_prof.capture.bootstrap.sitecustomize"}
"""Modules that start the program, not library: ``python -m neuron_prof``, and the
``sitecustomize`` that ``neuron-prof record`` puts first on a child's path (it starts a capture
through the public API, as a user's script would)."""

USER_CODE = {"neuron_prof.examples"}
"""Packages written as a user writes: through the public API, the face included."""


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` imports ``target`` (a module) at ``line``;
    ``names`` are what a ``from target import ...`` takes from it (empty for ``import target``)."""
    importer: str
    target: str
    line: int
    names: tuple[str, ...] = ()


def modules(package_dirs: dict[str, Path]) -> dict[str, Path]:
    """Module name -> source file, for every .py file under the package folders."""
    out: dict[str, Path] = {}
    for package, folder in package_dirs.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node that runs, at module level or inside a function: ``if TYPE_CHECKING:`` bodies skipped."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The known module ``name`` is, or lies in (``a.b.c`` -> ``a.b`` when ``c`` is an attribute)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _bound_names(path: Path) -> set[str]:
    """Names a package's ``__init__`` binds at module level. ``from package import X`` takes such an X
    from the ``__init__`` even where a submodule X exists (``from neuron_prof import profile`` is the
    class the face binds, not the module): Python looks for the attribute first."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import among the known modules (imports of anything else are left out)."""
    bound = {m: _bound_names(p) for m, p in known.items() if p.name == "__init__.py"}
    out: list[Import] = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(alias.name, known)
                    if target:
                        out.append(Import(module, target, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, one level up per extra dot
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known and alias.name not in bound.get(base, ()):  # from package import submodule
                        out.append(Import(module, sub, node.lineno))
                    else:
                        target = _resolve(base, known)
                        if target:
                            out.append(Import(module, target, node.lineno, (alias.name,)))
    return out


@dataclass(frozen=True)
class Cycle:
    """Modules that import each other, directly or not (a strongly connected component), and one
    loop through them, edge by edge."""
    modules: tuple[str, ...]
    path: tuple[Import, ...]


def cycles(edges: list[Import]) -> list[Cycle]:
    """One cycle (its shortest loop from its first module) per set of modules that import each other."""
    graph: dict[str, dict[str, Import]] = {}
    for e in edges:
        graph.setdefault(e.importer, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for component in components:
        members = set(component)
        start = min(component)
        if len(component) == 1 and start not in graph.get(start, {}):
            continue
        # the shortest way from start back to itself inside the component
        came_from: dict[str, Import] = {}
        frontier = [start]
        while frontier and start not in came_from:
            following = []
            for v in frontier:
                for w, e in sorted(graph.get(v, {}).items()):
                    if w in members and w not in came_from:
                        came_from[w] = e
                        following.append(w)
            frontier = following
        path = [came_from[start]]
        while path[-1].importer != start:
            path.append(came_from[path[-1].importer])
        found.append(Cycle(tuple(sorted(component)), tuple(path[::-1])))
    return found


def describe(cycle: Cycle, known: dict[str, Path]) -> str:
    """A cycle edge by edge, each with the line that imports, and every module in its loop."""
    steps = [f"{e.importer} -> {e.target} ({known[e.importer].relative_to(REPO)}:{e.line})" for e in cycle.path]
    return "\n    ".join(steps + [f"(modules in this loop: {', '.join(cycle.modules)})"])


def _where(e: Import, known: dict[str, Path], base: Path = REPO) -> str:
    return f"{known[e.importer].relative_to(base)}:{e.line}: {e.importer} imports {e.target}" + (
        f" ({', '.join(e.names)})" if e.names else "")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


KNOWN = modules({package: REPO / folder for package, folder in PACKAGE_DIRS.items()})
EDGES = imports(KNOWN)


def test_the_source_is_read():
    """The scan sees the tree: a wrong folder would make every other test pass on nothing."""
    assert {"neuron_prof", "neuron_prof.cli", "neuron_prof.collectors", "neuron_prof.viewer",
            "neuron_prof.export.layout"} <= set(KNOWN)
    assert ("neuron_prof.__main__", "neuron_prof.cli", ("main",)) in {(e.importer, e.target, e.names) for e in EDGES}


def test_no_import_cycle():
    found = cycles(EDGES)
    assert not found, "import cycles:\n  " + "\n  ".join(describe(c, KNOWN) for c in found)


def test_no_module_imports_the_package_face():
    bad = [_where(e, KNOWN) for e in EDGES
           if e.target == "neuron_prof" and e.importer not in ENTRY_POINTS
           and not any(_in(e.importer, p) for p in USER_CODE)]
    assert not bad, "imports of the package face neuron_prof/__init__.py (import the module that holds it):\n  " \
        + "\n  ".join(bad)


def test_no_command_imports_another():
    bad = [_where(e, KNOWN) for e in EDGES
           if _in(e.importer, "neuron_prof.cli") and e.importer != "neuron_prof.cli"
           and _in(e.target, "neuron_prof.cli")]
    assert not bad, "cli modules importing cli modules (move what they share into the library):\n  " + "\n  ".join(bad)


def test_only_the_entry_point_of_the_cli_is_imported_outside_it():
    """The library, the viewer, the benchmarks and the tests reach the CLI only through ``main``."""
    everything = modules({package: REPO / folder for package, folder in PACKAGE_DIRS.items()}
                         | {"tests": REPO / "tests", "benchmarks": REPO / "benchmarks"})
    bad = [_where(e, everything) for e in imports(everything)
           if not _in(e.importer, "neuron_prof.cli") and _in(e.target, "neuron_prof.cli")
           and not (e.target == "neuron_prof.cli" and e.names == ("main",))]
    assert not bad, "imports of the CLI's insides (only neuron_prof.cli.main is for outside use):\n  " \
        + "\n  ".join(bad)


def test_a_cycle_is_found_with_its_path(tmp_path):
    """The checker itself, on a small tree: a loop through a function-local import (and a
    relative one) is found and named edge by edge; an import under TYPE_CHECKING is not a loop."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n")
    (pkg / "e.py").write_text("from pkg.d import x\n")
    known = modules({"pkg": pkg})
    found = cycles(imports(known))
    assert [[(e.importer, e.target, e.line) for e in c.path] for c in found] == [
        [("pkg.a", "pkg.sub.b", 1), ("pkg.sub.b", "pkg.sub.c", 2), ("pkg.sub.c", "pkg.a", 1)]]
    assert found[0].modules == ("pkg.a", "pkg.sub.b", "pkg.sub.c")


ROOT_HELPERS = "the root's helpers"
"""What the root's helper modules are called in a layer declaration: importable by every folder."""

TESTING_USERS = {"neuron_prof.cli.demo"}
"""The one library module that may import the emulated device: the demo trains on it."""


def folder_package(name: str, package_dirs: dict[str, Path]) -> str:
    """A layer's name in a declaration (``store``, ``collectors``) -> its package."""
    top = next(iter(package_dirs))
    return f"{top}.{name}"


def _folders(package_dirs: dict[str, Path]) -> dict[str, Path]:
    """The folder packages: each directly under the top package, and each installed beside it."""
    top = next(iter(package_dirs))
    folders = {f"{top}.{d.name}": d for d in sorted(package_dirs[top].iterdir()) if (d / "__init__.py").is_file()}
    return folders | {package: folder for package, folder in package_dirs.items() if package != top}


def declared_layers(package_dirs: dict[str, Path]) -> dict[str, set[str]]:
    """Each folder package directly under the top package (and each installed beside it) -> the
    folder packages its ``__init__`` docstring says it may import (``May import: a, b (why), c.``)."""
    out: dict[str, set[str]] = {}
    for package, folder in _folders(package_dirs).items():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        found = re.search(r"^May import: (.*)$", doc, re.MULTILINE)
        if found is None:
            out[package] = {"<no declaration>"}
            continue
        names = re.sub(r"\([^)]*\)", "", found.group(1)).rstrip(".").split(",")
        out[package] = {folder_package(n.strip(), package_dirs) for n in names
                        if n.strip() and not n.strip().startswith(ROOT_HELPERS)}
    return out


def layer_of(module: str, layers: dict[str, set[str]]) -> str | None:
    """The folder package ``module`` lies in; None for the root's own modules."""
    return next((package for package in layers if _in(module, package)), None)


def layer_violations(package_dirs: dict[str, Path], entry_points: frozenset[str] = frozenset()) -> list[str]:
    """Every import that crosses folders without the importer's declaration, every folder without
    one, every import of a folder by a root helper module, and every loop among the declarations."""
    known = modules(package_dirs)
    layers = declared_layers(package_dirs)
    top = next(iter(package_dirs))
    base = package_dirs[top].parent
    bad = [f"{package}: its __init__ docstring has no 'May import:' line" for package, allowed in layers.items()
           if "<no declaration>" in allowed]
    bad += [f"{package} declares {name}, which is not a folder" for package, allowed in layers.items()
            for name in sorted(allowed - layers.keys() - {"<no declaration>"})]
    for e in imports(known):
        if e.importer in entry_points or e.importer == top:
            continue
        source, target = layer_of(e.importer, layers), layer_of(e.target, layers)
        if target is None or source == target:
            continue
        if source is None:
            bad.append(f"{_where(e, known, base)}: a root helper imports the folder {target}")
        elif target not in layers[source]:
            bad.append(f"{_where(e, known, base)}: {source} may import only {', '.join(sorted(layers[source])) or ROOT_HELPERS}")
    declared = [Import(a, b, 0) for a, allowed in layers.items() for b in sorted(allowed & layers.keys())]
    bad += ["folders that may import each other: " + " -> ".join([c.path[0].importer] + [e.target for e in c.path])
            for c in cycles(declared)]
    return bad


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def include_violations(sources: dict[str, Path], layers: dict[str, set[str]]) -> list[str]:
    """``#include "x"`` in the C++ of each folder package (``sources``: package -> folder) that names
    a header neither in its own folder nor in a folder it may import (one it declares)."""
    headers = {package: {p.name for p in folder.iterdir() if p.suffix == ".h"} for package, folder in sources.items()}
    bad = []
    for package, folder in sources.items():
        for path in sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".h")):
            for name in _INCLUDE.findall(path.read_text(encoding="utf-8")):
                if name in headers[package]:
                    continue
                home = [other for other, names in headers.items() if name in names]
                if not home or not set(home) & layers[package]:
                    bad.append(f"{path.relative_to(folder.parent)}: includes {name}"
                               + (f" from {', '.join(home)}, which {package} may not import" if home else
                                  ", a header of no folder it may import"))
    return bad


def _cpp_folders(package_dirs: dict[str, Path]) -> dict[str, Path]:
    """The folder packages that hold C++ sources."""
    return {p: f for p, f in _folders(package_dirs).items() if any(x.suffix in (".cpp", ".h") for x in f.iterdir())}


def test_each_folder_imports_only_the_layers_it_declares():
    bad = layer_violations({package: REPO / folder for package, folder in PACKAGE_DIRS.items()}, frozenset(ENTRY_POINTS))
    assert not bad, "layer order broken (see each folder's __init__ docstring):\n  " + "\n  ".join(bad)


def test_the_layers_read_are_the_tree():
    """The declarations are read: the lowest folder imports no folder, the CLI may import most."""
    layers = declared_layers({package: REPO / folder for package, folder in PACKAGE_DIRS.items()})
    assert {"neuron_prof.store", "neuron_prof.capture", "neuron_prof.analysis", "neuron_prof.reports",
            "neuron_prof.export", "neuron_prof.importers", "neuron_prof.collectors", "neuron_prof.viewer"} <= set(layers)
    assert layers["neuron_prof.store"] == set()
    assert "neuron_prof.analysis" not in layers["neuron_prof.collectors"]
    assert {"neuron_prof.capture", "neuron_prof.reports", "neuron_prof.export"} <= layers["neuron_prof.cli"]


def test_the_cpp_sources_include_only_their_layers():
    dirs = {package: REPO / folder for package, folder in PACKAGE_DIRS.items()}
    sources = _cpp_folders(dirs)
    assert {"neuron_prof.collectors", "neuron_prof.testing"} <= set(sources)  # the two C++ units are seen
    bad = include_violations(sources, declared_layers(dirs))
    assert not bad, "C++ includes across layers:\n  " + "\n  ".join(bad)


def test_nothing_in_the_profiler_imports_the_emulated_device():
    bad = [_where(e, KNOWN) for e in EDGES if _in(e.target, "neuron_prof.testing")
           and not _in(e.importer, "neuron_prof.testing") and e.importer not in TESTING_USERS
           and not any(_in(e.importer, p) for p in USER_CODE)]
    assert not bad, "imports of neuron_prof.testing (load a backend by name: neuron_prof.backends.targets):\n  " \
        + "\n  ".join(bad)


def test_a_planted_violation_is_found(tmp_path):
    """The checker itself, on a small tree of three layers: an import against the declared order,
    a folder without a declaration, two folders declared above each other, a root helper that
    imports a folder, and a C++ include of a header from a layer above are each found."""
    pkg = tmp_path / "pkg"
    for folder, doc in (("low", "May import: the root's helpers only."), ("mid", "May import: low."),
                        ("high", "May import: mid (why), low."), ("loose", "No declaration here."),
                        ("a", "May import: b."), ("b", "May import: a.")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text(f'"""{doc}"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("from pkg.mid import m\n")
    (pkg / "low" / "l.py").write_text("import os\n")
    (pkg / "mid" / "m.py").write_text("from pkg.low import l\n")
    (pkg / "high" / "h.py").write_text("from pkg.mid import m\nfrom pkg.low import l\n")
    (pkg / "low" / "bad.py").write_text("def f():\n    from pkg.high import h\n")
    (pkg / "mid" / "api.h").write_text("#pragma once\n")
    (pkg / "low" / "x.cpp").write_text('#include <vector>\n#include "api.h"\n')
    (pkg / "high" / "y.cpp").write_text('#include "api.h"\n')
    dirs = {"pkg": pkg}
    bad = layer_violations(dirs)
    assert any("pkg/low/bad.py:2: pkg.low.bad imports pkg.high.h: pkg.low may import only the root's helpers" in b
               for b in bad), bad
    assert "pkg.loose: its __init__ docstring has no 'May import:' line" in bad
    assert any(b.startswith("folders that may import each other: pkg.a -> pkg.b -> pkg.a") for b in bad), bad
    assert any("pkg/helper.py:1" in b and "a root helper imports the folder pkg.mid" in b for b in bad), bad
    assert len(bad) == 4, bad  # and nothing else: mid -> low and high -> mid, low are declared
    cpp = include_violations(_cpp_folders(dirs), declared_layers(dirs))
    assert cpp == ["low/x.cpp: includes api.h from pkg.mid, which pkg.low may not import"]
