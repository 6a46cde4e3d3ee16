"""Interned strings for the trace writers: each distinct name or string argument is stored once and
rows refer to it by id (Perfetto's interned data; the Chrome writer's per-string JSON fragments)."""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["StringTable"]


class StringTable:
    """Append-only string -> dense id table."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.strings: list[str] = []

    def __len__(self):
        return len(self.strings)

    def id(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
        return i

    def encode(self, x, n: int, omit_empty: bool) -> np.ndarray:
        """Column -> int32 ids (length n). Missing values (None/NaN, and "" if omit_empty) -> -1,
        or the id of "" when not omit_empty. Categorical uses its codes (one lookup per category)."""
        if isinstance(x, str):
            return np.full(n, -1 if (omit_empty and x == "") else self.id(x), np.int32)
        if isinstance(x, pd.Series):
            x = x.array if isinstance(x.dtype, pd.CategoricalDtype) else x.to_numpy()
        if isinstance(x, pd.Categorical):
            cats, codes = x.categories, np.asarray(x.codes)
        else:
            codes, cats = pd.factorize(x if isinstance(x, np.ndarray) else np.asarray(x, dtype=object),
                                       use_na_sentinel=True)
        if len(codes) != n:
            raise ValueError(f"column has {len(codes)} rows, expected {n}")
        lut = np.empty(len(cats) + 1, np.int32)
        for j, c in enumerate(cats):
            s = c if isinstance(c, str) else ("" if c is None else str(c))
            lut[j] = -1 if (omit_empty and s == "") else self.id(s)
        lut[-1] = -1  # code -1 (NaN/None) picks the last entry
        if not omit_empty and (codes < 0).any():
            lut[-1] = self.id("")
        return lut[codes]
