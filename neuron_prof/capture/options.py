"""What a capture is told, written once: ``profile()``'s keyword arguments, ``neuron-prof record``'s
flags and the hand-over from ``record`` to its bootstrap in every process of the command.

``CaptureOptions`` checks the settings where it is made, so ``profile()`` and the bootstrap see the
same errors; a field with a :class:`Flag` in its metadata is one of ``record``'s flags (its name,
help and parser live beside the field, so the flag and the argument cannot drift apart), and
:meth:`CaptureOptions.to_json` / :meth:`CaptureOptions.from_json` carry the options through the
environment (``RECORD_ENV``) to ``capture/bootstrap/sitecustomize.py``, which reads them only once
torch is imported.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from neuron_prof.capture.always_on import DEFAULT_DETAIL_EVERY, DEFAULT_HANG_TIMEOUT_S, DEFAULT_RING_STEPS, AlwaysOn
from neuron_prof.capture.buffer import DEFAULT_MAX_BUFFERED_EVENTS, DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from neuron_prof.capture.scalars import per_step
from neuron_prof.capture.schedule import Schedule
from neuron_prof.units import parse_bytes

DEFAULT_COLLECTORS = ("eager", "compiler", "memory", "collectives", "device", "loss")
MODES = ("detail", "always-on")
RECORD_ENV = "NEURON_PROF_RECORD"  # sitecustomize.py's, which imports nothing of neuron_prof to say it once


def parse_schedule(text: str) -> Schedule:
    """``WAIT,WARMUP,ACTIVE[,REPEAT]`` as torch.profiler.schedule takes them."""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
        raise argparse.ArgumentTypeError(f"invalid schedule {text!r}: expected WAIT,WARMUP,ACTIVE[,REPEAT], "
                                         "e.g. 1,1,3,1")
    return Schedule(*parts)


def parse_size(text: str) -> int:
    """A positive byte count, as ``units.parse_bytes`` reads one: ``300000``, ``512M``, ``1.5G``,
    ``2GiB`` (powers of 1024), ``500MB`` (powers of 1000)."""
    try:
        size = parse_bytes(text)
    except ValueError:
        size = 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected a positive byte count such as 512M or 2G")
    return size


def _at_least(convert: Callable[[str], float], low: float, what: str, expected: str) -> Callable[[str], float]:
    """An argparse type: ``convert(text)``, at least ``low``."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not value >= low:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {expected}")
        return value
    return parse


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def _same(value: Any) -> Any:
    return value


_positive_int = _at_least(int, 1, "count", "a whole number >= 1")
_seconds = _at_least(float, 0, "time", "seconds >= 0 (0: no watchdog)")
_positive_number = _at_least(float, 0, "count", "a number >= 0")


@dataclass(frozen=True)
class Flag:
    """A field as one of ``record``'s flags: what argparse is given, and how the parsed value
    becomes the field's (``--always-on`` is ``mode``, ``--hang-timeout 0`` is no watchdog)."""

    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    switch: bool = False  # a flag without a value (store_true)
    default: Any = None  # what argparse holds when the flag is absent (parsed too, if a string)
    to_option: Callable[[Any], Any] = _same

    @property
    def dest(self) -> str:
        """argparse's attribute: the long name's, as argparse derives it."""
        return self.names[-1].lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.switch:
            parser.add_argument(*self.names, action="store_true", help=self.help)
            return
        parser.add_argument(*self.names, type=self.parse, default=self.default, metavar=self.metavar,
                            help=self.help)


def _flag(default: Any, flag: Flag) -> Any:
    return field(default=default, metadata={"flag": flag})


