"""Strings, frames and stacks to the small ids of a rank's ``strings``, ``frames`` and ``stacks``
tables: the session interns what its collectors record, the trace importers (``kineto``,
``torch_trace``) what they read, each writing only the ids it has not written yet."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from neuron_prof.store.schema import Frame


class Interner:
    """Strings, frames and stacks to small ints, remembering which ids are not yet written."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {"": 0}
        self.frames: dict[tuple[int, int, int], int] = {}
        self.stacks: dict[tuple[int, ...], int] = {(): 0}
        self._new_strings: list[str] = [""]
        self._new_frames: list[tuple[int, int, int]] = []
        self._new_stacks: list[tuple[int, ...]] = []
        self._files: set[int] = set()  # string ids a frame names as its file
        self._new_files: list[tuple[int, str]] = []

    def string(self, s: str) -> int:
        sid = self.strings.get(s)
        if sid is None:
            sid = self.strings[s] = len(self.strings)
            self._new_strings.append(s)
        return sid

    def stack(self, frames: Sequence[Frame]) -> int:
        fids = []
        for file, func, line in frames:
            key = (self.string(file), self.string(func), int(line))
            fid = self.frames.get(key)
            if fid is None:
                fid = self.frames[key] = len(self.frames) + 1
                self._new_frames.append(key)
                if key[0] not in self._files:
                    self._files.add(key[0])
                    self._new_files.append((key[0], file))
            fids.append(fid)
        key = tuple(fids)
        sid = self.stacks.get(key)
        if sid is None:
            sid = self.stacks[key] = len(self.stacks)
            self._new_stacks.append(key)
        return sid

    def take_new(self) -> dict[str, dict[str, Any]]:
        """Rows for the strings/frames/stacks tables created since the last call."""
        out: dict[str, dict[str, Any]] = {}
        if self._new_frames:
            first = len(self.frames) - len(self._new_frames) + 1
            f = np.array(self._new_frames, dtype=np.int32).reshape(-1, 3)
            out["frames"] = {"id": np.arange(first, first + len(f), dtype=np.int32),
                             "file": f[:, 0], "func": f[:, 1], "line": f[:, 2]}
        if self._new_stacks:
            first = len(self.stacks) - len(self._new_stacks)
            out["stacks"] = {"id": np.arange(first, first + len(self._new_stacks), dtype=np.int32),
                             "frames": [list(s) for s in self._new_stacks]}
        if self._new_strings:  # after stacks: interning frames adds strings
            first = len(self.strings) - len(self._new_strings)
            out["strings"] = {"id": np.arange(first, len(self.strings), dtype=np.int32),
                              "value": self._new_strings}
        self._new_strings, self._new_frames, self._new_stacks = [], [], []
        return out

    def take_new_files(self) -> list[tuple[int, str]]:
        """(string id, name) of the files frames named for the first time since the last call: a
        capture hashes each once (``neuron_prof.store.source_files``); importers, whose files ran
        elsewhere, never ask."""
        new, self._new_files = self._new_files, []
        return new
