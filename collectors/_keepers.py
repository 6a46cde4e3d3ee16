"""What keeps leaked storages alive: a bounded walk of the Python objects that refer to them.

Allocation stacks say where a leaked block was made; what a person has to change is the object
that keeps it (``history.append(val_loss)``, ``self.cache[step] = out``). No allocator knows
that: only Python's own references do. So, from a set of storages (device, address):

1. the tensors that own them: Python tensors over the storage, or tensors whose autograd graph
   holds it (a ``grad_fn`` chain's saved tensors: a kept loss keeps its graph's activations);
2. what holds those tensors, one or two levels up (``gc.get_referrers``, one pass over the
   interpreter's objects per level, and the frames of every thread), until a named place: a
   module global, an object's attribute, a function's local, a closure variable.

Bounded: at most :data:`MAX_OWNERS` tensors and :data:`MAX_NODES` graph nodes are followed, and
the walk stops at its time budget, saying so (``KeeperWalk.stopped``). It runs at the end of
capture and at an always-on dump (collectors/memory.py), never inside a step on the training
thread: it reads live objects that a step is busy changing. benchmarks/keepers.py times it.
"""
from __future__ import annotations

import gc
import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

WALK_BUDGET_S = 1.0
"""Time the walk may take; past it, what was found so far is kept and the walk says it stopped."""
MAX_OWNERS = 256
"""Tensors whose holders are looked for (those owning the most of the storages' bytes first)."""
MAX_NODES = 200_000
"""Autograd graph nodes followed, all graphs together."""
_BATCH = 16  # owners looked for in one pass over the interpreter's objects (_places)
_LEVELS = 3  # holders looked through (a tensor in a dict in a list held by a global)
_CONTAINERS = (list, tuple, set, frozenset, dict)


@dataclass(frozen=True)
class Kept:
    """A storage and what keeps it: ``via`` is ``tensor`` (a Python tensor over it) or ``autograd
    graph`` (a tensor's graph saved it); ``keeper`` the holder as the user wrote it (``list
    history``, ``dict self.cache``), ``scope`` where that name lives (``global``, ``Trainer
    attribute``, ``local of main()``), ``file`` the module or function's file ("" if none)."""
    device: str
    addr: int
    via: str
    keeper: str
    scope: str
    file: str


@dataclass
class KeeperWalk:
    """What one walk found, over how many objects, how long it took, and why it stopped early
    ("" if it did not)."""
    kept: list[Kept] = field(default_factory=list)
    objects: int = 0
    storages: int = 0
    dur_ns: int = 0
    stopped: str = ""


class _OutOfTime(Exception):
    pass


@dataclass(frozen=True)
class _Place:
    """A named place that holds an object: its name, scope and file."""
    name: str
    scope: str
    file: str


def walk(storages: dict[tuple[str, int], int], budget_s: float = WALK_BUDGET_S) -> KeeperWalk:
    """The keepers of ``storages`` ((device, address) -> bytes). Never raises for what it finds in
    the interpreter: an object that cannot be read is skipped."""
    t0 = time.monotonic_ns()
    out = KeeperWalk(storages=len(storages))
    deadline = t0 + int(budget_s * 1e9)
    try:
        _walk(storages, out, deadline)
    except _OutOfTime:
        out.stopped = f"stopped at its time budget ({budget_s:g} s): keepers of the storages not reached are unknown"
    out.dur_ns = time.monotonic_ns() - t0
    return out


def _check(deadline: int) -> None:
    if time.monotonic_ns() > deadline:
        raise _OutOfTime


