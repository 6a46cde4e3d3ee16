"""The eager op collector: C++ RecordFunction observer + module hooks, on real torch.

Run as a script for the overhead measurement (not a pass/fail test):
    python tests/test_eager_engine.py
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import torch

from neuron_prof.collectors._engine import load_engine
from neuron_prof.collectors.eager import EagerCollector, skip_prefixes
from neuron_prof.store.schema import TABLES

THIS_FILE = os.path.abspath(__file__)


class FakeRecorder:
    """Our own Recorder protocol (neuron_prof.recording.api), kept in memory with real interning."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {"": 0}
        self.stacks: dict[tuple, int] = {(): 0}
        self.tables: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.drops: dict[str, int] = defaultdict(int)
        self.failures: list[tuple[str, BaseException]] = []

    def intern(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings))

    def intern_stack(self, frames) -> int:
        key = tuple((str(f), str(fn), int(ln)) for f, fn, ln in frames)
        return self.stacks.setdefault(key, len(self.stacks))

    def append(self, table, columns) -> None:
        if isinstance(columns, np.ndarray):  # rows in the table's journal layout
            columns = {name: columns[name] for name in columns.dtype.names}
        lens = {len(v) for v in columns.values()}
        assert len(lens) == 1, f"ragged columns for {table}: {lens}"
        for k, v in columns.items():
            self.tables[table][k].append(np.asarray(v))

    def dropped(self, table, n) -> None:
        self.drops[table] += int(n)

    def failure(self, collector, exc) -> None:
        self.failures.append((collector, exc))

    def training_began(self, ts) -> None:
        self.first_call = ts

    # helpers
    def frame(self, table: str) -> pd.DataFrame:
        t = self.tables.get(table)
        if not t:
            return pd.DataFrame()
        return pd.DataFrame({k: np.concatenate(v) for k, v in t.items()})

    def ops(self) -> pd.DataFrame:
        df = self.frame("ops")
        if df.empty:
            return df
        strs = {v: k for k, v in self.strings.items()}
        stacks = {v: k for k, v in self.stacks.items()}
        for c in ("name", "module", "shapes", "dtypes", "devices"):
            df[c + "_s"] = df[c].map(strs)
        df["frames"] = df["stack"].map(stacks)
        return df


@pytest.fixture
def collector():
    rec = FakeRecorder()
    col = EagerCollector()
    col.install(rec)
    assert not rec.failures, rec.failures
    yield rec, col
    col.uninstall()


def record(col, rec, fn, keep=True):
    col.window(True)
    try:
        out = fn()
    finally:
        col.window(False)
    col.flush(rec, keep)
    return out


class MLP(torch.nn.Module):
    def __init__(self, width=64, out=8):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, out))

    def forward(self, x):
        return self.net(x)


def test_columns_and_dtypes(collector):
    rec, col = collector
    x = torch.randn(4, 4)
    record(col, rec, lambda: torch.mm(x, x))
    df = rec.frame("ops")
    assert list(df.columns) == TABLES["ops"].names
    assert df.dtypes["ts"] == np.int64 and df.dtypes["bwd"] == np.bool_ and df.dtypes["depth"] == np.int16
    assert df.dtypes["name"] == np.int32 and df.dtypes["seq"] == np.int64
    # ts is CLOCK_MONOTONIC ns: the same clock as time.monotonic_ns()
    t0 = time.monotonic_ns()
    record(col, rec, lambda: torch.mm(x, x))
    t1 = time.monotonic_ns()
    mm = rec.ops().query("name_s == 'aten::mm'")
    assert ((mm.ts >= t0) & (mm.ts + mm.dur <= t1)).sum() == 1
    assert (mm.dur > 0).all() and (mm.tid == threading.get_native_id()).all()


