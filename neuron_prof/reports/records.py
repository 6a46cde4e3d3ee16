"""DataFrames as JSON-ready rows: what the report's ``--json`` and every summary hand out."""
from __future__ import annotations

from typing import Any

import pandas as pd


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values (numpy scalars unwrapped, NaN and NA as None)."""
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in df.astype(object).where(df.notna(), None).to_dict("records")]
