"""Shared test helpers: the CLI as a real subprocess, and the strict trace check."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """Run ``neuron-prof ARGS`` as a user would, in a fresh process."""
    return subprocess.run([sys.executable, "-m", "neuron_prof", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def on_terminal(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, str]:
    """``neuron-prof ARGS`` with its stderr on a pseudo-terminal (not under CI): the process, and
    what the terminal showed."""
    leader, follower = os.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "neuron_prof", *map(str, args)], stdout=subprocess.PIPE,
                              stderr=follower, text=True, timeout=timeout,
                              env={k: v for k, v in os.environ.items() if k != "CI"})
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all of it read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    return done, shown.decode(errors="replace")


# the set-up of a script that trains a small MLP under neuron_prof (its own imports come first)
SMALL_MLP = '''
import torch, torch.nn as nn
import neuron_prof

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters())
x = torch.randn(16, 32)
'''


def write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def script_facts(script: Path, *args: object, timeout: float = 600) -> dict:
    """Runs ``script`` with ``args`` in a process of its own (a device renamed, a backend registered
    for the whole process) and returns the JSON object of facts it prints last; its stderr's end
    if it fails."""
    p = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the line containing ``marker`` (tests never hard-code line numbers)."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(f"{marker!r} not in {path}")


def check_trace(path: Path):
    """A Perfetto trace neuron_prof wrote, read by its strict reader (what `neuron-prof inspect`
    runs): no error (an unterminated slice is one), no warning, its end-of-trace packet present."""
    from neuron_prof.export.inspect import read_trace
    report = read_trace(path)
    assert report.ok, report.errors
    assert not report.warnings, report.warnings
    assert report.writer and report.writer.startswith("neuron_prof "), report.writer
    return report


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One captured transformer run (5 captured steps) shared by the read-only tests."""
    import neuron_prof
    from neuron_prof.examples.train_transformer import train
    run_dir = tmp_path_factory.mktemp("runs") / "transformer"
    with neuron_prof.profile(run_dir, schedule=neuron_prof.schedule(wait=1, warmup=1, active=3)) as prof:
        train(6, prof)
    return run_dir


DEVICE_STEPS = 8


