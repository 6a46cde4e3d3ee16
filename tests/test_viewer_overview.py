"""The viewer's Overview page (Streamlit AppTest on real runs) and the findings behind it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import neuron_prof
from conftest import REPO, cli, line_of, shown, viewer_page
from neuron_prof.examples import memory_leak as ml
from neuron_prof.reports.findings import findings
from neuron_prof.reports.summary.build import summarize

APP = str(REPO / "viewer" / "app.py")


def overview(monkeypatch, run_dir: Path) -> AppTest:
    return viewer_page(monkeypatch, run_dir, "overview", title="Overview")


def test_leak_run_overview_shows_facts_findings_and_where_time_goes(monkeypatch, memory_runs):
    run_dir = memory_runs("leak")
    at = overview(monkeypatch, run_dir)
    run = neuron_prof.load(run_dir)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["device"] == "cpu" and metrics["ranks"] == "1"
    assert metrics["steps"] == str(int(run.steps["complete"].sum())) == "8"
    text = shown("\n".join(m.value for m in at.markdown))
    leak_line = f"examples/memory_leak.py:{line_of(Path(ml.__file__), 'LEAK-LINE')}"
    assert "memory grows 24.1 KiB per step on rank 0 cpu from " + leak_line in text
    # the first card is the most severe one, and it links to the page that explains it
    assert at.markdown[0].value.startswith(":material/error: memory grows")
    assert any(link.label == "see Memory" for link in at.get("page_link"))
    split = at.dataframe[0].value
    expected = pd.DataFrame(summarize(run).to_json()["time_split"])
    assert split["compute ms"].tolist() == expected["compute_ms"].round(3).tolist()
    assert len(at.get("plotly_chart")) == 2  # step time per rank, where the time goes


def test_findings_rank_by_severity_and_name_their_page(memory_runs):
    leak = findings(summarize(neuron_prof.load(memory_runs("leak"))))
    assert leak[0].severity == "high" and leak[0].page == "memory"
    spike = findings(summarize(neuron_prof.load(memory_runs("spike"))))
    assert not any(f.severity == "high" for f in spike)
    peak = [f for f in spike if f.text.startswith("peak memory")]
    assert peak and "2.0 MiB from aten::contiguous" in peak[0].text and peak[0].page == "memory"
    assert [f.severity for f in spike] == sorted((f.severity for f in spike),
                                                   key=("high", "medium", "info").index)


def test_report_text_starts_with_the_findings(memory_runs):
    out = cli("report", memory_runs("leak")).stdout
    head = out.split("\nSteps\n")[0]
    assert "Findings\n  !! memory grows 24.1 KiB per step" in head


def test_viewer_page_for_a_missing_run_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_PROF_RUN", str(tmp_path / "nope"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and str(tmp_path / "nope") in shown(at.error[0].value)


def test_view_command_rejects_a_missing_run(tmp_path):
    res = cli("view", tmp_path / "missing", "--no-browser")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and str(tmp_path / "missing") in res.stderr


def test_view_serves_on_localhost_and_stops_with_its_server_on_sigterm(memory_runs):
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "neuron_prof", "view", str(memory_runs("clean")), "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(": ", 1)[1].split()[0]
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        time.sleep(1)
        with pytest.raises(OSError):  # the Streamlit server went with it
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=3)
    finally:
        if proc.poll() is None:
            proc.kill()
