"""The browser viewer's server: the Streamlit app (``neuron_prof.viewer``) in a process of its own, on
127.0.0.1 unless told otherwise (with a warning when the address is reachable from other machines).
``start`` returns once it answers (tests and benchmarks drive it); ``serve`` runs it until Ctrl+C
(``neuron-prof view``, the demo)."""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import webbrowser
from pathlib import Path

from neuron_prof.errors import NeuronProfError

__all__ = ["READY_TIMEOUT_S", "is_loopback", "exposure_warning", "free_port", "start", "serve"]

READY_TIMEOUT_S = 90


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, run_dir: Path) -> str | None:
    """The warning ``view`` prints when ``host`` is reachable from other machines, else None."""
    if is_loopback(host):
        return None
    return (f"neuron-prof: warning: --host {host} is not a loopback address: anyone who can reach this machine "
            f"on the network can open the viewer and see the run's contents ({run_dir}: its commands, file "
            "names, source lines, the trace and memory snapshots). Serve on 127.0.0.1 (the default) unless "
            "that is what you want, and never for a run from an untrusted source.")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _check_viewer_installed() -> None:
    try:
        import plotly  # noqa: F401
        import streamlit  # noqa: F401
    except ImportError as exc:
        raise NeuronProfError(f"the viewer needs {exc.name}: pip install 'neuron_prof[viewer]'") from None


def start(run_dir: Path, *, port: int = 0, host: str = "127.0.0.1", diff: Path | None = None,
          quiet: bool = False) -> tuple[subprocess.Popen, str]:
    """Start the server for ``run_dir`` and wait until it answers; returns (process, url)."""
    from neuron_prof.store.run import Run
    from neuron_prof.viewer import DIFF_ENV, RUN_ENV

    _check_viewer_installed()
    Run(run_dir)  # a missing or damaged run is a one-line error here, not a broken page
    if diff is not None:
        Run(diff)
    warning = exposure_warning(host, run_dir)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    import neuron_prof.viewer

    app = Path(neuron_prof.viewer.__file__).resolve().parent / "app.py"
    port = port or free_port(host)
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", host, "--server.port", str(port),
           "--server.headless", "true", "--server.enableXsrfProtection", "true", "--server.fileWatcherType", "none",
           "--browser.gatherUsageStats", "false", "--global.developmentMode", "false",
           "--client.toolbarMode", "minimal"]
    env = {**os.environ, RUN_ENV: str(run_dir.resolve())}
    if diff is not None:
        env[DIFF_ENV] = str(diff.resolve())
    log = tempfile.TemporaryFile() if quiet else None  # the server's own output, for an error
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    url = f"http://{host}:{port}"
    try:
        _wait_ready(proc, url, log)
    except BaseException:  # not serving (or told to stop while starting): the server goes too
        _end(proc)
        raise
    return proc, url


def _wait_ready(proc: subprocess.Popen, url: str, log) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = ""
            if log is not None:
                log.seek(0)
                lines = [ln.strip() for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
                last = f": {lines[-1]}" if lines else ""
            raise NeuronProfError(f"the viewer exited with code {proc.returncode} before serving {url}{last}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise NeuronProfError(f"the viewer did not answer on {url} within {READY_TIMEOUT_S} s")


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def serve(run_dir: Path, *, port: int = 0, host: str = "127.0.0.1", diff: Path | None = None,
          browser: bool = True) -> int:
    """Start, print the address, open the browser, and serve until Ctrl+C."""
    def stop(signum, frame):  # SIGTERM (kill, a supervisor), even while starting, ends the server with us
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    proc = None
    try:
        proc, url = start(run_dir, port=port, host=host, diff=diff, quiet=True)
        print(f"neuron_prof viewer for {run_dir}: {url}  (Ctrl+C to stop)", flush=True)
        if browser:
            webbrowser.open(url)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc is not None:
            _end(proc)