def test_mlp_modules_forward_and_backward(collector):
    rec, col = collector
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(8, 64)

    def step():
        model(x).sum().backward()

    record(col, rec, step)
    df = rec.ops()
    fwd, bwd = df[~df.bwd], df[df.bwd]
    for path in ("0", "2"):
        assert {"aten::linear", "aten::addmm"} <= set(fwd[fwd.module_s == path].name_s)
        assert "AddmmBackward0" in set(bwd[bwd.module_s == path].name_s)
        # ops nested in the backward node inherit its module
        assert "aten::mm" in set(bwd[bwd.module_s == path].name_s)
    assert "aten::relu" in set(fwd[fwd.module_s == "1"].name_s)
    assert "ReluBackward0" in set(bwd[bwd.module_s == "1"].name_s)
    # backward node <-> forward op by (fwd_tid, seq)
    addmm_f = fwd[(fwd.name_s == "aten::addmm") & (fwd.module_s == "2")].iloc[0]
    addmm_b = bwd[(bwd.name_s == "AddmmBackward0") & (bwd.module_s == "2")].iloc[0]
    assert addmm_b.seq == addmm_f.seq >= 0 and addmm_b.fwd_tid == addmm_f.tid
    assert addmm_b.frames == addmm_f.frames and addmm_f.frames
    # the outermost module is named by its class
    assert set(fwd[fwd.name_s == "aten::sum"].module_s) == {""}
    assert (bwd[bwd.name_s.str.startswith("autograd::engine::evaluate_function: Addmm")].module_s != "").all()


def test_nested_module_paths(collector):
    rec, col = collector
    model = MLP()
    record(col, rec, lambda: model(torch.randn(2, 64)))
    df = rec.ops()
    assert "net.0" in set(df[df.name_s == "aten::addmm"].module_s)
    assert "net.2" in set(df[df.name_s == "aten::addmm"].module_s)
    assert "net.1" in set(df[df.name_s == "aten::relu"].module_s)
    root = MLP()
    with torch.no_grad():
        record(col, rec, lambda: root.net[0](torch.randn(2, 64)))
    df = rec.ops()
    assert "Linear" in set(df.module_s)  # called on its own, a module is the outermost one


def test_item_line_is_the_line_that_executed(collector):
    rec, col = collector
    t = torch.randn(3, 3)

    def body():
        y = t.sum() * 2
        line = inspect.currentframe().f_lineno + 1
        v = y.item()
        return line, v

    line, _ = record(col, rec, body)
    df = rec.ops()
    lsd = df[df.name_s == "aten::_local_scalar_dense"]
    assert len(lsd) == 1
    frames = lsd.iloc[0].frames
    assert frames[0] == (THIS_FILE, "test_item_line_is_the_line_that_executed.<locals>.body", line)
    # the next frame out is record(), at the line that called fn()
    assert frames[1][0] == THIS_FILE and frames[1][1] == "record"
    # no torch / neuron_prof / stdlib frame in the stack
    for f, _, _ in frames:
        assert f == THIS_FILE or "site-packages/_pytest" in f or "site-packages/pluggy" in f, f


def test_shapes_dtypes_devices(collector):
    rec, col = collector
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)

    def body():
        with torch.no_grad():
            lin(x)
        torch.cat([x, x])
        x.to(device="cpu", dtype=torch.float64)

    record(col, rec, body)
    df = rec.ops()
    addmm = df[df.name_s == "aten::addmm"].iloc[0]
    assert addmm.shapes_s == "[[32], [8, 64], [64, 32]]"
    assert addmm.dtypes_s == "float32,float32,float32"
    assert addmm.devices_s == "cpu,cpu,cpu"
    cat = df[df.name_s == "aten::cat"].iloc[0]
    assert cat.shapes_s == "[[[8, 64], [8, 64]]]" and cat.dtypes_s == "float32"
    copy = df[df.name_s == "aten::_to_copy"].iloc[0]
    assert copy.shapes_s.startswith("[[8, 64]")
    # the device argument shows next to the tensor's device
    assert copy.devices_s.split(",")[0] == "cpu" and copy.devices_s.count("cpu") == 2
    assert (df.depth >= 0).all() and df[df.name_s == "aten::_to_copy"].iloc[0].depth >= 1


def test_record_function_ranges(collector):
    rec, col = collector
    x = torch.randn(4, 4)

    def body():
        with torch.profiler.record_function("my_range"):
            line = inspect.currentframe().f_lineno + 1
            torch.relu(x)
        return line

    line = record(col, rec, body)
    df = rec.ops()
    rng = df[df.name_s == "my_range"]
    assert len(rng) == 1
    relu = df[df.name_s == "aten::relu"].iloc[0]
    r = rng.iloc[0]
    assert r.ts <= relu.ts and relu.ts + relu.dur <= r.ts + r.dur and relu.depth == r.depth + 1
    # an op inside a range still gets its own source line
    assert relu.frames[0][2] == line
    assert not df.name_s.str.startswith("profiler::_record_function").any()


