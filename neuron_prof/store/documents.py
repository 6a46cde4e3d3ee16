"""The run's JSON documents (``run.json``, ``rank.json``, manifest lines, conflict notes): what
each field may hold, checked once where the document is read.

Readers downstream use these fields as the types written here (``int(meta["clock_offset_ns"])``,
``" ".join(meta["command"])``, a world size as a range), so a document that parses but holds
``"cwd": 1`` or ``"world_size": -1`` must fail here, with its file and field named, rather than as
a traceback three modules later. Fields a newer neuron_prof adds are let through unchecked.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from neuron_prof.errors import NeuronProfError

Check = Callable[[Any], bool]

_I64 = 1 << 63
MAX_RANKS = 1 << 20


def _int(lo: int = -_I64, hi: int = _I64 - 1) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return type(v) is str


def _bool(v: Any) -> bool:
    return type(v) is bool


def _str_list(v: Any) -> bool:
    return type(v) is list and all(type(s) is str for s in v)


def _counts(v: Any) -> bool:
    """table name -> a byte or event count"""
    return type(v) is dict and all(type(n) is int and 0 <= n < _I64 for n in v.values())


def _crcs(v: Any) -> bool:
    return type(v) is dict and all(type(n) is int and 0 <= n < 1 << 32 for n in v.values())


def _detail_cut(v: Any) -> bool:
    """where a budget ended detail capture (``session``): every field the report reads"""
    return (type(v) is dict and _int(-1)(v.get("step")) and _int()(v.get("ts")) and _int(0)(v.get("bytes"))
            and v.get("by") in ("max_bytes", "max_events") and _int(0)(v.get("limit")) and _str_list(v.get("tables")))


def _exit(v: Any) -> bool:
    return type(v) is dict and (_int()(v.get("code")) or _int(1, 255)(v.get("signal")))


_COMMON = {"schema_version": _int(1), "run_id": _str, "hostname": _str, "device": _str, "torch_version": _str,
           "world_size": _int(1, MAX_RANKS)}

RUN_META: dict[str, Check] = {
    **_COMMON, "run_id_scope": _str, "neuron_prof_version": _str, "command": lambda v: _str(v) or _str_list(v),
    "cwd": _str, "start_time_ns": _int(0), "end_time_ns": _int(0), "exit": _exit, "check": _int(0, (1 << 32) - 1),
}
RANK_META: dict[str, Check] = {
    **_COMMON, "rank": _int(0, MAX_RANKS - 1), "pid": _int(0), "python": _str, "clock_offset_ns": _int(),
    "start_ns": _int(0), "collectors": _str_list, "schedule": _optional(lambda v: type(v) is dict),
    "max_buffered_events": _int(0), "max_events": _int(0), "max_bytes": _optional(_int(0)), "stepless": _bool,
}
COMMIT: dict[str, Check] = {
    "commit": _int(0), "t": _int(), "step": _int(-1, (1 << 31) - 1), "sizes": _counts, "journal": _counts,
    "dropped": _counts, "written": _counts, "cap_reached_at_step": _optional(_int(0)), "closed": _bool,
    "detail_cut": _detail_cut, "crc": _crcs, "journal_crc": _crcs, "check": _int(0, (1 << 32) - 1),
}
CONFLICT: dict[str, Check] = {
    "run_id": _str, "rank": _int(0, MAX_RANKS - 1), "pid": _int(0), "hostname": _str, "argv": _str_list,
    "time_ns": _int(0), "holder_pid": _optional(_int(0)), "holder_hostname": _optional(_str), "live": _bool,
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse(data: bytes, path: Path, what: str, fix: str) -> dict[str, Any]:
    """``data`` as a JSON object. Rejects what ``json`` would otherwise accept and hand on:
    ``NaN``/``Infinity``, nesting deep enough to exhaust the interpreter's stack."""
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:120]
        raise NeuronProfError(f"{path}: unreadable {what} ({reason}); {fix}") from None
    if type(doc) is not dict:
        raise NeuronProfError(f"{path}: {what} is not a JSON object; {fix}")
    return doc


def check(doc: Mapping[str, Any], spec: Mapping[str, Check], path: Path, what: str, fix: str,
          required: tuple[str, ...] = ()) -> None:
    """Every field of ``spec`` present in ``doc`` holds what it may; ``required`` ones are there."""
    for name in required:
        if name not in doc:
            raise NeuronProfError(f"{path}: {what} has no {name!r}; {fix}")
    for name, ok in spec.items():
        if name in doc and not ok(doc[name]):
            shown = json.dumps(doc[name])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise NeuronProfError(f"{path}: {what} has an invalid {name!r} ({shown}); {fix}")
