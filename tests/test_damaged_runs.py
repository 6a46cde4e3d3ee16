"""Damaged and hostile runs: each reader check of the run store, on a copy of a real run.

Each case here crashed, hung, read without bound or silently changed the report before the
validation layer (neuron_prof/store/reader.py with safefile.py and documents.py): a segfault on a flipped
byte of strings.arrows, a FIFO that blocked `report` forever, a link to /dev/zero read until memory
ran out, tracebacks on wrong JSON types. tests/test_fuzz_runs.py covers the same ground at random.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import cli, one_line_error, write_script
from neuron_prof.store.writer import sign


@pytest.fixture
def run(demo_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy)
    return copy


def _edit_json(path: Path, **fields) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def _last_commit(rank_dir: Path) -> dict:
    return json.loads((rank_dir / "manifest.jsonl").read_text().splitlines()[-1])


def _commit_again(rank_dir: Path, line: dict) -> None:
    """Append ``line`` as a new, correctly signed last commit (what a forger would have to do)."""
    with open(rank_dir / "manifest.jsonl", "a") as f:
        f.write(json.dumps(sign(line)) + "\n")


def test_flipped_byte_in_strings_is_damage_not_a_crash(run):
    """A string offset out of bounds used to crash report, export and load (exit 139)."""
    strings = run / "rank-00000" / "strings.arrows"
    data = bytearray(strings.read_bytes())
    data[len(data) // 2] ^= 0x5A
    strings.write_bytes(bytes(data))
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, run, timeout=120), str(strings), "checksum", "re-record")


def test_a_changed_number_in_the_manifest_is_damage(run):
    """A byte flip that keeps the JSON valid used to change the report's capture-health figures."""
    manifest = run / "rank-00000" / "manifest.jsonl"
    lines = manifest.read_text().splitlines(keepends=True)
    line = json.loads(lines[-1])
    line["written"] = {k: v + 1 for k, v in line["written"].items()}
    manifest.write_text("".join(lines[:-1]) + json.dumps(line) + "\n")
    one_line_error(cli("report", run), str(manifest), "checksum")


def test_every_commit_is_the_json_of_itself_signed(tmp_path):
    """The writer formats its commit lines by hand (store.RankWriter._write_manifest, at every
    step): each must be exactly ``json.dumps`` of the line it parses to, ``check`` last, with a
    budget cut (a nested map with a list) and dropped rows in the counters."""
    import torch

    import neuron_prof
    model, run_dir = torch.nn.Linear(8, 8), tmp_path / "run"
    with neuron_prof.profile(run_dir, max_bytes=30_000) as prof:
        for _ in range(20):
            model(torch.randn(4, 8)).sum().backward()
            prof.session.dropped("ops", 1)
            prof.step()
    lines = (run_dir / "rank-00000" / "manifest.jsonl").read_bytes().splitlines()
    parsed = [json.loads(raw) for raw in lines]
    assert any("detail_cut" in line for line in parsed) and parsed[-1]["dropped"] == {"ops": 20}
    for raw, line in zip(lines, parsed):
        assert json.dumps(line).encode() == raw and sign(dict(line))["check"] == line["check"]


def test_a_torn_last_line_is_a_kill_not_damage(run):
    """The writer killed mid-line: the commit before it is read (the crash-safety promise)."""
    manifest = run / "rank-00000" / "manifest.jsonl"
    with open(manifest, "a") as f:
        f.write('{"commit": 99, "sizes": {"ops": 1')
    assert cli("report", run).returncode == 0


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-urandom", "outside", "directory"])
def test_a_table_that_is_not_a_regular_file_is_refused(run, tmp_path, kind):
    """A FIFO hung `report` forever; links to /dev/zero or /dev/urandom read until memory ran out."""
    table = run / "rank-00000" / "ops.arrows"
    outside = tmp_path / "elsewhere.arrows"
    shutil.copy(table, outside)
    table.unlink()
    if kind == "fifo":
        os.mkfifo(table)
    elif kind == "directory":
        table.mkdir()
    else:
        table.symlink_to({"dev-zero": "/dev/zero", "dev-urandom": "/dev/urandom", "outside": outside}[kind])
    what = {"fifo": "FIFO", "directory": "directory"}.get(kind, "symbolic link")
    one_line_error(cli("report", run, timeout=60), str(table), what)


