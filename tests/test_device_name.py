"""The device's name in every reader (issue 43): a training job on the emulated `neuron` device in
its kernels-only mode (its Kineto plugin reports kernels only: no runtime calls, no correlation
ids, no metadata, as many real backends ship), captured by neuron_prof and traced by plain
torch.profiler. The capture's report header, sections, ``--json``, Perfetto tracks and viewer name
the device as its backend registered it (``neuron``, ``neuron:0``); ``neuron-prof import`` of the
trace names it from the trace's device labels, with the torch version the trace carries; a trace
whose backend reported no activity (OpenReg's plugin) or only its allocations still never calls
the device ``cpu``. The job runs in a process of its own (``tests/device_name_script.py``): the
device's modes are fixed by the first ``enable()`` of a process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import check_trace, cli, script_facts, viewer_page

from neuron_prof.store.run import load

SCRIPT = Path(__file__).with_name("device_name_script.py")

# the job's process builds the emulator's extension on a cold cache (1-2 min), then runs in ~10 s
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, dict]:
    """The folder holding the job's torch.profiler traces (``trace.json``: CPU and the device;
    ``cpu.json``: CPU and memory only) and its capture (``run``), and the job's facts."""
    d = tmp_path_factory.mktemp("device_name")
    facts = script_facts(SCRIPT, d / "trace.json", d / "cpu.json", d / "run")
    assert facts["backend"] == "neuron"
    return d, facts


def _header(run_dir: Path) -> str:
    """The report's run line: ``torch <version> on <device>, world size ...``."""
    res = cli("report", run_dir)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[2]


def _report_json(run_dir: Path) -> dict:
    res = cli("report", run_dir, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _json_devices(section: dict) -> set[str]:
    """Every ``device`` value in the rows of ``--json``'s device section."""
    return {row["device"] for rows in section.values() if isinstance(rows, list)
            for row in rows if isinstance(row, dict) and "device" in row}


def _tracks(run_dir: Path, out: Path) -> set[str]:
    """The names of the tracks of the run's Perfetto trace, read by the strict reader."""
    res = cli("export", run_dir, "-o", out)
    assert res.returncode == 0, res.stderr
    return {t["name"] for t in check_trace(out).tracks.values()}


def _viewer_device(monkeypatch, run_dir: Path) -> str:
    at = viewer_page(monkeypatch, run_dir, "overview", title="Overview")
    return {m.label: m.value for m in at.metric}["device"]


def test_the_capture_names_the_device_as_its_backend_registered_it(job, tmp_path, monkeypatch):
    """Header, Device section, ``--json``, Perfetto tracks and the viewer name ``neuron`` and
    ``neuron:0``; none calls the device cpu or GPU. ``export --format kineto`` keeps both the name
    and the torch version for an import."""
    d, facts = job
    run_dir = d / "run"
    assert _header(run_dir).startswith(f"  torch {facts['torch']} on neuron, world size 1")
    text = cli("report", run_dir).stdout
    assert "\nDevice (rank 0 neuron:0: " in text and "GPU" not in text
    rep = _report_json(run_dir)
    assert rep["run"]["device"] == "neuron"
    assert rep["device"]["top_kernels"] and _json_devices(rep["device"]) == {"neuron:0"}
    assert "GPU" not in json.dumps(rep)
    tracks = _tracks(run_dir, tmp_path / "run.perfetto-trace")
    assert "Device neuron:0 (stream 0)" in tracks
    assert not [t for t in tracks if "GPU" in t or t.startswith("Device cpu")], tracks
    assert _viewer_device(monkeypatch, run_dir) == "neuron"
    # its torch.profiler-shaped export, imported, is the same device and torch version
    assert cli("export", run_dir, "--format", "kineto", "-o", tmp_path / "kineto").returncode == 0
    assert cli("import", tmp_path / "kineto", "-o", tmp_path / "back").returncode == 0
    assert _header(tmp_path / "back").startswith(f"  torch {facts['torch']} on neuron, world size 1")


def test_an_imported_trace_names_the_device_and_torch_version_it_carries(job, tmp_path, monkeypatch):
    """``neuron-prof import`` of the kernels-only trace: the device is named by the trace's device
    labels (``neuron 0``: no runtime call says PrivateUse1), the torch version is the one the job
    added to the trace; every reader shows them."""
    d, facts = job
    res = cli("import", d / "trace.json", "-o", tmp_path / "imported")
    assert res.returncode == 0, res.stderr
    assert "neuron, world size 1" in res.stdout
    run_dir = tmp_path / "imported"
    assert _header(run_dir).startswith(f"  torch {facts['torch']} on neuron, world size 1")
    run = load(run_dir)
    assert len(run.device_kernels) > 0 and set(run.device_kernels["device"].astype(str)) == {"neuron:0"}
    rep = _report_json(run_dir)
    assert (rep["run"]["device"], rep["run"]["torch_version"]) == ("neuron", facts["torch"])
    assert rep["device"]["top_kernels"] and _json_devices(rep["device"]) == {"neuron:0"}
    tracks = _tracks(run_dir, tmp_path / "imported.perfetto-trace")
    assert "Device neuron:0 (stream 0)" in tracks
    assert not [t for t in tracks if "GPU" in t or t.startswith("Device cpu")], tracks
    assert _viewer_device(monkeypatch, run_dir) == "neuron"


def test_a_backend_that_reported_no_activity_is_named_by_its_device_label(job, tmp_path):
    """OpenReg's Kineto plugin names its device (``OpenReg 0``) and reports no activity: the same
    trace less its kernels is a job on ``neuron``, not on cpu (what the importer said before)."""
    d, facts = job
    doc = json.loads((d / "trace.json").read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    labels = [e["args"]["labels"] for e in doc["traceEvents"] if e.get("name") == "process_labels"]
    assert "neuron 0" in labels
    quiet = tmp_path / "no-activity.json"
    quiet.write_text(json.dumps(doc))
    res = cli("import", quiet, "-o", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "neuron, world size 1" in res.stdout
    assert _header(tmp_path / "run").startswith(f"  torch {facts['torch']} on neuron, world size 1")


def test_a_trace_without_the_devices_session_never_calls_its_memory_cpu(job, tmp_path):
    """A trace of CPU activity and memory only names no device; its allocations' device type is
    PrivateUse1, so the run is on ``privateuseone`` (PyTorch's name for a backend it was not told
    the name of) and those allocations are ``privateuseone:0``, apart from the CPU's; a trace
    that carries no torch version says ``torch unknown``."""
    d, _ = job
    res = cli("import", d / "cpu.json", "-o", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert _header(tmp_path / "run").startswith("  torch unknown on privateuseone, world size 1")
    devices = load(tmp_path / "run").memory_events["device"].astype(str)
    assert set(devices) == {"cpu", "privateuseone:0"}
    assert (devices == "privateuseone:0").sum() > 0
