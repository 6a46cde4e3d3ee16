"""`neuron-prof inspect` is the strict validator: real traces exported from a captured run pass and
carry their end-of-trace packet; cut, empty or damaged ones (packets edited with the protos) are one
line naming the file and the problem, exit code 2."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from conftest import check_trace, cli, one_line_error
from neuron_prof import __version__
from neuron_prof.export.perfetto import _varint, is_end_of_trace, writer_of
from neuron_prof.export.check import _varint as tracecheck_varint
from neuron_prof.export.check import iter_packets


@pytest.fixture(scope="module")
def trace(demo_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("inspect") / "t.perfetto-trace"
    res = cli("export", demo_run, "-o", out)
    assert res.returncode == 0, res.stderr
    return out


def packets(path: Path) -> list:
    return [p for _, p in iter_packets(path.read_bytes())]


def write(path: Path, pkts: list) -> Path:
    bodies = [p.SerializeToString() for p in pkts]
    path.write_bytes(b"".join(b"\x0a" + _varint(len(b)) + b for b in bodies))
    return path


def test_exported_trace_passes_and_ends_with_its_end_packet(trace):
    report = check_trace(trace)
    pkts = packets(trace)
    assert writer_of(pkts[0]) == f"neuron_prof {__version__}"
    assert is_end_of_trace(pkts[-1]) and not any(is_end_of_trace(p) for p in pkts[:-1])
    last = max([s.ts + s.dur for s in report.slices] + [c.ts for c in report.counters])
    assert pkts[-1].timestamp == last
    res = cli("inspect", trace)
    assert res.returncode == 0, res.stderr
    assert f"written by neuron_prof {__version__}, whole" in res.stdout
    summary = json.loads(cli("inspect", trace, "--json").stdout)
    assert summary["writer"] == f"neuron_prof {__version__}"
    assert summary["slices"] == report.stats["slices"] + report.stats["instants"] > 1000
    assert summary["counters"] == len(report.counters) and summary["packets"] == len(pkts)
    assert summary["processes"] and summary["processes"][0].startswith("rank 0")


@pytest.mark.parametrize("keep", ["all but the end packet", "half of the packets"])
def test_trace_cut_at_a_packet_boundary(trace, tmp_path, keep):
    pkts = packets(trace)
    cut = write(tmp_path / "cut.perfetto-trace", pkts[:-1] if keep.startswith("all") else pkts[:len(pkts) // 2])
    assert len(packets(cut)) < len(pkts)  # whole packets: framing alone sees nothing wrong
    one_line_error(cli("inspect", cut), str(cut), "truncated", "end-of-trace packet", "neuron-prof export")


def test_empty_file(tmp_path):
    for path, data in ((tmp_path / "empty.perfetto-trace", b""),
                       (tmp_path / "empty.perfetto-trace.gz", gzip.compress(b""))):
        path.write_bytes(data)
        one_line_error(cli("inspect", path), str(path), "empty: no packets")


def test_cut_gzip_trace(demo_run, tmp_path):
    gz = tmp_path / "t.perfetto-trace.gz"
    assert cli("export", demo_run, "-o", gz).returncode == 0
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    check_trace(gz)
    assert cli("inspect", gz).returncode == 0
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size * 2 // 3])
    one_line_error(cli("inspect", gz), str(gz), "truncated", "gzip", "neuron-prof export")


def _drop_last_slice_end(pkts):
    i = max(i for i, p in enumerate(pkts) if p.HasField("track_event") and p.track_event.type == 2)
    return pkts[:i] + pkts[i + 1:]


def _time_goes_back(pkts):
    events = [i for i, p in enumerate(pkts) if p.HasField("track_event")]
    i = events[len(events) // 2]
    pkts[i].timestamp = pkts[events[len(events) // 2 - 1]].timestamp - 1
    return pkts


def _undefined_name_iid(pkts):
    begin = next(p for p in pkts if p.HasField("track_event") and p.track_event.HasField("name_iid"))
    begin.track_event.name_iid = 1_000_000
    return pkts


@pytest.mark.parametrize("damage, needle", [
    (_drop_last_slice_end, "never ended"),
    (_time_goes_back, "non-monotonic"),
    (_undefined_name_iid, "name_iid 1000000 not interned"),
])
def test_damaged_packets(trace, tmp_path, damage, needle):
    bad = write(tmp_path / "bad.perfetto-trace", damage(packets(trace)))
    one_line_error(cli("inspect", bad), str(bad), needle, "neuron-prof export")


def test_other_tools_traces_are_checked_except_for_the_end_packet(trace, tmp_path):
    """Without neuron_prof's start packet the end packet is not required; the rest still is."""
    pkts = packets(trace)[1:-1]
    foreign = write(tmp_path / "foreign.perfetto-trace", pkts)
    res = cli("inspect", foreign)
    assert res.returncode == 0, res.stderr
    assert "not written by neuron_prof" in res.stdout
    bad = write(tmp_path / "foreign-bad.perfetto-trace", _drop_last_slice_end(pkts))
    one_line_error(cli("inspect", bad), str(bad), "never ended", "the tool that wrote it")


