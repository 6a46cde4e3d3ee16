"""Which steps are captured in detail: torch.profiler's wait/warmup/active/repeat cycle."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    NONE = "none"        # step time only
    WARMUP = "warmup"    # hooks on, data discarded (first-call costs stay out of the window)
    RECORD = "record"    # hooks on, data kept


@dataclass(frozen=True)
class Schedule:
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0      # 0: cycle until the run ends
    skip_first: int = 0

    def __post_init__(self) -> None:
        if min(self.wait, self.warmup, self.repeat, self.skip_first) < 0 or self.active < 1:
            raise ValueError(f"invalid schedule {self}: counts must be >= 0 and active >= 1")

    def action(self, step: int) -> Action:
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step // cycle >= self.repeat:
            return Action.NONE
        pos = step % cycle
        if pos < self.wait:
            return Action.NONE
        return Action.WARMUP if pos < self.wait + self.warmup else Action.RECORD


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0,
             skip_first: int = 0) -> Schedule:
    """Capture ``active`` steps after ``wait`` idle and ``warmup`` discarded steps, ``repeat`` times."""
    return Schedule(wait, warmup, active, repeat, skip_first)