def test_a_symlinked_rank_folder_is_refused(run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (run / "rank-00000").rename(elsewhere)
    (run / "rank-00000").symlink_to(elsewhere)
    one_line_error(cli("report", run), "rank-00000", "symbolic link")


@pytest.mark.parametrize("file, fields, needle", [
    ("run.json", {"cwd": 1}, "'cwd'"),
    ("run.json", {"world_size": -1}, "'world_size'"),
    ("run.json", {"command": {"a": 1}}, "'command'"),
    ("run.json", {"start_time_ns": 1.5}, "'start_time_ns'"),
    ("rank-00000/rank.json", {"rank": "x"}, "'rank'"),
    ("rank-00000/rank.json", {"clock_offset_ns": None}, "'clock_offset_ns'"),
    ("rank-00000/rank.json", {"rank": 3}, "says rank 3"),
])
def test_wrong_json_types_name_the_field(run, file, fields, needle):
    _edit_json(run / file, **fields)
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, run), str(run / file), needle)


@pytest.mark.parametrize("text, needle", [
    ('{"schema_version": 2, "cwd": Infinity}', "not a number JSON allows"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"cwd": "\xff"}'.encode("latin-1"), "unreadable"),
])
def test_unparsable_json_is_one_line(run, text, needle):
    path = run / "run.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    one_line_error(cli("report", run), str(path), needle)


def test_a_null_size_in_a_signed_commit_is_refused(run):
    rank_dir = run / "rank-00000"
    line = _last_commit(rank_dir)
    line["sizes"]["ops"] = None
    _commit_again(rank_dir, line)
    one_line_error(cli("report", run), "manifest.jsonl", "'sizes'")


def test_an_interned_id_out_of_range_is_refused(run):
    """A table whose checksums are right (written by a forger, or a buggy writer) but whose ops name a
    string id past the strings table: it used to index past the lookup array."""
    rank_dir = run / "rank-00000"
    path = rank_dir / "strings.arrows"
    line = _last_commit(rank_dir)
    strings = pa.ipc.open_stream(path.read_bytes()[: line["sizes"]["strings"]]).read_all().slice(0, 3)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, strings.schema) as writer:
        writer.write_table(strings)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)
    line["sizes"]["strings"], line["crc"]["strings"] = len(data), zlib.crc32(data)
    _commit_again(rank_dir, line)
    one_line_error(cli("report", run), str(rank_dir), "holds id", "but strings has ids 0..2")


def test_two_folders_claiming_one_rank_are_refused(run):
    shutil.copytree(run / "rank-00000", run / "rank-0")
    one_line_error(cli("report", run), "claims rank 0", "rank-00000")


def test_runs_written_before_checksums_still_read(run):
    """Schema 1 runs (no checksums) read as they did: the same report."""
    before = cli("report", run)
    assert before.returncode == 0, before.stderr
    rank_dir = run / "rank-00000"
    _edit_json(rank_dir / "rank.json", schema_version=1)
    manifest = rank_dir / "manifest.jsonl"
    lines = [json.loads(x) for x in manifest.read_text().splitlines()]
    for line in lines:
        for key in ("crc", "journal_crc", "check"):
            line.pop(key)
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    after = cli("report", run)
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout


def test_capture_never_writes_through_a_link_in_the_run(tmp_path):
    """A run directory is shared ground: links planted in it (a rank folder, a table, run.json's temp
    file, the manifest) are replaced, never written through."""
    import neuron_prof
    from neuron_prof.examples.train_transformer import train
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    run.mkdir()
    (run / "rank-00000").symlink_to(outside)
    with neuron_prof.profile(run) as prof:
        train(2, prof)
    assert not (run / "rank-00000").is_symlink() and sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    rank_dir = run / "rank-00000"
    for name in ("ops.arrows", "manifest.jsonl", "rank.json", ".rank.json.%d.tmp" % os.getpid()):
        target = rank_dir / name
        target.unlink(missing_ok=True)
        target.symlink_to(victim)
    with neuron_prof.profile(run) as prof:
        train(2, prof)
    assert victim.read_text() == "keep me"
    assert cli("report", run).returncode == 0