def _orphan_slice_end(pkts):
    i = next(i for i, p in enumerate(pkts) if p.HasField("track_event") and p.track_event.type == 1)
    return pkts[:i] + pkts[i + 1:]


def test_slice_end_without_a_begin(trace, tmp_path):
    bad = write(tmp_path / "bad.perfetto-trace", _orphan_slice_end(packets(trace)))
    one_line_error(cli("inspect", bad), str(bad), "with no open slice", "neuron-prof export")


def test_packet_that_does_not_parse(trace, tmp_path):
    data = bytearray(trace.read_bytes())
    offsets = [off for off, _ in iter_packets(bytes(data))]
    start = offsets[len(offsets) // 2]
    _, body = tracecheck_varint(bytes(data), start + 1)
    data[body] = 0x0F   # field 1 with wire type 7, which does not exist
    bad = tmp_path / "bad.perfetto-trace"
    bad.write_bytes(bytes(data))
    one_line_error(cli("inspect", bad), str(bad), f"corrupt packet at byte {start}", "neuron-prof export")


def test_cut_inside_a_packet(trace, tmp_path):
    data = trace.read_bytes()
    offsets = [off for off, _ in iter_packets(data)]
    for at in (offsets[1] + 1, offsets[len(offsets) // 2] + 2, len(data) - 1):
        cut = tmp_path / f"cut-{at}.perfetto-trace"
        cut.write_bytes(data[:at])
        one_line_error(cli("inspect", cut), str(cut), "truncated at byte", "neuron-prof export")


def test_corrupt_gzip_trace(trace, tmp_path):
    gz = bytearray(gzip.compress(trace.read_bytes(), mtime=0))
    gz[len(gz) // 2] ^= 0x55   # inside the deflate stream
    bad = tmp_path / "bad.perfetto-trace.gz"
    bad.write_bytes(bytes(gz))
    one_line_error(cli("inspect", bad), str(bad), "gzip", "neuron-prof export")


def test_fifo_and_devices_are_refused_unread(tmp_path):
    """A FIFO would block the read forever, /dev/zero would be read until memory runs out."""
    fifo = tmp_path / "fifo.perfetto-trace"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.perfetto-trace"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        one_line_error(cli("inspect", path, timeout=60), str(path), "not a regular file")


def test_a_gzip_bomb_is_refused_undecompressed(tmp_path):
    """1.25 GiB of zeros in about a megabyte of gzip: inspect used to decompress it all into memory."""
    import zlib
    bomb = tmp_path / "bomb.perfetto-trace.gz"
    pack = zlib.compressobj(1, wbits=31)
    zeros = bytes(64 << 20)
    with open(bomb, "wb") as f:
        for _ in range(20):
            f.write(pack.compress(zeros))
        f.write(pack.flush())
    one_line_error(cli("inspect", bomb), str(bomb), "decompresses to more than", "gzip bomb")
