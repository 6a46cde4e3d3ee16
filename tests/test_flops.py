"""FLOPs, MFU and the roofline (``neuron_prof.analysis.flops``) on real captures: a tiny Hugging
Face GPT-2 and the demo transformer trained under capture count, per steady step, exactly the
FLOPs ``torch.utils.flop_counter.FlopCounterMode`` counts for one identical training step run
outside the capture; ops whose FLOPs the capture cannot give are named, never counted as 0; MFU is
the run's own FLOPs over its own step time over the given peak; the Ops page draws the roofline."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import neuron_prof
from conftest import cli, plotly_array, viewer_page
from neuron_prof.analysis import flops
from neuron_prof.analysis.run_analysis import analyze
from neuron_prof.reports.summary.build import peak_for, summarize, with_peak
from neuron_prof.reports.summary.sections import Peak
from neuron_prof.reports.stored import load_summary

GPT2_STEPS, GPT2_BATCH, GPT2_SEQ = 4, 4, 32


def flop_counter(step) -> dict[str, int]:
    """What FlopCounterMode counts for one call of ``step`` (forward and backward), by op name as
    the capture names ops (``aten::mm``)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return {k._qualified_op_name: v for k, v in counter.get_flop_counts().get("Global", {}).items()}


def efficiency(run_dir, top: int = 10):
    return summarize(neuron_prof.load(run_dir), top).efficiency


def counted_by_name(e) -> dict[str, float]:
    return {x.name: x.flops_per_step for x in e.ops}


# --- a Hugging Face GPT-2, built from a config (nothing downloaded) ------------------------------

def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=128)
    return transformers.GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 trained with AdamW on random tokens, every step captured (step 0 warm-up,
    the rest steady), and what FlopCounterMode counts for one more identical step, uncaptured."""
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (GPT2_BATCH, GPT2_SEQ), generator=torch.Generator().manual_seed(1))
    run_dir = tmp_path_factory.mktemp("flops") / "gpt2"
    with neuron_prof.profile(run_dir) as prof:
        for _ in range(GPT2_STEPS):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return run_dir, flop_counter(lambda: model(input_ids=ids, labels=ids).loss.backward())


def test_gpt2_flops_per_step_are_flop_counter_modes(gpt2):
    run_dir, counted = gpt2
    run = neuron_prof.load(run_dir)
    e = efficiency(run_dir)
    total = sum(counted.values())
    assert total > 0 and e.basis == "steady" and e.basis_steps == GPT2_STEPS - 1
    assert [(s.step, s.flops) for s in e.steps] == [(step, total) for step in range(1, GPT2_STEPS)]
    assert counted_by_name(e) == pytest.approx(counted)  # per op name too: mm, addmm (Conv1D), bmm (attention)
    assert e.unknown == [] and e.ranks[0].flops_per_step == total
    # achieved FLOP/s: each step's FLOPs over that step's own wall time
    dur = run.steps.set_index("step")["dur"]
    for s in e.steps:
        assert s.step_ms == pytest.approx(dur[s.step] / 1e6)
        assert s.tflops == pytest.approx(total / (dur[s.step] / 1e9) / 1e12)


# --- the demo transformer ---------------------------------------------------------------------

def _demo_step():
    """One step of ``examples/train_transformer.train``'s model and batch, forward and backward."""
    from neuron_prof.examples.train_transformer import TinyTransformer
    torch.manual_seed(0)
    model = TinyTransformer(vocab=256)
    data = torch.randint(0, 256, (8, 33))
    return lambda: F.cross_entropy(model(data[:, :-1]).reshape(-1, 256), data[:, 1:].reshape(-1)).backward()


