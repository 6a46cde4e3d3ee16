"""The run store's writer (neuron_prof.store): journaled rows read the same before and after they
move into the Arrow streams, however many batches the move takes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from neuron_prof import store
from neuron_prof.reader import read_rank
from neuron_prof.schema import TABLES, row_dtype


def _steps(first: int, n: int) -> np.ndarray:
    rows = np.zeros(n, row_dtype(TABLES["steps"]))
    rows["step"] = np.arange(first, first + n)
    rows["ts"] = rows["step"] * 1000
    rows["dur"] = 7
    rows["complete"] = True
    return rows


def test_journals_read_the_same_before_and_after_a_move_in_several_batches(tmp_path, monkeypatch):
    # a batch of 10 rows: the move at close takes several (it takes 16 MB ones in a capture)
    monkeypatch.setattr(store, "COMPACT_BATCH_BYTES", 10 * row_dtype(TABLES["steps"]).itemsize)
    rank_dir = tmp_path / "rank-00000"
    writer = store.RankWriter(rank_dir, {"run_id": "r", "rank": 0, "schema_version": 2})
    for step in range(25):  # one write and one commit a step, as a capture's boundary does
        writer.append("steps", _steps(step, 1))
        writer.commit(step, {"dropped": {}, "written": {}, "cap_reached_at_step": None})
    journaled = read_rank(rank_dir)
    assert not journaled.closed and journaled.last_commit["journal"] == {"steps": 25 * _steps(0, 1).nbytes}

    writer.close(25, {"dropped": {}, "written": {}, "cap_reached_at_step": None})
    moved = read_rank(rank_dir)
    assert moved.closed and moved.last_commit["journal"] == {"steps": 0}
    assert (rank_dir / "steps.journal").stat().st_size == 0
    assert moved.tables["steps"].to_pandas().equals(journaled.tables["steps"].to_pandas())
    assert moved.tables["steps"].column("step").to_pylist() == list(range(25))
    with pa.ipc.open_stream(pa.py_buffer((rank_dir / "steps.arrows").read_bytes())) as stream:
        assert [len(batch) for batch in stream] == [10, 10, 5]
