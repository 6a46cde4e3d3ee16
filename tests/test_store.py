"""The run store's writer (neuron_prof.store.writer): journaled rows read the same before and after they
move into the Arrow streams, however many batches the move takes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from neuron_prof.store import writer as store
from neuron_prof.store.reader import read_rank
from neuron_prof.store.schema import TABLES, row_dtype


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


def test_a_schema_3_runs_ops_journal_reads_with_recompute_false(tmp_path):
    """``ops.recompute`` came with schema 4: a run written before it journaled 67-byte op rows,
    which read as they were, recompute False (schema.ADDED_COLUMNS, schema.schema_of)."""
    import json
    import zlib

    from neuron_prof.store.schema import schema_of

    old = row_dtype(schema_of("ops", 3))
    assert old.itemsize == row_dtype(TABLES["ops"]).itemsize - 1 and "recompute" not in old.names
    rows = np.zeros(5, old)
    rows["ts"], rows["dur"], rows["bwd"], rows["depth"] = np.arange(5) * 100, 7, [0, 1, 0, 1, 1], 1
    rank_dir = tmp_path / "rank-00000"
    writer = store.RankWriter(rank_dir, {"run_id": "r", "rank": 0, "schema_version": 3})
    writer.append("steps", _steps(0, 1))
    writer.commit(0, {"dropped": {}, "written": {}, "cap_reached_at_step": None})
    # the rows of a schema-3 writer, committed as it committed them (size and CRC of the journal)
    (rank_dir / "ops.journal").write_bytes(rows.tobytes())
    manifest = rank_dir / "manifest.jsonl"
    line = json.loads(manifest.read_text().splitlines()[-1])
    line["journal"]["ops"] = rows.nbytes
    line["journal_crc"]["ops"] = zlib.crc32(rows.tobytes())
    manifest.write_text(json.dumps(store.sign(line)) + "\n")

    ops = read_rank(rank_dir).table("ops").to_pandas()
    assert list(ops.columns) == TABLES["ops"].names
    assert ops["ts"].tolist() == [0, 100, 200, 300, 400] and ops["bwd"].tolist() == [False, True, False, True, True]
    assert ops["depth"].tolist() == [1] * 5 and ops["recompute"].tolist() == [False] * 5