@pytest.fixture(scope="session")
def device_run(tmp_path_factory) -> Path:
    """One capture of examples/device_defects.py on the emulated `neuron` device (``DEVICE_STEPS``
    steps, every one captured; even steps host-bound, odd ones device-bound), made in a process
    of its own: enabling the device renames PyTorch's PrivateUse1 backend for the process."""
    run_dir = tmp_path_factory.mktemp("device_runs") / "defects"
    done = subprocess.run([sys.executable, "-m", "neuron_prof.examples.device_defects", str(run_dir),
                           str(DEVICE_STEPS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


MEMORY_STEPS = 8


@pytest.fixture(scope="session")
def memory_runs(tmp_path_factory):
    """``memory_runs(mode)``: a captured run of examples/memory_leak.py (``leak``, ``clean`` or
    ``spike``; eager + memory collectors, every step captured), made once per session."""
    import neuron_prof
    from neuron_prof.examples import memory_leak
    root = tmp_path_factory.mktemp("memory_runs")
    made: dict[str, Path] = {}

    def get(mode: str) -> Path:
        if mode not in made:
            with neuron_prof.profile(root / mode, collectors=["eager", "memory"]) as prof:
                memory_leak.train(MEMORY_STEPS, mode, prof)
            made[mode] = root / mode
        return made[mode]

    return get


def viewer_page(monkeypatch, run_dir: Path, page: str, title: str | None = None, diff: Path | None = None):
    """The viewer's ``page`` (viewer/views/<page>.py) rendered by Streamlit's AppTest on
    ``run_dir`` (and ``diff`` as the Diff page's second run); asserts it raised nothing and, if
    given, that its title is ``title``."""
    from streamlit.testing.v1 import AppTest
    from neuron_prof.viewer import DIFF_ENV, RUN_ENV
    monkeypatch.setenv(RUN_ENV, str(run_dir))
    if diff is None:
        monkeypatch.delenv(DIFF_ENV, raising=False)
    else:
        monkeypatch.setenv(DIFF_ENV, str(diff))
    at = AppTest.from_file(str(REPO / "viewer" / "app.py"), default_timeout=120)
    at.run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    if title is not None:
        assert [t.value for t in at.title] == [title]
    return at


DDP_SCRIPT = """
import sys
import torch
import torch.distributed as dist
import neuron_prof

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with neuron_prof.profile(sys.argv[1]) as prof:
    for _ in range(int(sys.argv[2])):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
dist.destroy_process_group()
"""


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_run(tmp: Path, steps: int, world: int = 2) -> Path:
    """A DDP training run of ``world`` real gloo ranks on 127.0.0.1, captured into ``tmp/run``."""
    script = write_script(tmp / "ddp.py", DDP_SCRIPT)
    run_dir = tmp / "run"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(run_dir), str(steps)], cwd=tmp,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "RANK": str(r), "WORLD_SIZE": str(world)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return run_dir


GRAPH_BREAK_CLASSES = {  # examples/graph_breaks.py: marker of each break's line -> its reason class
    "BREAK:print": "print",
    "BREAK:item": "data-dependent branch",
    "BREAK:skipped": "skipped C function",
    "BREAK:generator": "generator next()",
    "BREAK:numpy": "numpy",
    "BREAK:graph_break": "explicit graph_break()",
}


def capture_graph_breaks(run_dir: Path, backend: str, collectors=None) -> Path:
    """examples/graph_breaks.py's ``step`` compiled with ``backend``, one captured step per entry
    of its SHAPES (a size and a dtype recompile), dynamo reset before and after."""
    import torch
    import neuron_prof
    from neuron_prof.examples import graph_breaks
    torch._dynamo.reset()
    compiled = torch.compile(graph_breaks.step, backend=backend)
    kwargs = {} if collectors is None else {"collectors": collectors}
    with neuron_prof.profile(run_dir, **kwargs) as prof:
        for rows, cols, dtype in graph_breaks.SHAPES:
            compiled(torch.randn(rows, cols, dtype=dtype))
            prof.step()
    torch._dynamo.reset()
    return run_dir


def shown(markdown: str) -> str:
    """The characters a viewer element whose value is Markdown shows: run text in it is
    backslash-escaped, with a word joiner where a bare URL would start (viewer/text.py), so tests
    undo both before comparing."""
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u2060", "")


def plotly_array(v) -> np.ndarray:
    """A plotly trace array as its figure JSON holds it: a list, or typed base64 (``bdata``, with
    a ``shape`` for 2-D arrays such as a heat map's z)."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(n) for n in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v)


def one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    """A CLI failure as the house rules want it: exit 2, one line naming ``needles``, no traceback."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_bounded(cmd: list[str], timeout: float, cwd: Path | None = None, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    """``cmd`` in a session of its own, waited for at most ``timeout`` seconds; then (and however
    the wait ends) its whole process group is killed, so gloo ranks and a launcher's children
    never outlive the test. A timeout is a test failure with the command's last stderr."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{cmd} ran past {timeout} s; stderr ends: {err[-3000:]}") from None
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stuck_collectives(run_dir: Path):
    """Rank 0's collectives that are in flight in the run as written so far (an empty frame while
    nothing is written yet): how a test sees that rank 0 has issued a collective its peer never
    joins, before it kills the ranks."""
    import pandas as pd
    import neuron_prof
    from neuron_prof.errors import NeuronProfError
    try:
        c = neuron_prof.load(run_dir).collectives
    except (NeuronProfError, FileNotFoundError):
        return pd.DataFrame({"seq": []})  # not written yet
    return c[(c["rank"] == 0) & (c["status"].astype(str) == "in_flight")]


def child_pid(pid: int, timeout: float = 60) -> int:
    """The one child process of ``pid`` (``record``'s command)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (started with ``start_new_session=True``)."""
    import signal
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def gloo_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of ``world`` on 127.0.0.1:``port``."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank)}