def test_other_thread_and_threads_table(collector):
    rec, col = collector
    x = torch.randn(4, 4)
    tids = []

    def worker():
        tids.append(threading.get_native_id())
        torch.sigmoid(x)

    def body():
        t = threading.Thread(target=worker, name="np-worker")
        t.start()
        t.join()

    record(col, rec, body)
    df = rec.ops()
    sig = df[df.name_s == "aten::sigmoid"]
    assert list(sig.tid) == tids
    threads = rec.frame("threads")
    names = {v: k for k, v in rec.strings.items()}
    assert names[int(threads[threads.tid == tids[0]].name.iloc[0])] == "np-worker"
    assert threads.tid.is_unique


def test_window_off_and_keep_false(collector):
    rec, col = collector
    x = torch.randn(4, 4)
    torch.tanh(x)  # window off: nothing recorded
    record(col, rec, lambda: torch.tanh(x), keep=False)  # warmup: discarded
    assert rec.frame("ops").empty
    record(col, rec, lambda: torch.tanh(x))
    assert list(rec.ops().name_s) == ["aten::tanh"]


def test_window_off_detaches_the_observer(collector):
    """Outside a window the RecordFunction callback is removed, not just idle: steps between
    windows (always-on's unsampled ones) pay nothing for it."""
    rec, col = collector
    assert not col.engine.stats()["registered"] and not col.engine.stats()["has_global_callbacks"]
    col.window(True)
    assert col.engine.stats()["registered"] and col.engine.stats()["has_global_callbacks"]
    col.window(False)
    assert not col.engine.stats()["registered"] and not col.engine.stats()["has_global_callbacks"]


def test_buffer_cap_drops_and_counts():
    rec = FakeRecorder()
    col = EagerCollector(max_buffered=10)
    col.install(rec)
    try:
        x = torch.randn(2, 2)
        record(col, rec, lambda: [torch.neg(x) for _ in range(50)])
        assert len(rec.frame("ops")) == 10
        assert rec.drops["ops"] == 40
        # the cap is per drain: after a flush there is room again
        record(col, rec, lambda: [torch.neg(x) for _ in range(5)])
        assert len(rec.frame("ops")) == 15 and rec.drops["ops"] == 40
    finally:
        col.uninstall()


def test_uninstall_leaves_nothing_behind():
    rec = FakeRecorder()
    col = EagerCollector()
    col.install(rec)
    col.window(True)
    engine = col.engine
    assert engine.stats()["registered"] and engine.stats()["has_global_callbacks"]
    col.uninstall()
    assert col.engine is None
    st = engine.stats()
    assert not st["registered"] and not st["has_global_callbacks"]
    hooks = torch.nn.modules.module
    assert not hooks._global_forward_pre_hooks and not hooks._global_forward_hooks
    torch.neg(torch.randn(2))
    assert len(engine.drain(rec.intern, rec.intern_stack)) == 0
    col.window(True)  # no-ops once uninstalled
    col.flush(rec, True)
    assert rec.frame("ops").empty


def test_install_failure_is_reported_not_raised(monkeypatch):
    import neuron_prof.collectors._engine as eng

    def broken():
        raise RuntimeError("compiler missing")

    monkeypatch.setattr(eng, "load_engine", broken)
    rec = FakeRecorder()
    col = EagerCollector()
    col.install(rec)
    assert rec.failures and rec.failures[0][0] == "eager"
    col.window(True)
    col.flush(rec, True)
    col.uninstall()
    assert rec.frame("ops").empty


def test_forked_child_does_not_record(collector):
    rec, col = collector
    r, w = os.pipe()
    col.window(True)
    pid = os.fork()
    if pid == 0:  # child
        try:
            torch.neg(torch.randn(3))
            n = len(load_engine().drain(rec.intern, rec.intern_stack))
            os.write(w, str(n).encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    col.window(False)
    assert os.read(r, 100) == b"0"
    os.close(r)
    assert status == 0


def test_torch_compile_still_compiles(collector):
    rec, col = collector
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = MLP(width=16, out=4)
    compiled = torch.compile(model, backend="inductor")
    x = torch.randn(4, 16)

    def body():
        y = compiled(x)
        y.sum().backward()
        return compiled(x)

    out = record(col, rec, body)
    torch.testing.assert_close(out, model(x))
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] > 0
    df = rec.ops()
    assert len(df) > 0
    assert not df.module_s.str.contains("_orig_mod").any()
    torch._dynamo.reset()


