"""The viewer's Device and Collectives pages on a 2-rank DDP job captured on the emulated `neuron`
device, every gradient in one bucket all-reduced after the backward (``ddp-one`` of
tests/neuron_dist_script.py): no other kernel of the device runs during an all-reduce, so all its
communication is exposed. The Device page's "Collectives on the device" part shows the report's
rows (both ranks, overlapped 0, exposed = communication), its per-step chart draws each step's
exposed part as the whole of its communication, the waits table names the all-reduces (issued on
autograd's device thread: the backward's line, or none) and the device-time straggler lines are
the report's; the Collectives page puts the device-time stragglers next to the host-time ones.
Streamlit's AppTest reads the pages' elements; one test opens both pages in a real Chromium."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

import neuron_prof  # noqa: E402
from neuron_prof.reports.findings import device_straggler_text  # noqa: E402
from neuron_prof.reports.summary.build import summarize  # noqa: E402

from conftest import line_of, plotly_array, shown, viewer_page  # noqa: E402
from test_neuron_distributed import SCRIPT, TIMEOUT_S, WORLD, launch  # noqa: E402
from test_viewer_browser import browser  # noqa: E402,F401  (the fixture: Debian's Chromium, headless)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(2 * TIMEOUT_S)]  # WORLD ranks of a DDP job

CHART_TITLE = "collectives per step"


@pytest.fixture(scope="module")
def ddp_one(tmp_path_factory) -> Path:
    """DDP on the device, one gradient bucket, captured: the run directory."""
    tmp = tmp_path_factory.mktemp("viewer_device_collectives")
    launch("ddp-one", "neuron", tmp / "out", tmp / "run")
    return tmp / "run"


@pytest.fixture(scope="module")
def device(ddp_one):
    """The report's Device section of the run."""
    return summarize(neuron_prof.load(ddp_one)).device