def _walk(storages: dict[tuple[str, int], int], out: KeeperWalk, deadline: int) -> None:
    import torch

    if not storages:
        return
    objects = gc.get_objects()
    out.objects = len(objects)
    # plain tensors only (type(): no __class__ hook runs): a subclass (FakeTensor, DTensor) owns no
    # storage of its own to ask about, or wraps a plain tensor that is found itself
    kinds = {k for k in set(map(type, objects)) if k is torch.Tensor or k is torch.nn.Parameter}
    tensors = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))  # at C speed
    del objects
    _check(deadline)
    owners, held = _owners(tensors, storages, deadline)
    del tensors
    # a kept loss's graph holds the activations, whose own Python tensors torch keeps alive for the
    # graph but nothing of the user's holds: the graph's root is looked for, and a storage's own
    # tensors only where no graph holds it or its graph's root was not placed
    in_graphs = {k for i in held for k in held[i]["autograd graph"]}
    best: dict[tuple[str, int], Kept] = {}
    first = {i: [("autograd graph", k) for k in held[i]["autograd graph"]]
             + [("tensor", k) for k in held[i]["tensor"] if k not in in_graphs] for i in held}
    for wanted in (first, {i: [("tensor", k) for k in held[i]["tensor"]] for i in held}):
        mine = {i: [(via, k) for via, k in wanted[i] if k not in best] for i in wanted}
        ranked = sorted((i for i in mine if mine[i]), key=lambda i: -sum(storages[k] for _, k in mine[i]))
        if len(ranked) > MAX_OWNERS:
            out.stopped = f"followed the {MAX_OWNERS} tensors owning the most bytes of {len(ranked)}"
        places = _places(owners, ranked[:MAX_OWNERS], deadline) if ranked else {}
        for i in ranked[:MAX_OWNERS]:
            if i in places:
                keeper, place = places[i]
                best.update({k: Kept(k[0], k[1], via, keeper, place.scope, place.file) for via, k in mine[i]})
    out.kept = list(best.values())


def _storage_key(t: Any) -> tuple[str, int] | None:
    """(device, storage address) of a plain tensor; None for any other (a FakeTensor that
    torch.compile left alive has no real storage to ask about)."""
    torch = sys.modules["torch"]
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return None
    try:
        return str(t.device), t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - sparse, meta, a tensor subclass without storage
        return None


def _owners(tensors: list, storages: dict[tuple[str, int], int], deadline: int
            ) -> tuple[dict[int, Any], dict[int, dict[str, list]]]:
    """The tensors that own any of ``storages`` by id, and per id which, by how (:class:`Kept`'s
    ``via``): their own storage, and those their graph saved if they are the graph's root (no
    other graph leads to their ``grad_fn``: torch keeps the Python tensors of a graph's inner
    results alive with it)."""
    owners: dict[int, Any] = {}
    held: dict[int, dict[str, list]] = {}
    rooted = []
    for t in tensors:
        key = _storage_key(t)
        if key in storages:
            owners[id(t)] = t
            held[id(t)] = {"tensor": [key], "autograd graph": []}
        if getattr(t, "grad_fn", None) is not None:
            rooted.append(t)
    _check(deadline)
    seen: dict[int, Any] = {}
    inner: set[int] = set()
    saved_names: dict[type, list[str]] = {}
    for t in rooted:  # every graph once: which nodes are another node's input
        for _ in _graph_storages(t.grad_fn, seen, saved_names, deadline, inner):
            pass
    seen.clear()
    for t in rooted:
        if id(t.grad_fn) in inner:
            continue
        found = [k for k in _graph_storages(t.grad_fn, seen, saved_names, deadline) if k in storages]
        if found:
            owners[id(t)] = t
            held.setdefault(id(t), {"tensor": [], "autograd graph": []})["autograd graph"] = found
    return owners, held


