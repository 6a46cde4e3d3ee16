"""The summary stored in the run (neuron_prof/reports/stored.py): read back while fresh, as
``summarize`` computes it; computed again when missing, stale (the run changed), of other code,
damaged or hostile, without a word; a run that cannot be written reads as before.

Real runs captured by ``neuron_prof.profile`` (the shared demo run, copied), real files, the
real CLI. Whether a stored summary was read is told by ``stored.counts`` (what
``run_summary`` did), never by timing.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_prof
from conftest import capture_graph_breaks, cli, gloo_run, shown, viewer_page
from neuron_prof.cli import main
from neuron_prof.reports.findings import findings
from neuron_prof.reports.summary.build import summarize
from neuron_prof.reports.summary.sections import Summary
from neuron_prof.reports.summary.text import render_text
from neuron_prof.reports.stored import (MAX_BYTES, SUMMARY_FILE, counts, load_summary, run_summary, store_summary,
                                       summary_key)


def _copy(src: Path, dst: Path) -> Path:
    """A run of the test's own, without the summary another test's reader may have stored."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(SUMMARY_FILE))
    return dst


@pytest.fixture
def run(demo_run, tmp_path) -> Path:
    return _copy(demo_run, tmp_path / "run")


def _uses(fn, *args):
    """``fn(*args)`` and how many summaries it read back and computed (``counts``)."""
    before = dict(counts)
    out = fn(*args)
    return out, counts["stored"] - before["stored"], counts["computed"] - before["computed"]


def _report(capsys, *args: str) -> str:
    """``neuron-prof report ARGS`` through the CLI's own entry point, in this process (so its
    ``counts`` can be read)."""
    assert main(["report", *map(str, args)]) == 0
    return capsys.readouterr().out


def test_a_stored_summary_is_read_back_as_summarize_computes_it(run):
    assert store_summary(run) and (run / SUMMARY_FILE).is_file()
    got, stored, computed = _uses(run_summary, neuron_prof.load(run))
    assert (stored, computed) == (1, 0)
    assert got == summarize(neuron_prof.load(run))
    written = (run / SUMMARY_FILE).stat()
    assert store_summary(run)  # already fresh: kept as it is, not computed and written again
    again = (run / SUMMARY_FILE).stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)


@pytest.mark.parametrize("kind", ["memory", "device", "graph-breaks"])
def test_summaries_of_every_kind_of_run_are_stored_and_read_back(kind, request, tmp_path):
    """Each section's types (Summary.from_json) accept what summarize makes of a real run: memory
    leaks and peaks, a device's verdicts, stalls and fallbacks, graph breaks, recompiles and
    compile phases named by the run."""
    if kind == "graph-breaks":
        run_dir = capture_graph_breaks(tmp_path / "run", "eager")
    elif kind == "memory":
        run_dir = _copy(request.getfixturevalue("memory_runs")("leak"), tmp_path / "run")
    else:
        run_dir = _copy(request.getfixturevalue("device_run"), tmp_path / "run")
    expected = summarize(neuron_prof.load(run_dir))
    assert Summary.from_json(json.loads(json.dumps(expected.to_json()))) == expected
    assert store_summary(run_dir)
    got, stored, computed = _uses(run_summary, neuron_prof.load(run_dir))
    assert (stored, computed) == (1, 0) and got == expected


def test_the_last_rank_to_close_finds_the_run_complete(tmp_path):
    """Two gloo ranks: once both closed, the run's summary (collectives included) is stored and
    read back whole."""
    run_dir = gloo_run(tmp_path, 3)
    assert store_summary(run_dir)
    got, stored, _ = _uses(run_summary, neuron_prof.load(run_dir))
    assert stored == 1 and got == summarize(neuron_prof.load(run_dir))
    assert got.collectives.captured and got.run.ranks == [0, 1]