def _table(at, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _comm_chart(at) -> dict:
    (fig,) = [f for f in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
              if CHART_TITLE in str(f["layout"].get("title", {}).get("text", ""))]
    return fig


def _trace(fig: dict, name: str) -> dict:
    (t,) = [t for t in fig["data"] if t["name"] == name]
    return t


def _device_straggler_lines(device) -> list[str]:
    """The report's device-time straggler sentences (what the page must show, word for word)."""
    return [device_straggler_text(s) for s in device.stragglers if s.steps]


def test_the_device_page_shows_each_ranks_communication_all_exposed(ddp_one, device, monkeypatch):
    at = viewer_page(monkeypatch, ddp_one, "device", title="Device")
    heads = [h.value for h in at.subheader]
    assert "Collectives on the device" in heads
    assert heads.index("Collectives on the device") < heads.index("CPU fallbacks")
    table = _table(at, "communication ms/step")
    assert table["rank"].tolist() == list(range(WORLD)) == [c.rank for c in device.collectives]
    assert table["device"].tolist() == ["neuron:0"] * WORLD
    assert table["communication ms/step"].tolist() == [c.comm_ms for c in device.collectives]
    assert (table["communication ms/step"] > 0).all() and (table["kernels/step"] >= 1).all()
    # one bucket after the backward: nothing else ran during any all-reduce
    assert (table["overlapped ms/step"] == 0).all() and (table["overlapped %"] == 0).all()
    assert table["exposed ms/step"].tolist() == pytest.approx(table["communication ms/step"].tolist())


def test_the_per_step_chart_draws_every_step_exposed_for_the_rank_picked(ddp_one, device, monkeypatch):
    at = viewer_page(monkeypatch, ddp_one, "device", title="Device")
    warm = {(s.rank, s.step): s.warmup for s in device.steps}
    for rank in range(WORLD):
        if rank:
            at.selectbox(key="dev_rank").set_value(rank).run()
            assert not at.exception
        fig = _comm_chart(at)
        assert fig["layout"]["title"]["text"] == f"rank {rank} neuron:0: {CHART_TITLE}"
        rows = sorted((s for s in device.collective_steps if s.rank == rank), key=lambda s: s.step)
        assert {s.step for s in rows} >= {1, 2, 3, 4}  # every steady step all-reduced
        exposed, overlapped = _trace(fig, "exposed"), _trace(fig, "overlapped")
        for t in (exposed, overlapped):
            assert plotly_array(t["x"]).tolist() == [s.step for s in rows]
        # stacked: exposed at the bottom is the whole of each step's communication, overlapped is 0 on top of it
        assert plotly_array(exposed["y"]).tolist() == pytest.approx([s.comm_ms for s in rows])
        assert plotly_array(overlapped["y"]).tolist() == [0] * len(rows)
        assert plotly_array(overlapped["base"]).tolist() == plotly_array(exposed["y"]).tolist()
        assert (plotly_array(exposed["y"]) > 0).all()
        # warm-up steps (the rank's first) named on the axis, the others by their number
        axis = fig["layout"]["xaxis"]
        assert plotly_array(axis["tickvals"]).tolist() == [s.step for s in rows]
        assert list(axis["ticktext"]) == [f"{s.step} (warm-up)" if warm.get((rank, s.step)) else str(s.step)
                                          for s in rows]
        assert axis["ticktext"][0] == f"{rows[0].step} (warm-up)" and "warm-up" not in axis["ticktext"][-1]
        hover = list(exposed["customdata"])
        assert all("0.000 ms overlapped" in h for h in hover), hover


def test_the_waits_table_names_the_all_reduces_and_the_device_stragglers_are_the_reports(ddp_one, device,
                                                                                         monkeypatch):
    at = viewer_page(monkeypatch, ddp_one, "device", title="Device")
    waits = _table(at, "issued at")
    assert waits["collective"].tolist() == [w.op for w in device.collective_waits]
    assert waits["total ms"].tolist() == [w.total_ms for w in device.collective_waits]
    assert waits["stream"].tolist() == [w.stream for w in device.collective_waits]
    reduce = waits[waits["collective"] == "all_reduce"]
    assert set(reduce["rank"]) == set(range(WORLD))  # both ranks' streams waited for their all-reduces
    assert (reduce["waits"] >= 1).all()
    for column, field in (("issued at", "user_source"), ("waited at", "waited_at")):
        assert waits[column].tolist() == [getattr(w, field) for w in device.collective_waits]
    # DDP issues its all-reduces from autograd's device thread: the backward's line, or no Python line at all
    backward = f"neuron_dist_script.py:{line_of(SCRIPT, '# BACKWARD-LINE')}"
    assert all(x.endswith(backward) for x in reduce["issued at"]), set(reduce["issued at"])
    assert (waits["group"] == "0").all()
    said = [shown(m.value) for m in at.markdown if "reached collectives last on the device" in shown(m.value)]
    assert said == _device_straggler_lines(device)
    if device.stragglers and not said:
        assert any("no rank reached collectives last significantly" in shown(c.value) for c in at.caption)


def test_the_collectives_page_puts_device_time_stragglers_next_to_the_hosts(ddp_one, device, monkeypatch):
    at = viewer_page(monkeypatch, ddp_one, "collectives", title="Collectives")
    host, dev = [d.value for d in at.dataframe if "wait caused (ms)" in d.value.columns][:2]
    summary = summarize(neuron_prof.load(ddp_one))
    assert host["rank"].tolist() == [s.rank for s in summary.collectives.stragglers]
    assert sorted(dev["rank"]) == list(range(WORLD))
    assert dev["rank"].tolist() == [s.rank for s in device.stragglers]
    want = np.array([s.wait_caused_ns for s in device.stragglers]) / 1e6
    assert dev["wait caused (ms)"].to_numpy() == pytest.approx(want)
    assert any("On device time" in shown(m.value) for m in at.markdown)
    assert any("Collectives on the device" in shown(c.value) for c in at.caption)
    assert any(link.label == "see Device" for link in at.get("page_link"))


@pytest.mark.browser
def test_both_pages_in_a_real_browser(ddp_one, browser, tmp_path):
    """``neuron-prof view`` on the run, in headless Chromium: the Device page draws its
    collectives part (its table, chart and waits) without an error, and the Collectives page its
    device-time stragglers."""
    from test_viewer_browser import check_clean, main_text, new_page, page_url, serve, wait_rendered

    with serve(ddp_one, ddp_one, tmp_path) as v, new_page(browser) as pg:
        pg.goto(page_url(v, "device"), wait_until="domcontentloaded")
        wait_rendered(pg)
        check_clean(pg, "/device on a DDP run on the device")
        text = main_text(pg)
        for said in ("Collectives on the device", "Streams waiting for a collective"):
            assert said in text, f"{said!r} not on the page: {text}"
        assert pg.locator('[data-testid="stPlotlyChart"] .gtitle', has_text=CHART_TITLE).count() == 1
        pg.goto(page_url(v, "collectives"), wait_until="domcontentloaded")
        wait_rendered(pg)
        check_clean(pg, "/collectives on a DDP run on the device")
        assert "On device time" in main_text(pg)