def test_skip_prefixes_cover_torch_and_stdlib():
    pre = skip_prefixes()
    torch_dir = os.path.join(os.path.dirname(torch.__file__), "")
    assert torch_dir in pre
    assert any(p.endswith(os.path.join("threading.py")) for p in pre)
    assert not any(p.rstrip(os.sep).endswith("site-packages") for p in pre)
    assert "<frozen" in pre
    assert not any(THIS_FILE.startswith(p) for p in pre)


# ---------------------------------------------------------------- overhead (script only)
def _bench(n_iter=300, rounds=7):
    """Per-op overhead on a 64-wide MLP fwd+bwd loop; configurations interleaved, best of rounds."""
    import torch.profiler as tp

    from neuron_prof.collectors.modules import ModuleTracker

    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(8, 64)

    def loop(n):
        for _ in range(n):
            model(x).sum().backward()

    rec = FakeRecorder()
    col = EagerCollector(max_buffered=50_000_000)
    t0 = time.perf_counter()
    col.install(rec)
    install_s = time.perf_counter() - t0
    eng = col.engine
    col.window(True)
    loop(10)
    col.window(False)
    col.flush(rec, True)
    ops_per_iter = len(rec.frame("ops")) / 10

    def run(cfg):
        if cfg == "profiler":
            with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                            profile_memory=True):
                t0 = time.perf_counter()
                loop(n_iter)
                return time.perf_counter() - t0  # capture only: excludes profiler post-processing
        if cfg == "observer only":  # C++ observer on, module hooks removed
            col.tracker.uninstall()
        col.window(cfg in ("eager on", "observer only"))
        t0 = time.perf_counter()
        loop(n_iter)
        dt = time.perf_counter() - t0
        col.window(False)
        if cfg == "observer only":
            col.tracker.install()
        return dt

    cfgs = ["baseline", "installed, window off", "observer only", "eager on", "profiler"]
    best = {c: float("inf") for c in cfgs}
    # baseline: nothing installed at all
    for r in range(rounds):
        for c in cfgs:
            if c == "baseline":
                col.tracker.uninstall()
                t0 = time.perf_counter()
                loop(n_iter)
                best[c] = min(best[c], time.perf_counter() - t0)
                col.tracker.install()
            else:
                best[c] = min(best[c], run(c))
            eng.drain(rec.intern, rec.intern_stack)
    col.uninstall()
    base = best["baseline"] / n_iter
    print(f"install (build/load + start): {install_s * 1e3:.0f} ms")
    print(f"ops per iteration (fwd+bwd, 4x Linear 64): {ops_per_iter:.0f}")
    for c in cfgs:
        per = best[c] / n_iter
        print(f"{c:24s} {per * 1e6:8.1f} us/iter  (+{(per - base) / ops_per_iter * 1e9:6.0f} ns/op)")
    print("profiler = torch.profiler(record_shapes, with_stack, profile_memory), capture only")


def _bench_drain(n=1_000_000):
    rec = FakeRecorder()
    col = EagerCollector(max_buffered=n + 10)
    col.install(rec)
    x = torch.zeros(())
    col.window(True)
    t0 = time.perf_counter()
    torch.ops.aten.neg.default
    for _ in range(n // 4):
        torch.neg(x); torch.neg(x); torch.neg(x); torch.neg(x)
    rec_s = time.perf_counter() - t0
    col.window(False)
    t0 = time.perf_counter()
    batch = col.engine.drain(rec.intern, rec.intern_stack)
    d = time.perf_counter() - t0
    col.uninstall()
    print(f"drain of {len(batch)} events as journal rows with the recorder's ids: {d * 1e3:.0f} ms; "
          f"recording them took {rec_s:.1f} s")


if __name__ == "__main__":
    torch.set_num_threads(1)
    _bench(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
    _bench_drain()