@pytest.mark.parametrize("cut", [{"step": "x"}, [], {"step": 1, "ts": 0, "bytes": 1, "by": "max_bytes", "limit": 1,
                                                          "tables": "ops"}])
def test_a_malformed_detail_cut_is_refused(run, cut):
    """The report reads the budget's cut from the last commit (``detail_cut``); a signed line with the
    wrong types there is damage, not a traceback in the report."""
    rank_dir = run / "rank-00000"
    line = _last_commit(rank_dir)
    line["detail_cut"] = cut
    _commit_again(rank_dir, line)
    one_line_error(cli("report", run), "manifest.jsonl", "'detail_cut'")


def test_a_run_killed_before_its_first_captured_step_reports(tmp_path):
    """Killed (SIGKILL) once its first steps, all waited through by the schedule, are committed:
    process memory rows but no captured step. The report used to end in an IndexError
    (analysis.memory.process_growth)."""
    script = write_script(tmp_path / "train.py", """
        import os, signal
        import neuron_prof
        from neuron_prof.examples.train_transformer import train
        run = os.environ["RUN"]
        with neuron_prof.profile(run, schedule=neuron_prof.schedule(wait=10**6, active=1)) as prof:
            for _ in range(10_000):  # steps outside a window are committed about once a second
                train(1, prof)
                if os.path.exists(os.path.join(run, "rank-00000", "manifest.jsonl")):
                    break
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, "RUN": str(run)}, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    for args in (("report", run), ("report", run, "--json")):
        res = cli(*args)
        assert res.returncode == 0, res.stderr
    assert "did NOT close" in cli("report", run).stdout


KILLED_IN_A_COLLECTIVE_LOOP = """
import os, signal, sys
import torch
import torch.distributed as dist
import neuron_prof

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
with neuron_prof.profile(sys.argv[1]) as prof:
    t = torch.ones(256)
    dist.all_reduce(t)
    prof.step()
    dist.broadcast(t, 0)  # completed, but never flushed into the tables: only the ring has it
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> Path:
    """A rank killed (SIGKILL) right after a collective its tables never received."""
    from conftest import free_port
    tmp = tmp_path_factory.mktemp("killed_collective")
    script = write_script(tmp / "killed.py", KILLED_IN_A_COLLECTIVE_LOOP)
    res = subprocess.run([sys.executable, str(script), str(tmp / "run"), str(free_port())], cwd=tmp,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    return tmp / "run"


def test_a_killed_rank_keeps_its_last_collectives_from_the_in_flight_ring(killed_run):
    import neuron_prof
    coll = neuron_prof.load(killed_run).collectives
    assert list(coll["op"]) == ["all_reduce", "broadcast"] and list(coll["seq"]) == [1, 2]
    assert list(coll["status"]) == ["completed", "completed"]
    assert list(coll["bytes"]) == [1024, 1024]
    assert coll["source"].iloc[0].startswith("killed.py:") and coll["source"].iloc[1] == ""  # the ring has no stack


@pytest.mark.parametrize("damage", ["truncated", "wrong magic", "fifo"])
def test_a_damaged_in_flight_ring_is_one_line(killed_run, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(killed_run, run)
    ring = run / "rank-00000" / "collectives.inflight"
    data = ring.read_bytes()
    if damage == "truncated":
        ring.write_bytes(data[: len(data) // 2])
    elif damage == "wrong magic":
        ring.write_bytes(b"\0" * 8 + data[8:])
    else:
        ring.unlink()
        os.mkfifo(ring)
    for cmd in ("report", "export"):
        one_line_error(cli(cmd, run, timeout=120), str(ring))
