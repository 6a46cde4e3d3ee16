"""Damage is named, first and as damage (issue 41, cases 4 and 7): a hostile run whose checksums
were recomputed after a flipped byte in an Arrow schema is the one-line error from every reader,
not a UnicodeDecodeError or a column silently read as zeros; run.json is checksummed; a closed run
whose manifest is lost opens its report with a "!!" finding naming the file, no section explains
the absence by a collector left off, and ``report --json`` carries the damage for a CI gate.

Each hostile run is built here as an attacker would: bytes changed, then every checksum the reader
checks made to match again (``_recommit``).
"""
from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import cli, one_line_error
from neuron_prof.store.writer import sign


@pytest.fixture
def run(demo_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy)
    return copy


def _recommit(rank_dir: Path, table: str) -> None:
    """The last commit made to match ``table``'s bytes as they are now, signed again."""
    manifest = rank_dir / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    line = json.loads(lines[-1])
    line["crc"][table] = zlib.crc32((rank_dir / f"{table}.arrows").read_bytes()[: line["sizes"][table]])
    manifest.write_text("\n".join(lines[:-1] + [json.dumps(sign(line))]) + "\n")


def _flip_column_name(path: Path, column: str, xor: int) -> int:
    """Flips the first byte of ``column``'s name in the stream's schema message; its offset."""
    data = bytearray(path.read_bytes())
    reader = pa.BufferReader(bytes(data))
    pa.ipc.MessageReader.open_stream(reader).read_next_message()  # the schema: the stream's first message
    at = data.index(column.encode(), 0, reader.tell())
    data[at] ^= xor
    path.write_bytes(bytes(data))
    return at


@pytest.mark.parametrize("xor, needle", [(0xCC, "column 0's name is not UTF-8"), (0x08, "an unknown column '|id'")])
def test_a_flipped_column_name_with_recomputed_checksums_is_one_line_from_every_reader(run, xor, needle):
    """Not UTF-8: a UnicodeDecodeError from report, export and load alike (reader._read_table).
    Still UTF-8 but no column's name: the column was read as zeros, silently."""
    import neuron_prof
    from neuron_prof.errors import NeuronProfError
    table = run / "rank-00000" / "threads.arrows"
    _flip_column_name(table, "tid", xor)
    _recommit(run / "rank-00000", "threads")
    for args in (("report", run), ("report", run, "--json"), ("export", run, "-o", run.parent / "t.perfetto-trace")):
        one_line_error(cli(*args, timeout=120), str(table), needle, "re-record")
    with pytest.raises(NeuronProfError) as err:
        neuron_prof.load(run)
    assert str(table) in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def _forge_strings(rank_dir: Path, edit) -> Path:
    """strings.arrows rewritten with ``edit(values)`` as its values, and committed."""
    path = rank_dir / "strings.arrows"
    manifest = rank_dir / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    line = json.loads(lines[-1])
    strings = pa.ipc.open_stream(path.read_bytes()[: line["sizes"]["strings"]]).read_all()
    values = pa.array(edit(strings.column("value").to_pylist()), pa.string())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, strings.schema) as writer:
        writer.write_table(pa.table([strings.column("id"), values], schema=strings.schema))
    path.write_bytes(sink.getvalue().to_pybytes())
    line["sizes"]["strings"] = path.stat().st_size
    manifest.write_text("\n".join(lines[:-1] + [json.dumps(line)]) + "\n")
    _recommit(rank_dir, "strings")
    return path


@pytest.mark.parametrize("edit, needle", [
    (lambda v: v[:1] + [v[2]] + v[2:], "holds a string twice"),   # was a traceback: categories must be unique
    (lambda v: v[:1] + [None] + v[2:], "nulls in column value"),  # a column neuron_prof writes no null in
])
def test_a_forged_strings_table_is_refused(run, edit, needle):
    path = _forge_strings(run / "rank-00000", edit)
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, run), str(path), needle)


@pytest.mark.parametrize("field, old, new", [("command", "python", "pythoN"), ("torch_version", ".", ",")])
def test_a_changed_byte_in_run_json_is_damage(run, field, old, new):
    path = run / "run.json"
    doc = json.loads(path.read_text())
    text = path.read_text()
    at = text.index(old, text.index(f'"{field}":') + len(field) + 3)  # in the field's value
    path.write_text(text[:at] + new + text[at + len(old):])  # the same JSON, one byte changed
    assert json.loads(path.read_text())[field] != doc[field]
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, run), str(path), "checksum does not match")


def test_a_run_json_written_before_it_was_signed_reads_as_it_is(run):
    path = run / "run.json"
    doc = json.loads(path.read_text())
    del doc["check"]
    path.write_text(json.dumps({**doc, "torch_version": "9.9.9"}))
    res = cli("report", run)
    assert res.returncode == 0, res.stderr
    assert "torch 9.9.9 on" in res.stdout


def _lose_manifest(run: Path, how: str) -> Path:
    manifest = run / "rank-00000" / "manifest.jsonl"
    if how == "deleted":
        manifest.unlink()
    else:
        manifest.write_bytes({"garbage": b"\x8f garbage, no line of it complete", "empty": b""}[how])
    return manifest


@pytest.mark.parametrize("how, what", [("garbage", "holds no complete commit"), ("empty", "is empty"),
                                       ("deleted", "is missing")])
def test_a_closed_run_with_its_manifest_lost_says_so_first(run, how, what):
    """It read as an empty run: "no op events captured", "Memory: not captured (the `memory`
    collector was off ...)", exit 0, the loss only deep in Capture health as ignored bytes."""
    _lose_manifest(run, how)
    res = cli("report", run)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    first = lines[lines.index("Findings") + 1]
    assert first.startswith(f"  !! rank-00000/manifest.jsonl {what}: rank 0's "), first
    assert "ops" in first and "memory_events" in first and "restore it" in first
    memory = lines[lines.index("Memory") + 1]
    assert "collector was off" not in res.stdout and memory == f"  lost to damage: rank-00000/manifest.jsonl {what} " \
                                                                "(see Capture health)"
    assert "no op events captured" not in res.stdout and "did NOT close" not in res.stdout
    doc = json.loads(cli("report", run, "--json").stdout)
    [damage] = doc["health"]["damage"]
    assert damage["rank"] == 0 and damage["file"] == "rank-00000/manifest.jsonl" and damage["what"] == what
    assert {"ops", "memory_events", "steps"} <= set(damage["tables"]) and damage["bytes"] > 0


def test_a_rank_killed_before_its_first_commit_is_not_called_damaged(run):
    """The same empty manifest with the tables still open (no end-of-stream marker: what a kill in
    step 0 leaves) is a kill, as before: no damage, no "!!"."""
    _lose_manifest(run, "empty")
    for table in (run / "rank-00000").glob("*.arrows"):
        data = table.read_bytes()
        assert data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
        table.write_bytes(data[:-8])
    res = cli("report", run)
    assert res.returncode == 0, res.stderr
    assert "!!" not in res.stdout and "did NOT close (killed or crashed)" in res.stdout
    assert json.loads(cli("report", run, "--json").stdout)["health"]["damage"] == []


def test_a_sound_run_reports_no_damage(demo_run):
    assert json.loads(cli("report", demo_run, "--json").stdout)["health"]["damage"] == []
