"""The viewer's Device page (Streamlit AppTest) on examples/device_defects.py captured on the
emulated `neuron` device: every table shows the report's numbers, the stall and the fallback are
at their marked lines, the per-step chart carries each step's verdict (even steps host-bound, odd
ones device-bound), the lanes of a step draw its fused chain's kernel and lines from the host ops
to the kernels that ran their work, the selected stall's source is its line (and a stall whose
file is gone says so); a CPU run says how to get device data; the Overview puts the device's time
next to the host's split."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

import neuron_prof  # noqa: E402
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.examples import device_defects as ex  # noqa: E402
from neuron_prof.reports.findings import findings  # noqa: E402
from neuron_prof.reports.summary.build import summarize  # noqa: E402
from neuron_prof.units import format_bytes  # noqa: E402

from conftest import DEVICE_STEPS, line_of, plotly_array, shown, viewer_page, write_script  # noqa: E402

pytestmark = pytest.mark.multiprocess  # a training in a process of its own (or ranks), per test or per fixture

EXAMPLE = Path(ex.__file__)
WAITING_SCRIPT = """
import sys
import torch
import neuron_prof
from neuron_prof.testing import neuron

neuron.enable(launch_us=2000)  # each kernel 2 ms: the host always finds the queue busy at .item()
x = torch.randn(128, 128).to("neuron")
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(3):
        (x @ x).relu().sum().item()  # WAIT-LINE
        prof.step()