def test_report_is_the_same_with_and_without_the_stored_summary(run, tmp_path, capsys, monkeypatch):
    computed_json = cli("report", run, "--json").stdout  # computes it, and stores it for the next reader
    assert (run / SUMMARY_FILE).is_file()
    (out, stored, computed) = _uses(_report, capsys, run, "--json")
    assert (stored, computed) == (1, 0)
    assert out == computed_json and json.loads(out)["ops"]["events"] > 0
    text, stored, _ = _uses(_report, capsys, run)
    assert stored == 1
    (run / SUMMARY_FILE).unlink()
    assert text == cli("report", run).stdout == render_text(summarize(neuron_prof.load(run)))
    # the run as this reader names it, wherever the writer was
    assert store_summary(run)
    run.rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    out, stored, _ = _uses(_report, capsys, "moved", "--json")
    assert stored == 1 and json.loads(out)["run"]["path"] == "moved"
    assert out == json.dumps(summarize(neuron_prof.load("moved")).to_json(), indent=2) + "\n"


def test_a_summary_of_a_run_still_being_written_is_stale_once_it_grows(tmp_path):
    from neuron_prof.examples.train_transformer import train
    run_dir = tmp_path / "run"
    with neuron_prof.profile(run_dir) as prof:
        train(2, prof)
        assert not store_summary(run_dir)  # a rank still writing: the capture side stores nothing yet
        live, _, computed = _uses(run_summary, neuron_prof.load(run_dir))
        assert computed == 1 and (run_dir / SUMMARY_FILE).is_file()  # the reader stored what it read
        assert load_summary(neuron_prof.load(run_dir)) is not None
        train(2, prof)
    grown = neuron_prof.load(run_dir)
    assert load_summary(grown) is None
    after, stored, computed = _uses(run_summary, grown)
    assert (stored, computed) == (0, 1)
    assert after.steps[0].steps > live.steps[0].steps and after.health.ranks[0].closed
    assert store_summary(run_dir) and load_summary(neuron_prof.load(run_dir)) == after


def test_a_summary_of_other_options_or_another_copy_of_the_data_is_not_used(run):
    assert store_summary(run)
    assert load_summary(neuron_prof.load(run), top=3) is None  # stored for the report's default top
    rank_json = run / "rank-00000" / "rank.json"
    meta = json.loads(rank_json.read_text())
    rank_json.write_text(json.dumps({**meta, "hostname": "elsewhere"}))
    assert load_summary(neuron_prof.load(run)) is None


def test_how_a_recorded_command_ended_keeps_the_summary_fresh(run):
    """`record` adds the command's exit to run.json after every rank closed (and stored the
    summary): the summary stays fresh, and says how the command ended."""
    from neuron_prof.store.writer import update_run_meta
    assert store_summary(run)
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    update_run_meta(run, run_id, {"exit": {"signal": 9}, "end_time_ns": 1}, replace=False)  # as record does
    got = load_summary(neuron_prof.load(run))
    assert got is not None and got.to_json()["health"]["command_exit"] == {"signal": 9}
    assert got == summarize(neuron_prof.load(run))


def _forged(run: Path, edit) -> bytes:
    """The sound stored document with ``edit`` applied: what whoever made the run could write,
    its key matching the data."""
    doc = json.loads((run / SUMMARY_FILE).read_text())
    assert doc["key"] == summary_key(neuron_prof.load(run))
    edit(doc)
    return json.dumps(doc).encode()


