"""Which steps a capture records in detail: the schedule's windows, or (always-on) the sampled
steps and those asked for on demand (``capture_next``, ``neuron-prof trigger``), none once the
rank's disk budget is used up. The session asks at each step boundary; turning the collectors'
window on and off is the session's.
"""
from __future__ import annotations

from neuron_prof.capture.always_on import AlwaysOn
from neuron_prof.capture.buffer import CaptureBuffer
from neuron_prof.capture.schedule import Action, Schedule


class Windows:
    """A capture's detail windows; ``on``: the collectors' window is on now (the session's to set)."""

    def __init__(self, schedule: Schedule | None, always_on: AlwaysOn | None, buffer: CaptureBuffer) -> None:
        self.schedule = schedule
        self.always_on = always_on
        self._buffer = buffer  # its budget cut ends every window
        self.on = False
        self.on_demand = (0, 0)  # [first, end) steps captured on demand, straight to disk
        self.requested = 0  # steps asked for by capture_next, from the next boundary on

    def action(self, step: int) -> Action:
        if self._buffer.cut is not None:
            return Action.NONE
        if self.always_on is not None:
            return Action.RECORD if self.is_on_demand(step) or self.always_on.sampled(step) else Action.NONE
        return Action.RECORD if self.schedule is None else self.schedule.action(step)

    def is_on_demand(self, step: int) -> bool:
        return self.on_demand[0] <= step < self.on_demand[1]

    def ends_after(self, step: int) -> bool:
        """At ``step``'s end the window closes if the next step records nothing, or (always-on)
        if its detail goes elsewhere: a sampled step's to the ring, an on-demand step's to disk.
        Either way the ops still open belong to this step, on its side."""
        if self.action(step + 1) is Action.NONE:
            return True
        return self.always_on is not None and self.is_on_demand(step) != self.is_on_demand(step + 1)

    def request(self, steps: int) -> None:
        """Capture the next ``steps`` steps on demand, from the next step boundary on."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, not {steps}")
        self.requested = max(self.requested, int(steps))

    def begin_on_demand(self, step: int) -> range:
        """The requested steps begin after ``step`` (a window already open on demand grows);
        returns the steps now captured on demand."""
        first = self.on_demand[0] if self.is_on_demand(step + 1) else step + 1
        self.on_demand = (first, max(self.on_demand[1], step + 1 + self.requested))
        self.requested = 0
        return range(*self.on_demand)
