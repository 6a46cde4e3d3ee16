"""Progress of a long command (import, compare, export of a run with millions of events) on
stderr: the phase it is in and how many are done, drawn by tqdm only when stderr is a terminal
(tqdm turns itself off otherwise: a pipe, a CI log) and not under ``CI``."""
from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Sequence


class Phases:
    """``with Phases("compare", ["a: loading", ...]) as step: step("a: loading"); ...``;
    ``phases=None``: how many is not known beforehand (a run's ranks), only the count done shows."""

    def __init__(self, desc: str, phases: Sequence[str] | None = None) -> None:
        self.desc, self.phases = desc, None if phases is None else list(phases)
        self._bar: Any = None
        self._started = False

    def __enter__(self) -> "Phases":
        if not os.environ.get("CI"):
            from tqdm import tqdm
            # a terminal that reports no size (0 x 0) gets 100 x 24: tqdm would cut the bar to
            # nothing and hide it below the screen's last row
            size = shutil.get_terminal_size((100, 24))
            self._bar = tqdm(total=None if self.phases is None else len(self.phases), desc=self.desc, disable=None, leave=False, file=sys.stderr,
                             ncols=size.columns, nrows=size.lines, bar_format="{desc}: {n_fmt}" + ("" if self.phases is None else "/{total_fmt}")
                             + "{postfix} [{elapsed}]")
        return self

    def __call__(self, phase: str) -> None:
        """The next phase begins (the one before it is done)."""
        if self._bar is None:
            return
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(phase)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