@dataclass(frozen=True)
class CaptureOptions:
    """A capture's settings (``neuron_prof.profile`` says what each does). The fields with a flag
    come first, in the order ``record --help`` lists them; the others are ``profile()``'s alone,
    or how ``record`` ties the processes of one command into one run (``command``, ``run_id``,
    ``origin_ns``, ``yield_if_stepless``: set by record and its bootstrap)."""

    run_dir: str | os.PathLike | None = _flag(None, Flag(
        ("-o", "--output"), "run directory (default: runs/run-YYYYmmdd-HHMMSS)", parse=Path))
    schedule: Schedule | None = _flag(None, Flag(
        ("--schedule",), "capture only these steps in detail (default: every step, up to --max-bytes)",
        metavar="WAIT,WARMUP,ACTIVE[,REPEAT]", parse=parse_schedule))
    collectors: Sequence[str] = _flag(DEFAULT_COLLECTORS, Flag(
        ("--collectors",), f"comma-separated event sources (default: {','.join(DEFAULT_COLLECTORS)}; collectives "
                           "records only where torch.distributed runs)",
        parse=_names, default=",".join(DEFAULT_COLLECTORS)))
    max_bytes: int | None = _flag(DEFAULT_MAX_BYTES, Flag(
        ("--max-bytes",), f"disk budget per rank, every table counted: detail capture stops when a rank's folder "
                          f"holds this much, step times and per-step memory go on (default {DEFAULT_MAX_BYTES >> 20}M)",
        metavar="SIZE", parse=parse_size, default=DEFAULT_MAX_BYTES))
    max_events: int = _flag(DEFAULT_MAX_EVENTS, Flag(
        ("--max-events",), f"op and mark rows per rank after which detail capture stops (default {DEFAULT_MAX_EVENTS:,})",
        parse=int, default=DEFAULT_MAX_EVENTS,
        to_option=lambda n: n or DEFAULT_MAX_EVENTS))  # 0: the default, as record has always read it
    mode: str = _flag("detail", Flag(
        ("--always-on",), "for whole jobs: step times, compiles, per-step memory, losses and collectives to disk; "
                          "op and allocation detail one step in --detail-every, that of the last --ring-steps such "
                          "steps kept in memory and written on an exception, SIGUSR1, SIGTERM or a hang (no step for "
                          "--hang-timeout seconds); `neuron-prof trigger PID` captures the next steps in detail",
        switch=True, to_option=lambda on: "always-on" if on else "detail"))
    ring_steps: int = _flag(DEFAULT_RING_STEPS, Flag(
        ("--ring-steps",), f"--always-on: sampled steps whose detail is kept in memory (default {DEFAULT_RING_STEPS})",
        metavar="N", parse=_positive_int, default=DEFAULT_RING_STEPS))
    detail_every: int = _flag(DEFAULT_DETAIL_EVERY, Flag(
        ("--detail-every",), f"--always-on: full detail one step in N (default {DEFAULT_DETAIL_EVERY}; 1: every step)",
        metavar="N", parse=_positive_int, default=DEFAULT_DETAIL_EVERY))
    hang_timeout_s: float | None = _flag(DEFAULT_HANG_TIMEOUT_S, Flag(
        ("--hang-timeout",), f"--always-on: no step for this long is a hang, dumped (default "
                             f"{DEFAULT_HANG_TIMEOUT_S:.0f}; 0: no watchdog)",
        metavar="SECONDS", parse=_seconds, default=DEFAULT_HANG_TIMEOUT_S, to_option=lambda s: s or None))
    follow_cpu_memory: bool = _flag(False, Flag(
        ("--follow-cpu-memory",), "--always-on: follow CPU allocations between sampled steps too (the CPU's tensor "
                                  "memory at every step and its live set at an out-of-memory error; about 1.1x on a "
                                  "launch-bound CPU step); without it the CPU's per-step memory is the process's "
                                  "resident memory",
        switch=True))
    tokens_per_step: float | None = _flag(None, Flag(
        ("--tokens-per-step",), "tokens each step trains on (throughput and cost per token in `neuron-prof compare`)",
        metavar="N", parse=_positive_number))
    samples_per_step: float | None = _flag(None, Flag(
        ("--samples-per-step",), "samples each step trains on", metavar="N", parse=_positive_number))
    auto_step: bool = False
    max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS
    command: Sequence[str] | None = None
    origin_ns: int | None = None
    run_id: str | None = None
    yield_if_stepless: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {self.mode!r}")
        if self.follow_cpu_memory and self.mode != "always-on":
            raise ValueError("follow_cpu_memory is for mode=\"always-on\" (detail capture follows CPU memory at "
                             "every step already); drop it or pass mode=\"always-on\"")
        always_on = self.always_on()  # AlwaysOn checks its own settings
        self.step_scalars()
        if always_on is not None and self.schedule is not None:
            raise ValueError("always-on capture samples its own detail steps and takes no schedule")

    def always_on(self) -> AlwaysOn | None:
        """The always-on settings (checked by ``AlwaysOn``), None for a detail capture."""
        if self.mode != "always-on":
            return None
        return AlwaysOn(ring_steps=self.ring_steps, detail_every=self.detail_every,
                        hang_timeout_s=self.hang_timeout_s, follow_cpu_memory=self.follow_cpu_memory)

    def step_scalars(self) -> dict[str, float]:
        """The scalars every step has (``tokens_per_step``, ``samples_per_step``), checked."""
        return per_step(self.tokens_per_step, self.samples_per_step)

    def keywords(self) -> dict[str, Any]:
        """The options as ``profile()``'s arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # ---- record's flags
    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        """``record``'s flags for the fields that have one, in field order."""
        for f in dataclasses.fields(CaptureOptions):
            if "flag" in f.metadata:
                f.metadata["flag"].add_to(parser)

    @classmethod
    def from_flags(cls, args: argparse.Namespace, **given: Any) -> "CaptureOptions":
        """The options ``record``'s parsed flags say, with ``given`` (what record works out itself:
        the run folder, the command, the run id) over them."""
        flagged = {f.name: f.metadata["flag"].to_option(getattr(args, f.metadata["flag"].dest))
                   for f in dataclasses.fields(cls) if "flag" in f.metadata}
        return cls(**{**flagged, **given})

    # ---- the hand-over to the bootstrap
    def to_json(self) -> str:
        """The options as ``record`` hands them to each process of its command (``RECORD_ENV``)."""
        values = self.keywords()
        values["run_dir"] = None if self.run_dir is None else os.fspath(self.run_dir)
        values["schedule"] = None if self.schedule is None else dataclasses.asdict(self.schedule)
        return json.dumps(values)

    @classmethod
    def from_json(cls, text: str, **given: Any) -> "CaptureOptions":
        """What :meth:`to_json` wrote, with ``given`` (the process's own: its origin, whether it
        yields its rank) over it."""
        values: Mapping[str, Any] = json.loads(text)
        schedule = values["schedule"]
        return cls(**{**values, "schedule": None if schedule is None else Schedule(**schedule), **given})