def _graph_storages(root: Any, seen: dict[int, Any], saved_names: dict[type, list[str]], deadline: int,
                    inner: set[int] | None = None) -> Iterable[tuple[str, int]]:
    """The storages of the saved tensors of the graph under ``root`` not walked before (``seen``:
    the nodes already followed, all graphs together, by id); ``inner`` collects the ids of the
    nodes that are another's input (none are read then: only the shape of the graphs)."""
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        if len(seen) >= MAX_NODES:
            return
        seen[id(node)] = node  # (an id is only unique while its object lives)
        if len(seen) % 1024 == 0:
            _check(deadline)
        try:
            inputs = [n for n, _ in node.next_functions if n is not None]
        except Exception:  # noqa: BLE001 - a node without next_functions
            inputs = []
        todo.extend(inputs)
        if inner is not None:
            inner.update(id(n) for n in inputs)
            continue
        kind = type(node)
        names = saved_names.get(kind)
        if names is None:
            names = saved_names[kind] = [n for n in dir(node) if n.startswith("_saved_")
                                         and not n.endswith(("_sym_sizes", "_sym_strides"))]
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed by backward, or not a tensor
                continue
            for v in value if isinstance(value, (list, tuple)) else (value,):
                key = _storage_key(v) if hasattr(v, "untyped_storage") else None
                if key is not None:
                    yield key


@dataclass(slots=True)
class _Held:
    """An object looked for: the owners it stands for, how it is called so far ("" for an owner
    itself; ``list`` for a list that holds one ...), and, for a dict, its string keys' members
    (key, how that member is called, the owners it stands for): an object's ``__dict__`` names
    them as attributes."""
    obj: Any
    owners: list[int]
    called: str
    keys: list[tuple[str, str, list[int]]] = field(default_factory=list)


