"""Typed summary sections to parsed JSON and back, driven by the dataclasses' annotations.

The summary is JSON in two places: ``neuron-prof report --json`` and the copy stored in the run
(``reports.stored``). Both go through here, so the JSON is exactly the dataclasses' fields, in
their order. Reading back is a check as much as a conversion: a stored summary is a run file,
someone else's data, and the report, the findings and the viewer format its fields without
checking them again (``f"{row.median_ms:.1f}"``). So :func:`from_json` accepts a value only if
every field has its annotated JSON type, and raises :class:`NotASummary` (never anything else)
for the first that does not.

Annotations read as JSON types: ``int`` an int (never a bool), ``float`` a number (int or
float), ``str``, ``bool``, ``None`` (null: what ``analysis.records`` makes of NaN), ``list[X]``,
``dict[str, X]``, ``Literal[v]`` exactly ``v``, ``X | Y`` either, a dataclass an object with
exactly its fields. A field whose default is :data:`ABSENT` may be missing (the key is left out
when it is ABSENT); a field with ``metadata={FLATTEN: True}`` (a ``dict[str, X]``) holds the keys
no other field names, written in place of the field (the compile phases of a compile-time row).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

__all__ = ["ABSENT", "Absent", "FLATTEN", "NotASummary", "to_json", "from_json"]

FLATTEN = "flatten"


class Absent:
    """The type of :data:`ABSENT`: a field whose key the JSON leaves out."""

    _instance: Absent | None = None

    def __new__(cls) -> Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "ABSENT"  # pickled (the viewer's cache) as the module's one instance


ABSENT = Absent()


class NotASummary(ValueError):
    """A parsed JSON value that is not a summary: names the first field that does not fit."""


def to_json(value: Any) -> Any:
    """``value`` (a dataclass of the summary, or anything in one) as parsed JSON: objects in field
    order, ABSENT fields left out, flattened fields in place, NaN as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is ABSENT:
                continue
            if f.metadata.get(FLATTEN):
                out.update((k, to_json(x)) for k, x in v.items())
            else:
                out[f.name] = to_json(v)
        return out
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


T = typing.TypeVar("T")


def from_json(cls: type[T], value: Any) -> T:
    """``value`` (parsed JSON) as ``cls``, checked field by field; :class:`NotASummary` if any
    field is missing, unknown or of another type."""
    return _decode(cls, value, cls.__name__)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool, bool], ...]:
    """(name, type, may be absent, flattened) of each field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is ABSENT, bool(f.metadata.get(FLATTEN)))
                 for f in dataclasses.fields(cls))


def _fail(where: str, what: str) -> NotASummary:
    return NotASummary(f"not a summary: {where} {what}")


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for alternative in typing.get_args(tp):
            try:
                return _decode(alternative, value, where)
            except NotASummary:
                continue
        raise _fail(where, f"is not {_name(tp)}")
    if origin is Literal:
        if any(type(value) is type(v) and value == v for v in typing.get_args(tp)):
            return value
        raise _fail(where, f"is not {_name(tp)}")
    if origin is list:
        if type(value) is not list:
            raise _fail(where, "is not a list")
        (item,) = typing.get_args(tp)
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if type(value) is not dict:
            raise _fail(where, "is not an object")
        _, item = typing.get_args(tp)
        return {k: _decode(item, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _decode_record(tp, value, where)
    if tp is float:
        ok = type(value) in (int, float)
    elif tp in (type(None), None):
        ok = value is None
    elif tp in (int, str, bool):
        ok = type(value) is tp
    else:  # Absent: never a JSON value
        ok = False
    if not ok:
        raise _fail(where, f"is not {_name(tp)}")
    return value


def _decode_record(cls: type, value: Any, where: str) -> Any:
    if type(value) is not dict:
        raise _fail(where, "is not an object")
    known: dict[str, Any] = {}
    flat: tuple[str, Any] | None = None
    for name, tp, optional, flatten in _fields(cls):
        if flatten:
            flat = (name, tp)
        elif name in value:
            known[name] = _decode(tp, value[name], f"{where}.{name}")
        elif not optional:
            raise _fail(where, f"has no {name!r}")
    rest = [k for k in value if k not in known]
    if flat is not None:
        known[flat[0]] = _decode(flat[1], {k: value[k] for k in rest}, where)
    elif rest:
        raise _fail(where, f"has an unknown key {rest[0][:80]!r}")
    return cls(**known)


def _name(tp: Any) -> str:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(v) for v in typing.get_args(tp))
    return "null" if tp in (type(None), None) else "absent" if tp is Absent else getattr(tp, "__name__", str(tp))