def _plant(run: Path, kind: str, outside: Path) -> None:
    path = run / SUMMARY_FILE
    sound = path.read_bytes()
    forged = {
        "wrong-type": lambda d: d["summary"]["steps"][0].update(median_ms="fast"),
        "markdown-for-a-number": lambda d: d["summary"]["ops"].update(events="![x](http://127.0.0.1:9/x)"),
        "missing-section": lambda d: d["summary"].pop("device"),
        "extra-key": lambda d: d["summary"]["run"].update(html="<img src=x>"),
        "list-for-a-dict": lambda d: d.update(summary=[]),
        "bool-for-an-int": lambda d: d["summary"]["ops"].update(events=True),
        "version-as-text": lambda d: d.update(version="1"),
        "another-version": lambda d: d.update(version=d["version"] + 1),
        "another-key": lambda d: d.update(key="0" * 64),
    }
    if kind in forged:
        data = _forged(run, forged[kind])
    else:
        data = {"truncated": sound[: len(sound) // 2], "not-json": b"\x00\xff garbage", "empty": b"",
                "a-list": b"[]", "nan": sound.replace(b'"events":', b'"events":NaN,"x":', 1),
                "nested": b"[" * 100_000 + b"]" * 100_000}.get(kind)
    path.unlink()
    if data is not None:
        path.write_bytes(data)
    elif kind == "huge":
        with open(path, "wb") as f:  # sparse: refused by its size, never read
            f.truncate(MAX_BYTES + 1)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-to-a-sound-copy":  # a link is not followed, even to a summary that would pass
        outside.write_bytes(sound)
        path.symlink_to(outside)


HOSTILE = ["truncated", "not-json", "empty", "a-list", "nan", "nested", "wrong-type", "markdown-for-a-number",
           "missing-section", "extra-key", "list-for-a-dict", "bool-for-an-int", "version-as-text", "another-version",
           "another-key", "huge", "fifo", "directory", "link-to-dev-zero", "link-to-a-sound-copy"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_damaged_or_hostile_stored_summary_is_computed_again(run, tmp_path, capsys, kind):
    expected = _report(capsys, run, "--json")  # computed, and stored: the file each case damages
    outside = tmp_path / "outside.json"
    _plant(run, kind, outside)
    assert load_summary(neuron_prof.load(run)) is None
    out, stored, computed = _uses(_report, capsys, run, "--json")
    assert (stored, computed) == (0, 1) and out == expected
    path = run / SUMMARY_FILE
    if kind in ("fifo", "directory", "link-to-dev-zero", "link-to-a-sound-copy"):
        assert not path.is_file() or path.is_symlink()  # not ours: left alone, never written through
        if kind == "link-to-a-sound-copy":
            assert path.is_symlink() and json.loads(outside.read_text())["version"] == 1
    else:  # a regular file of ours: replaced by a sound one
        assert load_summary(neuron_prof.load(run)) is not None


@pytest.mark.parametrize("kind", ["wrong-type", "fifo"])
def test_the_cli_on_a_hostile_stored_summary_prints_the_report_without_a_traceback(run, tmp_path, kind):
    expected = cli("report", run).stdout
    _plant(run, kind, tmp_path / "outside.json")
    res = cli("report", run, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr and res.stdout == expected


def _without_dac_override() -> None:
    """In the child: drop CAP_DAC_OVERRIDE from the bounding set (PR_CAPBSET_DROP), so root too
    is refused a write into a read-only folder after exec, as any user is."""
    if os.geteuid() == 0 and ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


_READER = """
import json, sys
import neuron_prof
from neuron_prof.reports.stored import counts, run_summary, store_summary
stored = store_summary(sys.argv[1])
before = dict(counts)
summary = run_summary(neuron_prof.load(sys.argv[1]))
print(json.dumps({"store_summary": stored, "counts": {k: counts[k] - before[k] for k in counts},
                  "events": summary.ops.events}))
"""


def _read_only(run: Path, writable: bool = False) -> None:
    for d, _, files in os.walk(run):
        os.chmod(d, 0o755 if writable else 0o555)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644 if writable else 0o444)


def test_a_read_only_run_reads_as_before_and_stores_nothing(run):
    expected = summarize(neuron_prof.load(run)).ops.events
    report = cli("report", run, "--json").stdout
    (run / SUMMARY_FILE).unlink()
    _read_only(run)
    try:
        def read():
            res = subprocess.run([sys.executable, "-c", _READER, str(run)], capture_output=True, text=True,
                                 timeout=300, preexec_fn=_without_dac_override)
            assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
            return json.loads(res.stdout.strip().splitlines()[-1])

        probe = subprocess.run([sys.executable, "-c", f"open({str(run / 'probe')!r}, 'w')"],
                               preexec_fn=_without_dac_override, capture_output=True)
        if probe.returncode == 0:
            pytest.skip("this process can write into a read-only folder (a file system without permissions?)")
        got = read()
        assert got == {"store_summary": False, "counts": {"stored": 0, "computed": 1}, "events": expected}
        assert not (run / SUMMARY_FILE).exists()
        res = subprocess.run([sys.executable, "-m", "neuron_prof", "report", str(run), "--json"], capture_output=True,
                             text=True, timeout=300, preexec_fn=_without_dac_override)
        assert res.returncode == 0 and res.stdout == report and "Traceback" not in res.stderr
        # stored while it was writable: read back from the read-only run
        _read_only(run, writable=True)
        assert store_summary(run)
        _read_only(run)
        got = read()
        assert got == {"store_summary": True, "counts": {"stored": 1, "computed": 0}, "events": expected}
    finally:
        _read_only(run, writable=True)


def test_the_overview_shows_the_stored_summary(monkeypatch, run):
    """The viewer reads the stored summary (no summarize on open), and shows the same findings."""
    expected = findings(summarize(neuron_prof.load(run)))
    assert store_summary(run)
    at, stored, computed = _uses(viewer_page, monkeypatch, run, "overview", "Overview")
    assert (stored, computed) == (1, 0)
    cards = shown("\n".join(m.value for m in at.markdown))
    assert expected and all(f.text in cards for f in expected)


def test_the_overview_without_a_stored_summary_computes_and_stores_it(monkeypatch, run):
    _, stored, computed = _uses(viewer_page, monkeypatch, run, "overview", "Overview")
    assert (stored, computed) == (0, 1)
    assert load_summary(neuron_prof.load(run)) is not None


def test_store_summary_at_the_end_of_a_capture_never_raises(tmp_path):
    """The capture side's call: a run that cannot be read (none there, no step completed) is no
    summary and no error, and says nothing (``report`` explains such a run)."""
    assert store_summary(tmp_path / "missing") is False
    assert store_summary(tmp_path) is False
    assert not (tmp_path / SUMMARY_FILE).exists()


def test_a_big_capture_stores_its_summary_in_the_background_at_close(tmp_path):
    """A rank past ``SUMMARY_AT_CLOSE_ROWS`` op rows (here lowered to 1 for a small real run)
    starts a process of its own at close that stores the summary; the training process does not
    wait for it, and the first report reads it."""
    import time

    from neuron_prof.capture.session import SUMMARY_AT_CLOSE_ENV
    script = tmp_path / "train.py"
    script.write_text("import sys, torch, neuron_prof\n"
                      "m = torch.nn.Linear(16, 16)\n"
                      "with neuron_prof.profile(sys.argv[1], collectors=['eager']) as p:\n"
                      "    for _ in range(4):\n"
                      "        m(torch.randn(8, 16)).sum().backward()\n"
                      "        p.step()\n")
    run = tmp_path / "run"
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, SUMMARY_AT_CLOSE_ENV: "1"})
    assert res.returncode == 0, res.stderr
    exited = time.monotonic() - t0
    deadline = time.monotonic() + 120
    while not (run / SUMMARY_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run / SUMMARY_FILE).is_file(), f"no summary stored {exited:.1f} s after the capture exited"
    got, stored, computed = _uses(run_summary, neuron_prof.load(run))
    assert (stored, computed) == (1, 0)
    assert got == summarize(neuron_prof.load(run))
    # a small run (the default threshold) leaves it to its first reader
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "small")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and not (tmp_path / "small" / SUMMARY_FILE).exists()