def _places(owners: dict[int, Any], ranked: list[int], deadline: int) -> dict[int, tuple[str, _Place]]:
    """id(owner) -> (the keeper as the user wrote it, its place), for the owners ``ranked`` (ids
    of ``owners``, most bytes first). A pass over the interpreter's objects costs about the same
    for one object as for a few, and grows with each one more (``gc.get_referrers`` compares every
    reference with each): so :data:`_BATCH` owners at a time, and an owner in a container already
    placed (the other losses in ``history``) takes that container's place without a pass."""
    modules = {id(vars(m)): m for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    found: dict[int, tuple[str, _Place]] = {}
    placed: dict[int, tuple[Any, str, _Place]] = {}  # containers placed: id -> (it, its text, place)
    left = list(ranked)
    while left:
        batch = [owners[i] for i in left[:_BATCH]]
        _place_batch(batch, found, placed, modules, {id(owners), id(left)}, deadline)
        del batch
        for container, text, where in list(placed.values()):
            for i in owners.keys() & set(map(id, _values(container))):
                found.setdefault(i, (text, where))
        left = [i for i in left[_BATCH:] if i not in found]
    return found


def _place_batch(batch: list, found: dict[int, tuple[str, _Place]], placed: dict[int, tuple[Any, str, _Place]],
                 modules: dict[int, Any], mine: set[int], deadline: int) -> None:
    """Places the owners of ``batch`` (into ``found``), looking up to :data:`_LEVELS` holders up:
    ``list history`` (global), ``dict self.cache`` (attribute). ``mine``: ids of the walk's own
    objects that hold them, which are no keepers."""
    level: dict[int, _Held] = {id(t): _Held(t, [id(t)], "") for t in batch}
    mine = {*mine, id(batch), id(level), id(found), id(placed)}

    def place(h: _Held, called: str, where: _Place, owners_of: list[int] | None = None) -> None:
        text = f"{called} {where.name}" if called else f"tensor {where.name}"
        for o in h.owners if owners_of is None else owners_of:
            found.setdefault(o, (text, where))
        if called and owners_of is None:
            placed.setdefault(id(h.obj), (h.obj, text, where))

    for _ in range(_LEVELS):
        _check(deadline)
        up: dict[int, _Held] = {}
        mine.add(id(up))
        holders = gc.get_referrers(*[h.obj for h in level.values()])
        mine.add(id(holders))
        for holder in [*holders, *_frames()]:
            if id(holder) in mine or isinstance(holder, _Held):
                continue
            for obj_id, where in _named(holder, level, modules):
                place(level[obj_id], level[obj_id].called, where)
            inner = _namespace_of(holder, level)
            if inner is not None:  # an object whose __dict__ was looked for: its keys are attributes
                cls = type(holder).__name__
                for key, called, owners_of in inner.keys:
                    place(inner, called, _Place(f"self.{key}", f"{cls} attribute", ""), owners_of)
            if isinstance(holder, _CONTAINERS) and id(holder) not in modules:
                _contain(holder, level, up, found)
        level = {i: h for i, h in up.items() if any(o not in found for o in h.owners)}
        if not level:
            break
        mine.add(id(level))


def _values(container: Any) -> list:
    try:
        return list(container.values() if isinstance(container, dict) else container)
    except (RuntimeError, TypeError):  # changed size while read (another thread)
        return []


def _contain(holder: Any, level: dict[int, _Held], up: dict[int, _Held], found: dict) -> None:
    """``holder`` (a container) holds objects of ``level``: it is looked for one level up, for
    the owners not placed yet. Its members are matched at C speed (a list of a million objects
    costs milliseconds); a dict's string keys are read for the members it holds."""
    kind = type(holder).__name__
    hit = level.keys() & set(map(id, _values(holder)))
    if not hit:
        return
    try:
        keys = [(k, id(v)) for k, v in list(holder.items()) if id(v) in hit] if isinstance(holder, dict) else []
    except RuntimeError:  # changed size while read (another thread)
        keys = []
    entry = up.setdefault(id(holder), _Held(holder, [], kind))
    for i in hit:
        h = level[i]
        owners_of = [o for o in h.owners if o not in found]
        entry.owners.extend(owners_of)
        if h.called:
            entry.called = f"{h.called} in {kind}"
    entry.keys.extend((k, level[i].called, [o for o in level[i].owners if o not in found])
                      for k, i in keys if isinstance(k, str))


def _namespace_of(holder: Any, level: dict[int, _Held]) -> _Held | None:
    """The looked-for dict that is ``holder``'s ``__dict__``, if it is one."""
    if isinstance(holder, (*_CONTAINERS, type)) or type(holder).__name__ in ("frame", "cell"):
        return None
    try:
        d = object.__getattribute__(holder, "__dict__")
    except (AttributeError, TypeError):
        return None
    return level.get(id(d))


def _frames() -> list:
    """The frames of every thread but the walk's own (their locals are not objects gc sees)."""
    out = []
    here = sys._getframe()
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_filename != here.f_code.co_filename:
                out.append(frame)
            frame = frame.f_back
    return out


def _named(holder: Any, level: dict[int, tuple[Any, list[int], str]], modules: dict[int, Any]
           ) -> Iterable[tuple[int, _Place]]:
    """The objects of ``level`` that ``holder`` names, and the place: a global of a module, an
    attribute of an object, a local of a frame, a closure variable."""
    if isinstance(holder, dict) and id(holder) in modules:
        m = modules[id(holder)]
        items, place = holder.items(), lambda k: _Place(k, "global", getattr(m, "__file__", None) or m.__name__)
    elif type(holder).__name__ == "frame":
        code = holder.f_code
        items = holder.f_locals.items()
        place = (lambda k: _Place(k, f"local of {code.co_name}()", code.co_filename))
        if code.co_name == "<module>":  # a module's own frame: its locals are its globals
            place = (lambda k: _Place(k, "global", code.co_filename))
    elif type(holder).__name__ == "cell":
        try:
            contents = holder.cell_contents
        except ValueError:
            return
        if id(contents) in level:
            yield id(contents), _Place("(closure)", "closure variable", "")
        return
    elif not isinstance(holder, _CONTAINERS) and hasattr(holder, "__dict__") and not isinstance(holder, type):
        try:
            items = vars(holder).items()
        except TypeError:
            return
        cls = type(holder).__name__
        items, place = items, lambda k: _Place(f"self.{k}", f"{cls} attribute", "")
    else:
        return
    try:
        named = [(k, id(v)) for k, v in list(items) if isinstance(k, str)]
    except RuntimeError:  # changed size while read
        return
    for k, i in named:
        if i in level:
            yield i, place(k)
