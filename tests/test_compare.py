"""`neuron-prof compare`: the migration checklist of two real runs of one training loop. The same
loop twice (identical losses), and once with a change at a known step and a graph break of its
own; every row is checked against the analyses of each run or a hand computation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import neuron_prof
from conftest import cli, line_of, on_terminal
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.compare import _step_median, compare_runs, render_markdown, to_json
from neuron_prof.reports.markdown import md
from neuron_prof.reports.stored import run_summary

STEPS, CHANGE_AT, TOKENS = 8, 4, 512


def _head(h: torch.Tensor, broken: bool) -> torch.Tensor:
    h = torch.relu(h)
    if broken:
        torch._dynamo.graph_break()  # ONLY-IN-B
    return h * 2.0


def _train(run_dir: Path, change: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    head = torch.compile(_head, backend="eager")
    data = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(STEPS)]
    with neuron_prof.profile(run_dir, tokens_per_step=TOKENS) as prof:
        for step, (x, y) in enumerate(data):
            if change and step == CHANGE_AT:
                for g in opt.param_groups:
                    g["lr"] = 0.5  # the loss of the next step is the first to differ
            loss = torch.nn.functional.mse_loss(head(model(x), change), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    for name, change in (("a", False), ("same", False), ("b", True)):
        torch._dynamo.reset()
        _train(root / name, change)
    return {name: neuron_prof.load(root / name) for name in ("a", "same", "b")}


def _rows(result) -> dict:
    return {r["item"]: r for r in result["rows"]}


def test_identical_runs_agree_exactly_on_the_loss(runs):
    result = to_json(compare_runs(runs["a"], runs["same"]))
    loss = result["loss"]
    assert (loss["common_steps"], loss["identical"], loss["max_abs_diff"], loss["first_divergent_step"]) == (
        STEPS, True, 0.0, None)
    assert _rows(result)["loss: max relative difference"]["verdict"] == "same"
    assert result["graph_breaks"] == {"a_only": [], "b_only": []}


def test_the_change_is_found_at_its_step_and_the_graph_break_of_b_only_is_listed(runs):
    result = to_json(compare_runs(runs["a"], runs["b"], labels=("cpu", "changed")))
    loss = result["loss"]
    assert loss["first_divergent_step"] == CHANGE_AT + 1 and not loss["identical"]
    assert _rows(result)["loss: max relative difference"]["verdict"] == "diverged"
    (site,) = result["graph_breaks"]["b_only"]
    assert site["source"] == f"tests/test_compare.py:{line_of(Path(__file__), '# ONLY-IN-B')}"
    assert result["graph_breaks"]["a_only"] == []
    rows = _rows(result)
    assert (rows["graph break sites"]["a"], rows["graph break sites"]["b"]) == (0, 1)
    assert rows["graph break sites"]["verdict"] == "worse"


def test_every_row_is_the_runs_own_analysis_or_the_hand_computation(runs):
    prices = (4.0, 1.5)
    result = to_json(compare_runs(runs["a"], runs["b"], prices=prices))
    rows = _rows(result)
    for key, run in (("a", runs["a"]), ("b", runs["b"])):
        s = run_summary(run)
        assert rows["step time (median)"][key] == pytest.approx(_step_median(s))
        assert rows["compile time (total)"][key] == pytest.approx(s.compile.compile_ms)
        assert rows["recompiles"][key] == s.compile.recompiles
        kinds = analyze(run).step_kinds
        steady = kinds[kinds["steady"]]
        tokens_per_s = TOKENS * len(steady) / (steady["dur"].sum() / 1e9)
        assert rows["tokens/s"][key] == pytest.approx(tokens_per_s)
        price = prices[0 if key == "a" else 1]
        assert rows["cost per million tokens"][key] == pytest.approx(price / 3600 / tokens_per_s * 1e6)
    tps = rows["tokens/s"]
    assert tps["ratio"] == pytest.approx(tps["b"] / tps["a"])
    assert tps["verdict"] == ("same" if abs(tps["b"] - tps["a"]) <= 0.05 * max(tps["a"], tps["b"])
                              else "better" if tps["b"] > tps["a"] else "worse")  # higher is better
    assert rows["samples/s"]["a"] is None  # no samples recorded: n/a, not 0
    assert rows["samples/s"]["verdict"] == "n/a"
    # the ops: matched by op and module path, each run's self time per steady step
    per_op = {}
    for key in ("a", "b"):
        st = analyze(runs[key]).op_time.stats
        per_op[key] = st.groupby([st["name"].astype(str), st["module"].astype(str)])["self_ms_per_step"].sum()
    assert len(result["ops"]) == 10
    for o in result["ops"]:
        for key in ("a", "b"):
            assert o[f"{key}_ms_per_step"] == pytest.approx(per_op[key].get((o["name"], o["module"]), 0.0))
        assert o["change_ms"] == pytest.approx(o["b_ms_per_step"] - o["a_ms_per_step"])
    changes = [abs(o["change_ms"]) for o in result["ops"]]
    assert changes == sorted(changes, reverse=True)
    biggest = (per_op["b"].reindex(per_op["a"].index.union(per_op["b"].index), fill_value=0)
               - per_op["a"].reindex(per_op["a"].index.union(per_op["b"].index), fill_value=0)).abs().max()
    assert changes[0] == pytest.approx(biggest)


def test_cli_text_json_markdown_and_bad_flags(runs):
    a, b = runs["a"].path, runs["b"].path
    done = cli("compare", a, b, "--json", "--label", "A=gpu", "--label", "B=neu|ron", "--price", "A=4", "--price", "B=1.5")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    compared = compare_runs(runs["a"], runs["b"], labels=("gpu", "neu|ron"), prices=(4.0, 1.5))
    want = to_json(compared)
    assert got["loss"] == want["loss"] and got["graph_breaks"] == want["graph_breaks"]
    assert [r["item"] for r in got["rows"]] == [r["item"] for r in want["rows"]]
    text = cli("compare", a, b)
    assert text.returncode == 0 and "first beyond 0.001 relative at step 5" in text.stdout
    assert "graph break only in b: tests/test_compare.py:" in text.stdout
    md = cli("compare", a, b, "--markdown", "--label", "B=neu|ron")
    assert md.returncode == 0 and md.stdout.startswith("## Migration check: neu\\|ron against a")
    table = [ln for ln in md.stdout.splitlines() if ln.startswith("|")]
    assert len({ln.replace("\\|", "").count("|") for ln in table[:16]}) == 1  # every row has the header's cells
    assert render_markdown(compared).count("\n| ") >= 14
    for args, says in ((("--price", "A=cheap"), "--price 'A=cheap': 'cheap' is not a number"),
                       (("--label", "C=x"), "--label 'C=x': expected A=VALUE or B=VALUE"),
                       (("--loss-rtol", "0"), "--loss-rtol 0.0: expected a number > 0")):
        bad = cli("compare", a, b, *args)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    missing = cli("compare", a, a.parent / "nowhere")
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr


def test_the_viewers_compare_page_shows_the_same_checklist_loss_and_breaks(runs, monkeypatch):
    pytest.importorskip("streamlit")
    from conftest import viewer_page
    at = viewer_page(monkeypatch, runs["b"].path, "compare", title="Compare", diff=runs["a"].path)
    want = to_json(compare_runs(runs["a"], runs["b"]))
    table = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert table["item"].tolist() == [r["item"] for r in want["rows"]]
    assert table["verdict"].tolist() == [r["verdict"] for r in want["rows"]]
    assert "Graph breaks only in b" in [h.value for h in at.subheader]
    breaks = next(d.value for d in at.dataframe if "reason_class" in d.value.columns)
    assert breaks["source"].tolist() == [s["source"] for s in want["graph_breaks"]["b_only"]]
    (loss_chart, _steps) = [c for c in at.get("plotly_chart")]
    traces = json.loads(loss_chart.proto.spec)["data"]
    assert sorted(t["name"] for t in traces) == ["a: a", "b: b"]
    said = md(f"first beyond 0.001 relative at step {CHANGE_AT + 1}")  # run text on the page: escaped
    assert any(said in c.value for c in at.caption)


def test_progress_is_shown_on_a_terminal_and_never_in_a_pipe(runs):
    args = ["compare", runs["a"].path, runs["b"].path, "--json"]
    done, shown = on_terminal(*args)
    assert done.returncode == 0
    assert "compare:" in shown and "b: summary and ops" in shown and "comparing" in shown
    json.loads(done.stdout)  # stdout stays the document
    piped = cli(*args, env={"CI": ""})
    assert piped.returncode == 0 and piped.stderr == ""


DEVICE_SCRIPT = """
import sys, torch, neuron_prof
device = sys.argv[2]
torch.set_num_threads(1)  # the emulated device computes with one thread: bitwise the CPU's then
if device == "neuron":
    from neuron_prof.testing import neuron
    neuron.enable()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(6)]
