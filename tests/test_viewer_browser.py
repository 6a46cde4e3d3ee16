"""The viewer in a real browser: ``neuron-prof view`` as a user starts it, Debian's Chromium
(headless, driven by Playwright) on every page.

Needs /usr/bin/chromium (Debian's ``chromium``; ``.ci/run`` installs it) and the ``playwright``
package (``.[test]``); never ``playwright install``. Without them this file skips locally, with
the reason, and fails under ``CI=true``. Screenshots of every page are written to
``tests/artifacts/viewer/<page>.png`` (ignored by git).
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, cli

pytestmark = pytest.mark.browser  # a real Streamlit server driven by headless Chromium

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "tests" / "artifacts" / "viewer"
# (url_path, title) as viewer/app.py declares them; the first is the default page
PAGES = [("overview", "Overview"), ("timeline", "Timeline"), ("device", "Device"),
         ("compile", "Graph breaks / Compile"), ("memory", "Memory"), ("collectives", "Collectives"), ("ops", "Ops"),
         ("compare", "Compare")]
START_TIMEOUT_S = 120
RENDER_TIMEOUT_MS = 90_000
VIEWPORT = {"width": 1400, "height": 900}

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _need(ok: bool, why: str) -> None:
    """Skip locally with the reason; in CI a missing browser is a failure, never a silent skip."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{why} (CI=true: the browser test must run; .ci/run installs Debian's chromium)", pytrace=False)
    pytest.skip(why)


# --- the server, started as a user would ------------------------------------------------------

class Viewer:
    def __init__(self, proc: subprocess.Popen, url: str, run: Path, diff: Path, stderr: Path) -> None:
        self.proc, self.url, self.run, self.diff, self.stderr = proc, url, run, diff, stderr

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def server_pid(self) -> int:
        """The Streamlit process: the one child of ``neuron-prof view``."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert len(children) == 1, f"neuron-prof view has children {children}, expected one streamlit server"
        return int(children[0])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl+C as a user would (the CLI then stops its server), then the whole group for certain."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI ran in its own session: nothing outlives the test
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@contextlib.contextmanager
def serve(run: Path, diff: Path, workdir: Path):
    """``neuron-prof view RUN --diff DIFF --no-browser --port N`` as a subprocess; the URL it prints."""
    stderr = workdir / "stderr.txt"
    port = _free_port()
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "neuron_prof", "view", str(run), "--diff", str(diff),
                                 "--no-browser", "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    url, seen = None, []
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while url is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"neuron-prof view printed no URL within {START_TIMEOUT_S} s; stdout {seen}; "
                            f"stderr {stderr.read_text()[-2000:]}")
            if line is None:
                pytest.fail(f"neuron-prof view exited ({proc.wait()}) before printing a URL; stdout {seen}; "
                            f"stderr {stderr.read_text()[-2000:]}")
            seen.append(line)
            m = re.search(r"(http://[0-9.]+:(\d+))\s", line)
            if m:
                url = m.group(1)
        assert url == f"http://127.0.0.1:{port}", seen
        assert str(run) in seen[-1] and "Ctrl+C" in seen[-1], seen
        yield Viewer(proc, url, run, diff, stderr)
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def viewer(memory_runs, tmp_path_factory):
    """One server for the spike run (diffed against the clean run), shared by this module's tests."""
    with serve(memory_runs("spike"), memory_runs("clean"), tmp_path_factory.mktemp("viewer")) as v:
        yield v