"""


def _lineno(marker: str) -> int:
    return line_of(EXAMPLE, "# " + marker)  # the marked line, not the docstring naming it


def _line(marker: str) -> str:
    return f"examples/device_defects.py:{_lineno(marker)}"


@pytest.fixture(scope="module")
def summary(device_run) -> dict:
    return summarize(neuron_prof.load(device_run))


@pytest.fixture(scope="module")
def run(device_run):
    return neuron_prof.load(device_run)


def _page(monkeypatch, run_dir: Path):
    return viewer_page(monkeypatch, run_dir, "device", title="Device")


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _traces(at, name: str) -> list[dict]:
    return [t for f in _figures(at) for t in f["data"] if t.get("name") == name]


def _table(at, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _flows(at) -> list[tuple[str, str, str]]:
    """The op -> kernel lines drawn: (host lane, device lane, hover text) per line."""
    (t,) = _traces(at, "op → kernel")
    y, text = list(t["y"]), list(t["customdata"])
    assert y[2::3] == [None] * (len(y) // 3)  # one segment per flow, None between them
    return list(zip(y[0::3], y[1::3], text[0::3]))


def test_a_cpu_run_says_it_has_no_device_data_and_how_to_get_it(demo_run, monkeypatch):
    at = _page(monkeypatch, demo_run)
    assert [i.value.split(".")[0] for i in at.info] == ["This run has no device data"]
    msg = at.info[0].value
    assert "neuron_prof.testing.neuron.enable()" in msg and "hook API" in msg and "README" in msg
    assert not at.dataframe and not at.get("plotly_chart") and not at.selectbox and not at.metric


def test_findings_and_metrics_are_the_reports(device_run, summary, monkeypatch):
    at = _page(monkeypatch, device_run)
    said = [shown(x.value) for x in [*at.warning, *at.info]]
    want = [f.text for f in findings(summary) if f.page == "device"]
    assert want and sorted(said) == sorted(want)
    d = summary.to_json()["device"]
    metrics = {m.label: m.value for m in at.metric}
    (cov,) = d["coverage"]
    assert metrics["coverage"] == f"{cov['coverage_pct']:.1f}%"
    # the report's verdict with the most steps (4 of the 7 steady steps are device-bound by design;
    # which verdict a loaded machine gives each step is test_device_analysis's business)
    most = max(v["steps"] for v in d["verdict"])
    assert metrics["most steps are"] in {v["verdict"] for v in d["verdict"] if v["steps"] == most}
    steps = sum(v["steps"] for v in d["verdict"])
    assert metrics["device busy"] == f"{sum(v['busy_pct'] * v['steps'] for v in d['verdict']) / steps:.0f}% of a step"
    verdicts = _table(at, "busiest device")
    assert verdicts[["rank", "verdict", "steps"]].to_dict("records") == [
        {"rank": v["rank"], "verdict": v["verdict"], "steps": v["steps"]} for v in d["verdict"]]


def test_the_stalls_table_names_the_stall_line_and_shows_its_source(device_run, summary, monkeypatch):
    at = _page(monkeypatch, device_run)
    stalls = _table(at, "ops waited for")
    # the rows by their line, not their place: the order is by measured wait (STALL-LINE's
    # hundreds of ms against the fallback's copies, but a loaded host stretches every wait)
    sources = stalls["source line"].tolist()
    stall, fallback = sources.index(_line("STALL-LINE")), sources.index(_line("FALLBACK-LINE"))
    row = stalls.iloc[stall]
    assert (row["why"], row["op"]) == ("sync", "aten::_local_scalar_dense")
    want = summary.to_json()["device"]["stalls"]
    assert sources == [x["source"] for x in want]
    assert stalls["total ms"].tolist() == [x["total_ms"] for x in want]
    assert stalls["waits"].tolist() == [x["count"] for x in want]
    assert at.selectbox(key="dev_stall").value == 0  # the longest stall is selected first
    # the stall picked shows its source: its line marked, as the file has it now
    at.selectbox(key="dev_stall").set_value(stall).run()
    assert not at.exception
    (code,) = [c.value for c in at.code if ">>" in c.value]
    marked = next(row for row in code.splitlines() if row.startswith(">>"))
    n = _lineno("STALL-LINE")
    assert marked.split("|", 1)[1].strip() == EXAMPLE.read_text().splitlines()[n - 1].strip()
    assert f" {n} |" in marked and "# STALL-LINE" in marked
    # picking the other stall (the fallback's wait) shows its own line
    at.selectbox(key="dev_stall").set_value(fallback).run()
    assert not at.exception
    (code,) = [c.value for c in at.code if ">>" in c.value]
    assert "# FALLBACK-LINE" in next(row for row in code.splitlines() if row.startswith(">>"))


def test_a_stall_whose_source_is_gone_says_so(tmp_path, monkeypatch):
    """The source is read from the file the run names, as it is now: a script deleted since the
    capture is said to be unreadable, and no lines are made up."""
    script = write_script(tmp_path / "waits.py", WAITING_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    waited = line_of(script, "# WAIT-LINE")
    script.unlink()
    at = _page(monkeypatch, tmp_path / "run")
    assert _table(at, "ops waited for").iloc[0]["source line"].endswith(f"waits.py:{waited}")
    assert not [c for c in at.code if ">>" in c.value]
    assert any(shown(c.value) == f"source of {script} is not shown: it is not here any more (moved or deleted since "
               "the run)" for c in at.caption)


def test_the_fallbacks_table_has_the_cumsum_with_its_bytes_and_the_coverage(device_run, summary, monkeypatch):
    at = _page(monkeypatch, device_run)
    table = _table(at, "to host")
    (row,) = table.to_dict("records")
    (want,) = summary.to_json()["device"]["fallbacks"]
    x_bytes = ex.BATCH * ex.IN * 4  # float32: cumsum.out copies the input and the out= buffer, the result back
    assert (row["op"], row["source lines"], row["calls"]) == ("aten::cumsum", _line("FALLBACK-LINE"), DEVICE_STEPS)
    assert row["to host"] == format_bytes(want["bytes_to_host"]) == format_bytes(DEVICE_STEPS * 2 * x_bytes)
    assert row["from host"] == format_bytes(want["bytes_from_host"]) == format_bytes(DEVICE_STEPS * x_bytes)
    assert (row["total ms"], row["per step"]) == (want["total_ms"], want["calls_per_step"])
    (cov,) = _table(at, "coverage %").to_dict("records")
    (c,) = summary.to_json()["device"]["coverage"]
    assert (cov["ops run natively"], cov["ops fallen back"], cov["coverage %"]) == (
        c["native_ops"], c["fallback_ops"], c["coverage_pct"])


def test_the_copies_table_has_the_fallbacks_and_the_stalls_copies_to_the_host(device_run, summary, monkeypatch):
    """The device's copies (Kineto memcpy activities) by direction and line: the CPU fallback's
    two inputs copied to the host in every step, and the loss the stall line reads (4 bytes)."""
    at = _page(monkeypatch, device_run)
    rows = {r["source line"]: r for r in _table(at, "direction").to_dict("records")}
    want = {c["user_source"]: c for c in summary.to_json()["device"]["copies"]}
    x_bytes = ex.BATCH * ex.IN * 4
    fallback, stall = rows[_line("FALLBACK-LINE")], rows[_line("STALL-LINE")]
    assert (fallback["direction"], fallback["copies"], fallback["bytes"]) == (
        "DtoH", 2 * DEVICE_STEPS, format_bytes(2 * DEVICE_STEPS * x_bytes))
    assert (stall["direction"], stall["copies"], stall["bytes"]) == ("DtoH", DEVICE_STEPS, format_bytes(4 * DEVICE_STEPS))
    for line, row in rows.items():
        assert (row["copies"], row["total ms"]) == (want[line]["copies"], want[line]["total_ms"])


def test_the_per_step_chart_shows_each_steps_verdict(device_run, summary, monkeypatch):
    at = _page(monkeypatch, device_run)
    drawn = {}
    for t in _figures(at)[0]["data"]:
        if t["type"] == "bar" and t["name"].startswith("busy · "):
            drawn.update({int(s): t["name"].removeprefix("busy · ") for s in plotly_array(t["x"])})
    # the analysis's verdicts, each step's (that they are the example's is test_device_analysis's
    # to say: on a loaded machine a host-bound step can read as balanced)
    assert drawn == {x["step"]: x["verdict"] for x in summary.to_json()["device"]["steps"]}
    assert sorted(drawn) == list(range(DEVICE_STEPS))
    assert "device-bound" in drawn.values()
    (wait,) = _traces(at, "host waits for the device")[:1]
    assert plotly_array(wait["y"]).tolist() == [x["wait_pct"] for x in summary.to_json()["device"]["steps"]]


def test_the_lanes_draw_the_fused_kernel_and_flows_from_host_ops_to_kernels(device_run, run, monkeypatch):
    at = _page(monkeypatch, device_run)
    step = at.selectbox(key="dev_step")
    assert step.value == 1  # the first steady step
    corr = analyze(run).device_correlation
    # a step whose chain ran as one kernel (test_device_analysis checks when it must have)
    chains = corr[corr["source"].astype(str) == _line("FUSED-LINE")].groupby("step")["kernel"].nunique()
    chain_step = int(chains[(chains.index >= 1) & (chains == 1)].index[0])
    if chain_step != 1:
        step.set_value(chain_step).run()
    fused = [c for t in _traces(at, "fused kernel") for c in t["customdata"]]
    assert any(c.startswith("kernel mul+add+tanh+mul+sub+relu · 6 ops") for c in fused), fused
    flows = _flows(at)
    mine = corr[(corr["step"] == chain_step) & (corr["op_index"] >= 0) & (corr["kernel"] >= 0)]
    assert len(flows) == len(mine) > 0
    assert all(h.startswith("host · ") and d == "device · neuron:0" for h, d, _ in flows)
    chain = [text for _, _, text in flows if "kernel mul+add+tanh+mul+sub+relu ran" in text]
    assert len(chain) == len(ex.CHAIN) and all(_line("FUSED-LINE") in text for text in chain)
    assert f"all {len(mine)} op → kernel lines" in next(c.value for c in at.caption if "op → kernel" in c.value)
    # another device-bound step (its .item() always waits): its kernels, the fallback and the wait on the host lane
    step.set_value(3).run()
    assert not at.exception
    (fb,) = _traces(at, "CPU fallback")
    assert len(fb["customdata"]) == 1 and _line("FALLBACK-LINE") in fb["customdata"][0]
    waits = [c for t in _traces(at, "host waits for the device") if t["type"] == "bar" for c in t["customdata"]]
    assert any(_line("STALL-LINE") in c and "(sync:" in c for c in waits), waits
    kernels = run.device_kernels
    drawn = sum(len(t["customdata"]) for n in ("fused kernel", "one-op kernel") for t in _traces(at, n))
    assert drawn >= (kernels["step"] == 3).sum()  # those started in it, and those running its work after it


def test_the_overview_puts_the_device_next_to_the_host_split(device_run, summary, monkeypatch):
    at = viewer_page(monkeypatch, device_run, "overview", title="Overview")
    bars = {t["name"]: (list(t["y"]), plotly_array(t["x"]).tolist()) for f in _figures(at) for t in f["data"]
            if t["type"] == "bar"}
    verdict = summary.to_json()["device"]["verdict"]
    n = sum(v["steps"] for v in verdict)
    busy = sum(v["busy_ms"] * v["steps"] for v in verdict) / n
    idle = sum(v["idle_ms"] * v["steps"] for v in verdict) / n
    assert bars["device busy"][0] == ["rank 0 · neuron:0"] and bars["device busy"][1] == pytest.approx([busy])
    assert bars["device idle"][1] == pytest.approx([idle])
    (split,) = summary.to_json()["time_split"]
    assert bars["sync"] == (["rank 0 · host"], pytest.approx([split["sync_ms"]]))
    assert busy + idle == pytest.approx(split["step_ms"])  # the same steady steps
    table = _table(at, "device busy ms")
    assert table["host waits ms"].tolist() == [round(sum(v["wait_ms"] * v["steps"] for v in verdict) / n, 3)]
    assert any("measured wait for the device" in shown(c.value) for c in at.caption)
    assert any(link.label == "see Device" for link in at.get("page_link"))