with neuron_prof.profile(sys.argv[1], tokens_per_step=16) as prof:
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()
"""


def test_the_same_job_on_cpu_and_on_the_emulated_device(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(DEVICE_SCRIPT)
    for device in ("cpu", "neuron"):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / device), device], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    cpu, dev = neuron_prof.load(tmp_path / "cpu"), neuron_prof.load(tmp_path / "neuron")
    result = to_json(compare_runs(cpu, dev, labels=("cpu", "neuron")))
    # the same numbers: the emulated device computes as the CPU does
    assert result["loss"]["identical"] and result["loss"]["common_steps"] == 6
    rows = _rows(result)
    assert rows["op coverage"]["a"] is None and rows["op coverage"]["verdict"] == "n/a"  # a CPU run has no device
    (cov,) = run_summary(dev).to_json()["device"]["coverage"]
    assert rows["op coverage"]["b"] == pytest.approx(cov["coverage_pct"])
    assert rows["CPU fallbacks per step"]["b"] == 0
    assert rows["peak memory (busiest device)"]["detail"] == "cpu vs cpu, neuron:0"
    # the device's rows: the CPU run has none (n/a), the device run's are its report's
    device = run_summary(dev).device
    assert rows["device busy (busiest device)"]["a"] is None and rows["device busy (busiest device)"]["verdict"] == "n/a"
    steps = sum(v.steps for v in device.verdict)
    assert steps and rows["device busy (busiest device)"]["b"] == pytest.approx(
        sum(v.busy_pct * v.steps for v in device.verdict) / steps)
    assert rows["host-device copies per step"]["b"] == pytest.approx(sum(c.bytes_per_step or 0 for c in device.copies))
    assert any("devices differ (cpu vs neuron)" in n for n in result["notes"])