@pytest.fixture(scope="module")
def browser():
    _need(CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (Debian's build)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "the playwright package is missing: ./setup.sh installs .[viewer,test]")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def new_page(browser):
    """A page in a context of its own, closed after: the viewport, the render timeout, and
    ``pg.errors``, the uncaught JavaScript errors of the app's frontend."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        pg = context.new_page()
        pg.set_default_timeout(RENDER_TIMEOUT_MS)
        pg.errors = []
        pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
        yield pg
    finally:
        context.close()


@pytest.fixture
def page(browser):
    with new_page(browser) as pg:
        yield pg


# --- rendering helpers ---------------------------------------------------------------------------

_SETTLED_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    const idle = app && app.getAttribute('data-test-script-state') === 'notRunning'
        && !document.querySelector('[data-testid="stSkeleton"], [data-testid="stStatusWidget"]')
        && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(e => e.querySelector('.main-svg'));
    if (!idle) { window.__npSettle = null; return false; }
    const sig = document.querySelectorAll('[data-testid]').length + ':' + document.querySelectorAll('.main-svg').length;
    const now = performance.now();
    if (!window.__npSettle || window.__npSettle.sig !== sig) { window.__npSettle = {sig, t: now}; return false; }
    return now - window.__npSettle.t > 1000;
}"""


def wait_rendered(pg) -> None:
    """Until the page is done: a title is up, the script run is over (Streamlit's app is
    ``notRunning``, no status widget), every Plotly chart has drawn, and nothing has been added
    for a second (charts and tables are lazy-loaded components that appear after the run ends)."""
    pg.locator('[data-testid="stMain"] h1').first.wait_for(state="visible")
    pg.wait_for_function(_SETTLED_JS, polling=100)


def check_clean(pg, name: str) -> None:
    """No exception box, no error box, no uncaught frontend error."""
    exc = pg.locator('[data-testid="stException"]')
    assert exc.count() == 0, f"{name}: exception on the page:\n" + "\n---\n".join(exc.all_inner_texts())
    err = pg.locator('[data-testid="stAlertContentError"]')
    assert err.count() == 0, f"{name}: error box on the page: {err.all_inner_texts()}"
    assert not pg.errors, f"{name}: uncaught JavaScript errors: {pg.errors}"
    lost = pg.locator('[data-testid="stDialog"]', has_text="Page not found")
    assert lost.count() == 0, f"{name}: Streamlit says {lost.first.inner_text()!r}"


def screenshot(pg, name: str) -> Path:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = pg.evaluate("() => Math.max(document.body.scrollHeight, "
                         "...[...document.querySelectorAll('[data-testid=\"stMain\"], [data-testid=\"stAppViewContainer\"]')]"
                         ".map(e => e.scrollHeight))")
    pg.set_viewport_size({"width": VIEWPORT["width"], "height": min(max(int(height), VIEWPORT["height"]), 12_000)})
    pg.wait_for_timeout(500)  # let charts re-layout
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    pg.set_viewport_size(VIEWPORT)
    return path


def main_text(pg) -> str:
    return " ".join(pg.locator('[data-testid="stMain"]').inner_text().split())


def page_url(viewer: Viewer, name: str) -> str:
    """The address the sidebar links to: the default (first) page is served at the root."""
    return f"{viewer.url}/" if name == PAGES[0][0] else f"{viewer.url}/{name}"


def check_navigation(pg, viewer: Viewer) -> None:
    """The sidebar is viewer/app.py's navigation (its titles, in its order, its addresses) and
    names the run."""
    links = pg.locator('[data-testid="stSidebarNav"] a')
    labels = [" ".join(t.split()) for t in links.all_inner_texts()]
    # each label ends with the title (a Material icon's ligature name comes first)
    assert len(labels) == len(PAGES) and all(lab.endswith(title) for lab, (_, title) in zip(labels, PAGES)), (
        f"sidebar shows {labels}; expected the titles of viewer/app.py {[t for _, t in PAGES]}. (Streamlit runs "
        "a folder named pages/ next to the entry script as a legacy multipage app, ignoring st.navigation, "
        "when a page's URL is the first request the server gets)")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs == [page_url(viewer, name) for name, _ in PAGES], hrefs
    sidebar = " ".join(pg.locator('[data-testid="stSidebarUserContent"]').inner_text().split())
    assert str(viewer.run) in sidebar, f"the sidebar does not name the run: {sidebar!r}"


# --- the tests -----------------------------------------------------------------------------------

def test_every_page_renders(page, viewer):
    """Each page by its address in a fresh load: its title, no exception; a screenshot of each."""
    for name, title in PAGES:
        page.goto(page_url(viewer, name), wait_until="domcontentloaded")
        wait_rendered(page)
        check_clean(page, f"/{name}")
        h1 = page.locator('[data-testid="stMain"] h1').first.inner_text().strip()
        # pages other than the overview are being written: their title is matched loosely
        assert name.lower() in h1.lower() or h1.lower() == title.lower(), f"/{name}: title {h1!r}, expected {title!r}"
        assert screenshot(page, name).stat().st_size > 10_000


def test_overview_content(page, viewer):
    """The overview shows the run's metrics, every finding of the report, and its charts."""
    import neuron_prof
    from conftest import MEMORY_STEPS
    from neuron_prof.reports.findings import findings
    from neuron_prof.reports.summary.build import summarize
    expected = findings(summarize(neuron_prof.load(viewer.run)))

    page.goto(page_url(viewer, "overview"), wait_until="domcontentloaded")
    wait_rendered(page)
    check_clean(page, "/")
    assert page.locator('[data-testid="stMain"] h1').first.inner_text().strip() == "Overview"

    metrics = {m.locator('[data-testid="stMetricLabel"]').inner_text().strip():
               m.locator('[data-testid="stMetricValue"]').inner_text().strip()
               for m in page.locator('[data-testid="stMetric"]').all()}
    assert metrics.get("device") == "cpu", metrics
    assert metrics.get("ranks") == "1", metrics
    assert metrics.get("steps") == str(MEMORY_STEPS), metrics
    assert metrics.get("steady steps") == str(MEMORY_STEPS - 1), metrics  # step 0 is warm-up
    assert re.fullmatch(r"\d+\.\d\d ms", metrics.get("median step", "")), metrics

    text = main_text(page)
    assert "Findings" in text and "Step time" in text and "Where a steady step's time goes" in text, text
    assert expected, "the spike run has findings (its memory peak at least)"
    for f in expected:
        assert " ".join(f.text.split()) in text, f"finding not shown: {f.text!r}\npage: {text}"
    # the spike: one 2 MiB allocation makes the peak, named with its op and source line
    assert re.search(r"peak memory [\d.]+ MiB .* reached with 2\.0 MiB from aten::\w+ at \S+\.py:\d+", text), text
    assert page.locator('[data-testid="stPlotlyChart"] .main-svg').count() >= 2
    assert page.locator('[data-testid="stDataFrame"]').count() >= 1


def test_sidebar_navigation(page, viewer):
    """The sidebar on the overview, and an overview finding's link leads to its page."""
    page.goto(page_url(viewer, "overview"), wait_until="domcontentloaded")
    wait_rendered(page)
    check_navigation(page, viewer)
    page.get_by_role("link", name="see Memory").first.click()
    page.wait_for_url(page_url(viewer, "memory"))
    page.locator('[data-testid="stMain"] h1', has_text=re.compile("memory", re.I)).first.wait_for(state="visible")
    wait_rendered(page)
    check_clean(page, "/memory (from the overview's link)")


def test_deep_link_as_first_request(browser, memory_runs, tmp_path):
    """A fresh server whose first visitor opens a page's address (a bookmark, a reload after a
    restart) serves the same app: the navigation of viewer/app.py, not a folder listing."""
    with serve(memory_runs("spike"), memory_runs("clean"), tmp_path) as v, new_page(browser) as pg:
        pg.goto(page_url(v, "memory"), wait_until="domcontentloaded")
        wait_rendered(pg)
        check_clean(pg, "/memory as the first request")
        check_navigation(pg, v)


def test_device_page_on_a_device_run(browser, device_run, memory_runs, tmp_path):
    """The shared server's run is a CPU run (its Device page says it has no device data), so the
    Device page is also opened on a capture on the emulated device: every section, its charts,
    no error; picking another step redraws the lanes for it."""
    with serve(device_run, memory_runs("clean"), tmp_path) as v, new_page(browser) as pg:
        pg.goto(page_url(v, "device"), wait_until="domcontentloaded")
        wait_rendered(pg)
        check_clean(pg, "/device on a device run")
        text = main_text(pg)
        for head in ("What bounds each step", "A step on the host and on the device",
                     "Where the host waits for the device", "Fusion", "CPU fallbacks"):
            assert head in text, f"{head!r} not on the page: {text}"
        assert "From the start of step 1 " in text and ">>" in text, text  # the lanes and the stall's source
        assert pg.locator('[data-testid="stPlotlyChart"] .main-svg').count() >= 2
        assert screenshot(pg, "device-run").stat().st_size > 10_000
        box = pg.get_by_role("combobox", name="step", exact=True)
        box.click()
        box.press("ArrowDown")  # opens the list (a click only focuses the combobox)
        pg.get_by_role("option", name=re.compile(r"^step 2 ")).click()
        pg.get_by_text(re.compile("From the start of step 2 ")).wait_for(state="visible")
        wait_rendered(pg)
        check_clean(pg, "/device after picking step 2")


def test_server_is_local_and_xsrf_protected(viewer):
    """Bound to 127.0.0.1 only; XSRF protection on (asked on its command line, and enforced)."""
    pid = viewer.server_pid()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert "streamlit" in argv, argv

    def opt(name: str) -> str:
        assert argv.count(name) == 1, f"{name} given {argv.count(name)} times: {argv}"
        return argv[argv.index(name) + 1]

    assert opt("--server.address") == "127.0.0.1", argv
    assert opt("--server.port") == str(viewer.port), argv
    assert opt("--server.enableXsrfProtection") == "true", argv

    # every listening socket on the port is on 127.0.0.1, none on 0.0.0.0 or IPv6
    listeners = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, port = local.rsplit(":", 1)
            if state == "0A" and int(port, 16) == viewer.port:
                listeners.append((table, addr))
    assert listeners == [("/proc/net/tcp", "0100007F")], f"listening on {listeners} (0100007F is 127.0.0.1)"

    with urllib.request.urlopen(f"{viewer.url}/_stcore/health", timeout=10) as r:
        assert r.status == 200
        cookies = r.headers.get_all("Set-Cookie") or []
    assert any(c.startswith("_streamlit_xsrf=") for c in cookies), f"no XSRF cookie from the server: {cookies}"
    # a state-changing request without the XSRF token is refused (with protection off it gets a 400)
    req = urllib.request.Request(f"{viewer.url}/_stcore/upload_file/session/file", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 403, (exc.value.code, exc.value.read()[:200])


def test_view_missing_run_is_one_line_error(tmp_path):
    missing = tmp_path / "no_such_run"
    r = cli("view", missing, "--no-browser", timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and lines[0].startswith("neuron-prof: error:"), r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not r.stdout.strip(), (r.stdout, r.stderr)