def test_demo_transformer_flops_per_step_are_flop_counter_modes(demo_run):
    counted = flop_counter(_demo_step())
    e = efficiency(demo_run)
    assert e.basis_steps == 3 and [s.flops for s in e.steps] == [sum(counted.values())] * 3
    assert counted_by_name(e) == pytest.approx(counted)
    # the attention runs in aten::_scaled_dot_product_flash_attention_for_cpu (and its backward),
    # which the registry has no formula for: FlopCounterMode counts nothing for them, and the
    # report names them, two a step each (two layers)
    left_out = {u.name: u for u in e.unknown}
    assert set(left_out) == {"aten::_scaled_dot_product_flash_attention_for_cpu",
                             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
    assert not set(left_out) & set(counted)
    assert all(u.calls_per_step == 2 and u.reason == flops.NOT_IN_REGISTRY for u in left_out.values())
    assert e.ranks[0].uncounted_per_step == 4 and e.ranks[0].unknown_per_step == 0


# --- what the capture cannot give --------------------------------------------------------------

def test_convolution_flops_are_unknown_by_name_never_zero(tmp_path):
    """The capture records no non-tensor argument: a convolution's FLOPs need ``transposed`` (and
    its backward's, ``output_mask``), so both are named as unknown; the linear layer's FLOPs are
    still FlopCounterMode's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 3, 8, 8)
    with neuron_prof.profile(tmp_path / "conv") as prof:
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    counted = flop_counter(lambda: model(x).square().mean().backward())
    assert counted["aten::convolution"] > 0 and counted["aten::convolution_backward"] > 0  # not zero FLOPs
    e = efficiency(tmp_path / "conv")
    reasons = {u.name: u.reason for u in e.unknown}
    assert set(reasons) == {"aten::convolution", "aten::convolution_backward"}
    assert "'transposed'" in reasons["aten::convolution"] and "'output_mask'" in reasons["aten::convolution_backward"]
    assert "not recorded" in reasons["aten::convolution"]
    assert e.ranks[0].unknown_per_step == 2
    linear = {k: v for k, v in counted.items() if "convolution" not in k}
    assert counted_by_name(e) == pytest.approx(linear)
    assert [s.flops for s in e.steps] == [sum(linear.values())] * 2


def _ops(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """Top-level ops (name, shapes, dtypes) of one thread, as ``run.ops`` holds them."""
    names, shapes, dtypes = zip(*rows)
    n = len(rows)
    return pd.DataFrame({"rank": np.zeros(n, np.int32), "step": np.zeros(n, np.int64), "tid": np.ones(n, np.int64),
                         "ts": np.arange(n, dtype=np.int64) * 10, "dur": np.full(n, 5, np.int64),
                         "depth": np.zeros(n, np.int16), "name": pd.Categorical(names),
                         "shapes": pd.Categorical(shapes), "dtypes": pd.Categorical(dtypes)})


def test_recorded_shapes_no_formula_takes_are_unknown_never_an_error():
    """A run is untrusted input: symbolic dims, shapes the formula rejects, text that is not a
    shape list, dtypes that are not torch's, nesting deeper than JSON parses: each an unknown
    with its reason; a sound call is the registry's formula over its shapes."""
    ops = _ops([("aten::mm", "[[3, 4], [4, 5]]", "float32,float32"),
                ("aten::mm", "[[?, 4], [4, 5]]", "float32,float32"),
                ("aten::mm", "[[3, 4], [6, 5]]", "float32,float32"),
                ("aten::mm", "[[3, 4], [4, 5]", "float32,float32"),
                ("aten::mm", "[[3, 4], [4, 5]]", "float32"),
                ("aten::mm", "[[3, 4], [4, 5]]", "float32,no_such_dtype"),
                ("aten::mm", "[" * 100_000 + "]" * 100_000, "float32"),
                ("aten::mm", f"[[{10**30}, 4], [4, 5]]", "float32,float32"),
                ("aten::mm", f"[[{2**40}, {2**40}], [{2**40}, 4]]", "float32,float32"),
                ("aten::mm", f"[[{2**22}, {2**22}], [{2**22}, {2**22}]]", "float32,float32"),
                ("aten::bmm", "[[2, 3, 4], [2, 4, 5]]", "bfloat16,bfloat16")])
    f = flops.op_flops(ops, np.full(len(ops), -1))
    assert f.kind.tolist() == [flops.COUNTED] + [flops.UNKNOWN] * 9 + [flops.COUNTED]
    assert f.flops[0] == flop_registry[torch.ops.aten.mm]((3, 4), (4, 5))
    assert f.flops[10] == flop_registry[torch.ops.aten.bmm]((2, 3, 4), (2, 4, 5))
    assert f.bytes[0] == (3 * 4 + 4 * 5 + 3 * 5) * 4  # inputs read, output written
    assert f.bytes[10] == (24 + 40 + 30) * 2  # bf16
    reasons = list(np.asarray(f.reason)[1:10])
    assert all(reasons) and "not concrete" in reasons[0] and "AssertionError" in reasons[1]
    assert "gives" in reasons[-1]  # 2^67 FLOPs in one call: a damaged shape, never summed into a step
    assert flops.unknown_ops(ops, f, np.ones(len(ops), bool), 1)["calls_per_step"].sum() == 9


# --- MFU against a given peak, and where peaks come from ----------------------------------------

def test_mfu_is_flops_per_step_over_step_time_over_the_given_peak(demo_run):
    res = cli("report", demo_run, "--json", "--peak-tflops", "2", "--peak-gbps", "40")
    assert res.returncode == 0, res.stderr
    e = json.loads(res.stdout)["efficiency"]
    assert e["peak"] == {"tflops": 2, "gbps": 40, "source": "given"}
    dur = neuron_prof.load(demo_run).steps.set_index("step")["dur"]
    for s in e["steps"]:  # the run's own step time, its own FLOPs
        assert s["step_ms"] == pytest.approx(dur[s["step"]] / 1e6)
        assert s["mfu_pct"] == pytest.approx(100 * s["flops"] / (s["step_ms"] / 1e3) / 2e12)
    (rank,) = e["ranks"]
    assert rank["step_ms"] == pytest.approx(np.mean([s["step_ms"] for s in e["steps"]]))
    assert rank["mfu_pct"] == pytest.approx(100 * rank["flops_per_step"] / (rank["step_ms"] / 1e3) / 2e12)
    ridge = 2e12 / 40e9
    for op in e["ops"]:  # each op under the roofline of the two peaks
        assert op["tflops"] == pytest.approx(op["flops_per_step"] / (op["ms_per_step"] / 1e3) / 1e12)
        assert op["bound"] == ("compute" if op["intensity"] >= ridge else "memory")
        roof = min(2e12, op["intensity"] * 40e9)
        assert op["roof_pct"] == pytest.approx(100 * op["tflops"] * 1e12 / roof)
    # the peak is the reader's: the summary stored in the run has none
    assert load_summary(neuron_prof.load(demo_run)).efficiency.peak.tflops is None
    bad = cli("report", demo_run, "--peak-tflops", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--peak-tflops" in bad.stderr


def test_peaks_come_from_the_flags_the_device_table_or_this_cpu(demo_run):
    summary = summarize(neuron_prof.load(demo_run))
    assert summary.efficiency.precision == "fp32" and summary.run.device == "cpu"
    trn2 = flops.DEVICE_PEAKS["trainium2"]
    table = peak_for(summary, device="trainium2")
    assert (table.tflops, table.gbps) == (trn2.fp32_tflops, trn2.gbps) and trn2.source in table.source
    mixed = peak_for(summary, tflops=100.0, device="trainium2")
    assert (mixed.tflops, mixed.gbps) == (100.0, trn2.gbps) and mixed.source.startswith("TFLOP/s: given; GB/s: ")
    core = peak_for(summary, device="trainium2-core", calibrate=False)  # no per-core bandwidth is published
    assert core.tflops == flops.DEVICE_PEAKS["trainium2-core"].fp32_tflops and core.gbps is None
    measured = peak_for(summary, calibrate=True)  # a CPU run, asked to: this machine's, measured now
    assert measured.tflops > 0 and measured.gbps > 0 and measured.source.startswith("measured on this machine")
    unknown = peak_for(summary)  # not asked: a measurement would make two reports of one run differ
    assert (unknown.tflops, unknown.gbps, unknown.source) == (None, None, "none known")
    off_cpu = dataclasses.replace(summary, run=dataclasses.replace(summary.run, device="neuron"))
    assert peak_for(off_cpu, calibrate=True).tflops is None  # another device is never measured on this CPU
    e = with_peak(summary, unknown).efficiency
    assert e.ranks[0].mfu_pct is None and all(op.bound is None for op in e.ops)
    assert e.ranks[0].tflops > 0  # FLOP/s without a peak


# --- the Ops page's roofline ------------------------------------------------------------------

def _traces(at) -> list[dict]:
    return [t for p in at.get("plotly_chart") for t in json.loads(p.proto.spec)["data"] if t["type"] == "scatter"]


def _layout(at) -> dict:
    return next(json.loads(p.proto.spec)["layout"] for p in at.get("plotly_chart")
                if any(t["type"] == "scatter" for t in json.loads(p.proto.spec)["data"]))


def test_ops_page_draws_the_roofline(demo_run, monkeypatch):
    at = viewer_page(monkeypatch, demo_run, "ops", title="Ops")
    assert "FLOPs, MFU and roofline" in [s.value for s in at.subheader]
    assert [t["name"] for t in _traces(at)] == ["ops"]  # no peak known: the points, no roof
    at.button(key="ops_calibrate").click().run()  # a CPU run: its peaks measured here, as report --calibrate
    assert at.number_input(key="ops_peak_tflops").value > 0 and at.number_input(key="ops_peak_gbps").value > 0
    assert [t["name"] for t in _traces(at)] == ["ops", "roof"]
    assert any("measured on this machine" in c.value for c in at.caption)
    at.number_input(key="ops_peak_tflops").set_value(2.0).run()
    at.number_input(key="ops_peak_gbps").set_value(40.0).run()
    assert not at.exception
    e = with_peak(summarize(neuron_prof.load(demo_run)), Peak(tflops=2.0, gbps=40.0, source="")).efficiency
    points, roof = _traces(at)
    assert points["name"] == "ops" and points["mode"] == "markers+text"
    assert list(points["text"]) == [op.name for op in e.ops]  # one point per op name
    assert plotly_array(points["x"]).tolist() == pytest.approx([op.intensity for op in e.ops])
    assert plotly_array(points["y"]).tolist() == pytest.approx([op.tflops * 1e12 for op in e.ops])
    layout = _layout(at)
    assert layout["xaxis"]["type"] == layout["yaxis"]["type"] == "log"
    # the roof: bandwidth x intensity up to the ridge point, the peak FLOP/s after it
    x, y = plotly_array(roof["x"]), plotly_array(roof["y"])
    assert roof["name"] == "roof" and x[1] == pytest.approx(2e12 / 40e9) and y[1] == y[2] == pytest.approx(2e12)
    assert y[0] == pytest.approx(x[0] * 40e9)
    table = next(d.value for d in at.dataframe if "roof_pct" in d.value.columns)
    assert table["bound"].tolist() == [op.bound for op in e.ops]
    at.number_input(key="ops_peak_gbps").set_value(0.0).run()  # bandwidth unknown: the compute roof alone
    assert [t["name"] for t in _traces(at)] == ["ops", "roof (compute)"]


@pytest.mark.browser
def test_ops_page_roofline_in_the_browser(demo_run, tmp_path):
    """The Ops page on the demo run in headless Chromium: the roofline's points drawn, and after
    measuring this machine's peaks with the page's button, the roof over them; no error."""
    from test_viewer_browser import (CHROMIUM, LAUNCH_ARGS, _need, check_clean, main_text, new_page, page_url, serve,
                                     wait_rendered)
    _need(CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (Debian's build)")
    pw = pytest.importorskip("playwright.sync_api")
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        with serve(demo_run, demo_run, tmp_path) as v, new_page(browser) as pg:
            pg.goto(page_url(v, "ops"), wait_until="domcontentloaded")
            wait_rendered(pg)
            check_clean(pg, "/ops")
            assert "FLOPs, MFU and roofline" in main_text(pg)
            traces = pg.locator('[data-testid="stPlotlyChart"] .scatterlayer .trace')
            assert traces.count() == 1  # the ops' points; no peak known, no roof
            pg.get_by_role("button", name="measure this machine's CPU peaks").click()
            traces.nth(1).wait_for(state="attached")  # the roof, once the page has measured the peaks
            wait_rendered(pg)
            check_clean(pg, "/ops after measuring the peaks")
            assert traces.count() == 2 and "measured on this machine" in main_text(pg)
        browser.close()


# --- a device: kernels carry the FLOPs of the ops they ran -------------------------------------

@pytest.mark.multiprocess
def test_device_kernels_carry_the_flops_of_the_ops_they_ran(tmp_path):
    """The demo on the emulated neuron device: a host ``aten::addmm`` runs ``aten::addmm.out``
    inside it, which queues the device's work; FlopCounterMode would count the outer one only,
    and so does the run: its FLOPs per step are the CPU step's, and the kernels' add up to them."""
    out = tmp_path / "demo"
    res = cli("demo", "--device", "neuron", "--no-view", "-o", out, "--steps", "6")
    assert res.returncode == 0, res.stderr[-4000:]
    run = neuron_prof.load(out)
    counted = flop_counter(_demo_step())
    e = summarize(run, top=100).efficiency
    assert e.steps and all(s.flops == sum(counted.values()) for s in e.steps)
    assert counted_by_name(e) == pytest.approx(counted)
    ops = run.ops
    f = flops.op_flops(ops, analyze(run).op_parent)
    addmm = (ops["name"].astype(str) == "aten::addmm").to_numpy()
    nested = addmm & (analyze(run).op_parent >= 0)
    nested &= ops["name"].astype(str).to_numpy()[np.maximum(analyze(run).op_parent, 0)] == "aten::addmm"
    assert nested.any() and (f.kind[nested] == flops.NONE).all() and (f.kind[addmm & ~nested] == flops.COUNTED).all()
    assert e.kernels and sum(k.flops_per_step for k in e.kernels) == pytest.approx(e.ranks[0].flops_per_step)
    assert all(k.device == "neuron:0" and k.ms_per_step > 0 for k in e.kernels)
