"""What the mapping layer (``neuron_prof.export.layout*``) shares to turn run tables into the columns a
trace writer takes: lanes for intervals that may overlap (slices on one track must nest), and string
argument columns built from categoricals without a string per row."""
from __future__ import annotations

import heapq

import numpy as np
import pandas as pd

__all__ = ["lanes", "string_args"]


def lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy interval partitioning: in start order each interval takes the lowest lane free by its
    start, so intervals on one lane never overlap (slices on one track must nest) and there are
    only as many lanes as intervals alive at once. O(n log n)."""
    lane = np.empty(len(start), np.int64)
    busy: list[tuple[int, int]] = []   # (end, lane)
    free: list[int] = []
    opened = 0
    for i in np.argsort(start, kind="stable").tolist():
        while busy and busy[0][0] <= start[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane[i] = heapq.heappop(free)
        else:
            lane[i] = opened
            opened += 1
        heapq.heappush(busy, (int(end[i]), int(lane[i])))
    return lane


def string_args(col: pd.Series) -> np.ndarray:
    """A (categorical) column as the object array of strings the writer takes for string args
    (missing values stay NaN, which the writer omits). A categorical of strings maps its
    categories once: ``astype(str)`` would build a string per row, through Arrow."""
    if isinstance(col.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(col.cat.categories):
        return np.array([*col.cat.categories, np.nan], dtype=object)[col.cat.codes.to_numpy()]
    return col.astype(str).to_numpy(dtype=object)
