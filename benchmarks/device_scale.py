"""An eager-queue training run with a million device kernels: written by the real writer, then
loaded, analysed (``neuron_prof.analysis.device``) and reported.

    .venv/bin/python benchmarks/device_scale.py [--steps 1000] [--kernels-per-step 1000] [--layers 16]
        [--reps 3] [--keep DIR] [--only NAME ...] [--profile] [--dump DIR] [--json OUT]

Generation (synthetic, as a capture writes it): one ``neuron_prof.store.writer.RankWriter`` (rank 0 of
1) and the session's interning (``neuron_prof.store.interner.Interner``: strings, frames, stacks); per
step the rows of ``ops``, ``device_enqueues``, ``queue_flushes``, ``device_kernels``,
``kernel_enqueues``, ``fallbacks`` and ``steps`` journaled with a commit, compacted every
COMPACT_EVERY steps (a capture compacts every 2 s; a step here lasts ~60-300 ms), closed with a
manifest. The job it describes, simulated op by op (one host timeline, one serial device):

- a ``--layers`` transformer on ``neuron:0`` trained with SGD and momentum. Per step: two input
  copies; per layer 13 forward ops (layer norms, the qkv/proj/fc1/fc2 ``aten::linear`` >
  ``aten::addmm``, two ``aten::matmul`` > ``aten::bmm``, div, softmax, gelu, residual adds) on the
  main thread, 23 backward ops (``autograd::engine::evaluate_function: XBackward0`` > ``XBackward0``
  > ``aten::mm``...) and 12 ``AccumulateGrad`` adds on the autograd thread, 36 optimizer ops (3
  per parameter) under ``Optimizer.step#SGD.step``; the loss (cross entropy); at 16 layers 1,351
  enqueued ops per step. Each is a real ``ops`` row (name, module, stack with its source line,
  shapes, dtypes, devices, seq, fwd_tid, bwd, depth 0-3; backward ops carry the forward op's
  module and stack as the eager collector gives them), enclosing the enqueue it made;
- host: an op every ~10-20 us (a leaf op 10-20 us, 1-3 us apart, its enqueue 4-9 us in); data
  loading 2-3 ms per step, and a 250 ms input stall every 10th step (steps 5, 15, ...): those
  steps are host-bound, the others device-bound;
- device: the queue runs the ops in order in ``--kernels-per-step`` kernels per step (fixed per
  position in the step, as a model's graph is: ~88% of kernels run one op, the rest fuse runs of
  2-16 ops; named ``addmm+gelu``-style), each 20-200 us on the device thread (its op costs: the
  matmuls 50-180 us, pointwise 20-40 us; fused: 0.6 x the sum, jittered), starting when its last op
  is queued and the device is free;
- flushes, with their waits: ``loss.item()`` after the forward (``aten::item`` >
  ``aten::_local_scalar_dense``, reason ``sync``: the host waits for the queue to drain), a
  ``size`` flush whenever QUEUE_CAP ops are queued (one per step here), and one CPU fallback per step
  in the backward (``aten::embedding_dense_backward``: a ``fallback`` flush, then the op on the CPU
  with 4 MiB copied to the host and 62.5 MiB back, ~10 ms).

Measurement, each in a fresh process, ``--reps`` times (median and range of wall seconds; peak
RSS of that child from ``os.wait4``):

1. ``load``: ``neuron_prof.load`` and the device tables (``device_enqueues``, ``queue_flushes``,
   ``kernel_enqueues``, ``device_kernels``, ``fallbacks``), each timed, and the other inputs the
   analyses need (``ops``, ``step_kinds``);
2. each analysis of ``neuron_prof.analysis.device`` alone (``ANALYSES``: its inputs read first,
   not counted), and all of them in one process one after another (``all``: the device analyses
   together, as the report runs them; ``--dump DIR`` writes each result there as a pickle, to
   compare two trees);
3. ``neuron_prof.reports.summary.build.summarize`` in full (with its Device section once the report has one),
   ``render_text`` and ``json.dumps``; and the CLI as a user runs it, ``neuron-prof report RUN
   --json``.

At the defaults (1,000 steps) the run has 2,312,000 ``ops``, 1,351,000 ``device_enqueues`` and
``kernel_enqueues``, 1,001,098 ``device_kernels`` (size flushes split a few fusion groups), 3,000
``queue_flushes``, 1,000 ``fallbacks`` and 1,000 ``steps`` (900 device-bound, 100 host-bound):
295 MB on disk, written in ~11 s.

Target (the device-analysis issue): the analyses of a run with 1M kernels in the report <= 10 s on
this machine. ``--profile`` adds cProfile's top functions of the in-process ``summarize``.
"""
from __future__ import annotations
from neuron_prof.analysis.run_analysis import analyze

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

T0 = 1_000_000_000_000
COMPACT_EVERY = 16
QUEUE_CAP = 256
"""The backend flushes (reason ``size``) when this many ops are queued and not yet run."""
STALL_EVERY, STALL_AT, STALL_MS = 10, 5, 250
TARGETS = {"analyses_s": 10.0}
H_TID, B_TID, D_TID = 4242, 4250, 4260  # main thread, autograd thread, device worker thread
MODEL, TRAIN, CWD = "/work/train/model.py", "/work/train/train.py", "/work/train"
DEVICE = "neuron:0"
FALLBACK_TO_HOST, FALLBACK_FROM_HOST = 4 << 20, 32000 * 512 * 4  # grad output; the embedding's grad
COPY_GBPS = 8.0
COST_US = {"addmm": 150, "mm": 150, "bmm": 50, "native_layer_norm": 35, "native_layer_norm_backward": 50,
           "_softmax": 40, "_softmax_backward_data": 45, "div": 20, "add": 20, "add_": 20, "mul_": 20,
           "gelu": 25, "gelu_backward": 40, "sum": 25, "copy_": 30, "index_select": 30, "_log_softmax": 60,
           "nll_loss_forward": 25, "nll_loss_backward": 25, "_log_softmax_backward_data": 60}
BIG = {"fc1": 180, "fc2": 180, "qkv": 150, "proj": 60}  # addmm/mm cost by layer
# fused group sizes (>1) and their weights: ~88% of kernels run one op
FUSED_SIZES, FUSED_WEIGHTS = [2, 3, 4, 6, 8, 16], [0.4, 0.25, 0.15, 0.1, 0.05, 0.05]


# ---------------------------------------------------------------------------------- the model

class Call:
    """One host call: parents (outermost first) around leaves; each leaf (name, device op or
    None) enqueues at most one op. ``special``: "item" (a sync read) or "fallback"."""

    def __init__(self, thread: str, chain: tuple[str, ...], leaves: list[tuple[str, str | None]], module: str,
                 stack: list[tuple[str, str, int]], bwd: bool, special: str | None = None, cost: str = "") -> None:
        self.tid = H_TID if thread == "main" else B_TID
        self.chain, self.leaves, self.module, self.stack, self.bwd = chain, leaves, module, stack, bwd
        self.special, self.cost = special, cost


def _stack(line: int, *outer: tuple[str, str, int]) -> list[tuple[str, str, int]]:
    return [(MODEL, "forward", line), *outer, (TRAIN, "train_step", 88), (TRAIN, "main", 120)]


def model_calls(layers: int) -> list[Call]:
    """One step's host calls, in order."""
    calls: list[Call] = []
    main = [(TRAIN, "train_step", 86), (TRAIN, "main", 120)]
    for _ in range(2):  # inputs and labels to the device
        calls.append(Call("main", ("aten::to", "aten::_to_copy"), [("aten::copy_", "copy_")], "", main, False))
    emb = _stack(75)
    calls.append(Call("main", ("aten::embedding",), [("aten::index_select", "index_select")], "model.emb", emb, False))
    fwd: list[tuple[Call, int]] = []  # (call, layer) of the layers, for the backward's attribution
    for k in range(layers):
        m = f"model.layers.{k}"
        blk = (MODEL, "forward", 80)  # Model.forward calling the block
        spec = [  # (chain, leaf, module suffix, line, cost key)
            (("aten::layer_norm",), ("aten::native_layer_norm", "native_layer_norm"), ".ln1", 30, ""),
            (("aten::linear",), ("aten::addmm", "addmm"), ".attn.qkv", 41, "qkv"),
            (("aten::matmul",), ("aten::bmm", "bmm"), ".attn", 44, ""),
            ((), ("aten::div", "div"), ".attn", 44, ""),
            (("aten::softmax",), ("aten::_softmax", "_softmax"), ".attn", 45, ""),
            (("aten::matmul",), ("aten::bmm", "bmm"), ".attn", 46, ""),
            (("aten::linear",), ("aten::addmm", "addmm"), ".attn.proj", 47, "proj"),
            ((), ("aten::add", "add"), "", 52, ""),
            (("aten::layer_norm",), ("aten::native_layer_norm", "native_layer_norm"), ".ln2", 53, ""),
            (("aten::linear",), ("aten::addmm", "addmm"), ".mlp.fc1", 60, "fc1"),
            ((), ("aten::gelu", "gelu"), ".mlp", 61, ""),
            (("aten::linear",), ("aten::addmm", "addmm"), ".mlp.fc2", 62, "fc2"),
            ((), ("aten::add", "add"), "", 63, ""),
        ]
        for chain, leaf, sub, line, cost in spec:
            c = Call("main", chain, [leaf], m + sub, _stack(line, blk), False, cost=cost)
            calls.append(c)
            fwd.append((c, k))
    loss = _stack(84)
    calls.append(Call("main", ("aten::cross_entropy",), [("aten::_log_softmax", "_log_softmax"),
                                                        ("aten::nll_loss_forward", "nll_loss_forward")],
                      "", loss, False))
    item = [(TRAIN, "train_step", 90), (TRAIN, "main", 120)]
    calls.append(Call("main", ("aten::item",), [("aten::_local_scalar_dense", None)], "", item, False, special="item"))
    # backward, on the autograd thread: each node carries its forward op's module and stack
    ev = "autograd::engine::evaluate_function: "
    calls.append(Call("bwd", (ev + "NllLossBackward0", "NllLossBackward0"),
                      [("aten::nll_loss_backward", "nll_loss_backward")], "", loss, True))
    calls.append(Call("bwd", (ev + "LogSoftmaxBackward0", "LogSoftmaxBackward0"),
                      [("aten::_log_softmax_backward_data", "_log_softmax_backward_data")], "", loss, True))
    bwd_of = {"aten::addmm": ("AddmmBackward0", [("aten::mm", "mm"), ("aten::mm", "mm"), ("aten::sum", "sum")]),
              "aten::bmm": ("BmmBackward0", [("aten::bmm", "bmm"), ("aten::bmm", "bmm")]),
              "aten::native_layer_norm": ("NativeLayerNormBackward0",
                                          [("aten::native_layer_norm_backward", "native_layer_norm_backward")]),
              "aten::_softmax": ("SoftmaxBackward0", [("aten::_softmax_backward_data", "_softmax_backward_data")]),
              "aten::div": ("DivBackward0", [("aten::div", "div")]),
              "aten::gelu": ("GeluBackward0", [("aten::gelu_backward", "gelu_backward")]),
              "aten::add": ("AddBackward0", [("aten::add", "add")])}
    params = []
    for c, k in reversed(fwd):
        node, leaves = bwd_of[c.leaves[0][0]]
        calls.append(Call("bwd", (ev + node, node), leaves, c.module, c.stack, True, cost=c.cost))
        if c.leaves[0][0] in ("aten::addmm", "aten::native_layer_norm"):  # weight and bias
            params += [(c.module, c.stack)] * 2
    for module, stack in params:
        calls.append(Call("bwd", (ev + "torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad"),
                          [("aten::add_", "add_")], module, stack, True))
    calls.append(Call("bwd", (ev + "EmbeddingBackward0", "EmbeddingBackward0", "aten::embedding_backward"),
                      [("aten::embedding_dense_backward", None)], "model.emb", emb, True, special="fallback"))
    opt = [(TRAIN, "train_step", 95), (TRAIN, "main", 120)]
    calls.append(Call("main", ("Optimizer.step#SGD.step",),
                      [leaf for _ in params for leaf in (("aten::mul_", "mul_"), ("aten::add_", "add_"),
                                                         ("aten::add_", "add_"))], "", opt, False))
    return calls


def fusion_plan(n_ops: int, n_kernels: int, seed: int = 7) -> np.ndarray:
    """Group sizes tiling one step's ``n_ops`` queued ops into ``n_kernels`` kernels (the same
    every step): one-op kernels, and runs of 2-16 at random places."""
    rng = np.random.default_rng(seed)
    sizes = np.ones(n_kernels, np.int64)
    extra = n_ops - n_kernels
    if extra < 0:
        raise SystemExit(f"{n_kernels} kernels per step need at least as many ops; the model has {n_ops}")
    while extra > 0:
        i = int(rng.integers(n_kernels))
        if sizes[i] != 1:
            continue
        add = min(int(rng.choice(FUSED_SIZES, p=FUSED_WEIGHTS)) - 1, extra)
        sizes[i] += add
        extra -= add
    return sizes


# ---------------------------------------------------------------------------------- writing

def generate(run_dir: Path, steps: int, kernels_per_step: int, layers: int, seed: int = 0) -> tuple[float, dict]:
    from neuron_prof.store.schema import SCHEMA_VERSION
    from neuron_prof.store.interner import Interner
    from neuron_prof.store.writer import RankWriter, update_run_meta

    t_start = time.perf_counter()
    calls = model_calls(layers)
    leaves = [(c, leaf) for c in calls for leaf in c.leaves]
    n_enq = sum(1 for _, (_, d) in leaves if d is not None)
    plan = fusion_plan(n_enq, kernels_per_step)
    # per queued op of a step: the planned size of the group it opens (0: inside a group)
    opens = np.zeros(n_enq, np.int64)
    opens[np.concatenate([[0], np.cumsum(plan)[:-1]])] = plan
    opens = opens.tolist()
    run_id = uuid.uuid4().hex
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "rank": 0, "world_size": 1, "pid": 10_000,
            "hostname": "trn-host-000", "device": DEVICE, "torch_version": "2.13.0+cpu",
            "python": sys.version.split()[0], "clock_offset_ns": 1_700_000_000_000_000_000 - T0, "start_ns": T0,
            "collectors": ["eager", "device"], "schedule": None, "max_buffered_events": 2_000_000,
            "max_events": 50_000_000, "max_bytes": 4 << 30, "stepless": False}
    writer = RankWriter(run_dir / "rank-00000", meta)
    update_run_meta(run_dir, run_id, {
        "schema_version": SCHEMA_VERSION, "neuron_prof_version": "bench", "run_id_scope": "command",
        "command": ["python", "train.py"], "cwd": CWD, "torch_version": "2.13.0+cpu", "device": DEVICE,
        "world_size": 1, "start_time_ns": 1_700_000_000_000_000_000, "hostname": "trn-host-000"}, replace=True)
    it = Interner()
    S = it.string
    dev_id, stream = S(DEVICE), 0
    reasons = {r: S(r) for r in ("sync", "size", "fallback")}
    writer.append("threads", {"tid": np.array([H_TID, B_TID, D_TID], np.int64),
                              "name": np.array([S("MainThread"), S("pt_autograd_0"), S("neuron-worker")], np.int32)})
    shapes = {"copy_": "[[8, 512], [8, 512]]", "index_select": "[[32000, 512], [], [4096]]",
              "addmm": "[[1536], [4096, 512], [512, 1536]]", "mm": "[[4096, 512], [512, 1536]]",
              "bmm": "[[64, 512, 64], [64, 64, 512]]"}
    dtypes_ = S("float,float")
    devices_ = S(f"{DEVICE},{DEVICE}")
    empty = S("")
    # per leaf of the step, its ids and costs (device op cost in ns)
    L = []
    for c, (name, devop) in leaves:
        cost = BIG[c.cost] if devop in ("addmm", "mm") and c.cost else COST_US.get(devop or "", 0)
        L.append((c, S(name), devop, S("aten::" + devop) if devop else 0, devop or "",
                  S(shapes.get(devop or "", "[[4096, 512], [4096, 512]]")), cost * 1000))
    call_ids = {id(c): (it.stack(c.stack), S(c.module), [S(p) for p in c.chain]) for c in calls}
    kname_ids: dict[str, int] = {}
    fb_op = S("aten::embedding_dense_backward")

    counters = {"dropped": {}, "written": {}, "cap_reached_at_step": None}
    written: dict[str, int] = {}
    eid = kid = 0
    kend: list[int] = []  # end of every kernel so far (the device is serial: increasing)
    kops: list[int] = []
    kp = done = 0  # kernels (and their ops) that have ended by the host's time
    enq_total = 0
    dev_free = T0
    h = T0
    seq = 0
    for s in range(steps):
        rng = np.random.default_rng(seed * 1_000_003 + s)
        n_leaf = len(L)
        gap = rng.integers(1_000, 3_000, n_leaf).tolist()
        off = rng.integers(4_000, 9_000, n_leaf).tolist()
        ldur = rng.integers(10_000, 20_000, n_leaf).tolist()
        jit = rng.uniform(0.97, 1.06, n_enq + 64).tolist()
        lgap = rng.integers(1_000, 3_000, n_enq + 64).tolist()
        ops = {k: [] for k in ("ts", "dur", "tid", "name", "module", "stack", "shapes", "seq", "fwd_tid", "bwd",
                               "depth")}
        enq = {k: [] for k in ("ts", "tid", "id", "op", "queue_depth", "host_op", "module", "stack", "bwd")}
        fl = {k: [] for k in ("ts", "dur", "tid", "reason", "ops", "host_op", "module", "stack", "bwd")}
        ker = {k: [] for k in ("ts", "dur", "id", "name", "n_ops")}
        links = {"kernel": [], "enqueue": []}
        fb = {k: [] for k in ("ts", "dur", "tid", "host_op", "module", "stack", "bwd")}
        step_ts = h
        h += int(rng.integers(2_000_000, 3_000_000))  # data loading
        if s % STALL_EVERY == STALL_AT:
            h += STALL_MS * 1_000_000
        pending: list[int] = []
        pend_cost = 0
        pend_names: list[str] = []
        pend_ts = 0
        remaining = 0
        q = 0  # queued op index within the step
        nk = 0

        def done_by(t: int) -> int:
            nonlocal kp, done
            while kp < len(kend) and kend[kp] <= t:
                done += kops[kp]
                kp += 1
            return done

        def close() -> None:
            nonlocal pending, pend_cost, pend_names, dev_free, kid, nk
            n = len(pending)
            if not n:
                return
            cost = pend_cost * (0.6 if n > 1 else 1.0) * jit[nk % len(jit)]
            dur = int(min(max(cost, 20_000), 200_000))
            start = max(dev_free + lgap[nk % len(lgap)], pend_ts + 5_000)
            dev_free = start + dur
            kid += 1
            nk += 1
            name = "+".join(pend_names)
            sid = kname_ids.get(name)
            if sid is None:
                sid = kname_ids[name] = S(name)
            ker["ts"].append(start), ker["dur"].append(dur), ker["id"].append(kid), ker["name"].append(sid)
            ker["n_ops"].append(n)
            links["kernel"] += [kid] * n
            links["enqueue"] += pending
            kend.append(dev_free), kops.append(n)
            pending, pend_cost, pend_names = [], 0, []

        def flush(reason: str, t: int, c: Call, host_op: int, stack: int, module: int) -> int:
            close()
            queued = enq_total - done_by(t)
            end = max(dev_free, t) + 1_000
            fl["ts"].append(t), fl["dur"].append(end - t), fl["tid"].append(c.tid), fl["reason"].append(reasons[reason])
            fl["ops"].append(queued), fl["host_op"].append(host_op), fl["module"].append(module)
            fl["stack"].append(stack), fl["bwd"].append(c.bwd)
            return end

        li = 0
        for c in calls:
            stack, module, chain = call_ids[id(c)]
            depth0 = len(chain)
            call_ts = h
            h += depth0 * 1_000
            for _ in c.leaves:
                _, name_id, devop, op_id, short, shape_id, cost = L[li]
                lt = h + gap[li]
                end = lt + ldur[li]
                if devop is not None:
                    ets = lt + off[li]
                    eid += 1
                    enq_total += 1
                    depth = enq_total - done_by(ets)
                    enq["ts"].append(ets), enq["tid"].append(c.tid), enq["id"].append(eid), enq["op"].append(op_id)
                    enq["queue_depth"].append(depth), enq["host_op"].append(name_id), enq["module"].append(module)
                    enq["stack"].append(stack), enq["bwd"].append(c.bwd)
                    if opens[q]:
                        remaining = opens[q]
                    q += 1
                    pending.append(eid)
                    pend_cost += cost
                    pend_names.append(short)
                    pend_ts = ets
                    remaining -= 1
                    if remaining == 0:
                        close()
                    if depth >= QUEUE_CAP:
                        end = flush("size", ets + 500, c, name_id, stack, module) + 2_000
                elif c.special == "item":
                    end = flush("sync", lt + 3_000, c, name_id, stack, module) + 4_000
                elif c.special == "fallback":
                    t = flush("fallback", lt + 3_000, c, name_id, stack, module) + 2_000
                    dur = int((FALLBACK_TO_HOST + FALLBACK_FROM_HOST) / COPY_GBPS) + int(rng.integers(1_500_000,
                                                                                                 2_500_000))
                    fb["ts"].append(t), fb["dur"].append(dur), fb["tid"].append(c.tid), fb["host_op"].append(name_id)
                    fb["module"].append(module), fb["stack"].append(stack), fb["bwd"].append(c.bwd)
                    end = t + dur + 3_000
                ops["ts"].append(lt), ops["dur"].append(end - lt), ops["tid"].append(c.tid)
                ops["name"].append(name_id), ops["module"].append(module), ops["stack"].append(stack)
                ops["shapes"].append(shape_id), ops["seq"].append(-1), ops["fwd_tid"].append(H_TID)
                ops["bwd"].append(c.bwd), ops["depth"].append(depth0)
                h = end
                li += 1
            for d, pid in enumerate(chain):  # the parents, outermost first
                seq += d == 0
                ops["ts"].append(call_ts + d * 1_000), ops["dur"].append(h + (depth0 - d) * 1_000 - call_ts - d * 1_000)
                ops["tid"].append(c.tid), ops["name"].append(pid), ops["module"].append(module)
                ops["stack"].append(stack), ops["shapes"].append(L[li - 1][5]), ops["seq"].append(seq if d == 0 else -1)
                ops["fwd_tid"].append(H_TID), ops["bwd"].append(c.bwd), ops["depth"].append(d)
            h += depth0 * 1_000 + 1_000
        close()
        h += 20_000  # prof.step()
        n_ops = len(ops["ts"])
        o = {k: np.asarray(v) for k, v in ops.items()}
        order = np.lexsort((o["depth"], o["ts"]))
        writer.append("ops", {
            "ts": o["ts"][order].astype(np.int64), "dur": o["dur"][order].astype(np.int64),
            "tid": o["tid"][order].astype(np.int64), "name": o["name"][order].astype(np.int32),
            "module": o["module"][order].astype(np.int32), "stack": o["stack"][order].astype(np.int32),
            "shapes": o["shapes"][order].astype(np.int32), "dtypes": np.full(n_ops, dtypes_, np.int32),
            "devices": np.full(n_ops, devices_, np.int32), "seq": o["seq"][order].astype(np.int64),
            "fwd_tid": o["fwd_tid"][order].astype(np.int64), "bwd": o["bwd"][order].astype(bool),
            "depth": o["depth"][order].astype(np.int16), "recompute": np.zeros(n_ops, bool)})
        ne = len(enq["ts"])
        writer.append("device_enqueues", {
            "ts": np.asarray(enq["ts"], np.int64), "tid": np.asarray(enq["tid"], np.int64),
            "id": np.asarray(enq["id"], np.int64), "device": np.full(ne, dev_id, np.int32),
            "stream": np.full(ne, stream, np.int32), "op": np.asarray(enq["op"], np.int32),
            "queue_depth": np.asarray(enq["queue_depth"], np.int32), "host_op": np.asarray(enq["host_op"], np.int32),
            "module": np.asarray(enq["module"], np.int32), "stack": np.asarray(enq["stack"], np.int32),
            "bwd": np.asarray(enq["bwd"], bool)})
        nf = len(fl["ts"])
        writer.append("queue_flushes", {
            "ts": np.asarray(fl["ts"], np.int64), "dur": np.asarray(fl["dur"], np.int64),
            "tid": np.asarray(fl["tid"], np.int64), "device": np.full(nf, dev_id, np.int32),
            "reason": np.asarray(fl["reason"], np.int32), "ops": np.asarray(fl["ops"], np.int32),
            "host_op": np.asarray(fl["host_op"], np.int32), "module": np.asarray(fl["module"], np.int32),
            "stack": np.asarray(fl["stack"], np.int32), "bwd": np.asarray(fl["bwd"], bool)})
        nk_ = len(ker["ts"])
        writer.append("device_kernels", {
            "ts": np.asarray(ker["ts"], np.int64), "dur": np.asarray(ker["dur"], np.int64),
            "tid": np.full(nk_, D_TID, np.int64), "id": np.asarray(ker["id"], np.int64),
            "device": np.full(nk_, dev_id, np.int32), "stream": np.full(nk_, stream, np.int32),
            "name": np.asarray(ker["name"], np.int32), "n_ops": np.asarray(ker["n_ops"], np.int32)})
        writer.append("kernel_enqueues", {"kernel": np.asarray(links["kernel"], np.int64),
                                          "enqueue": np.asarray(links["enqueue"], np.int64)})
        nb = len(fb["ts"])
        writer.append("fallbacks", {
            "ts": np.asarray(fb["ts"], np.int64), "dur": np.asarray(fb["dur"], np.int64),
            "tid": np.asarray(fb["tid"], np.int64), "device": np.full(nb, dev_id, np.int32),
            "op": np.full(nb, fb_op, np.int32), "bytes_to_host": np.full(nb, FALLBACK_TO_HOST, np.int64),
            "bytes_from_host": np.full(nb, FALLBACK_FROM_HOST, np.int64),
            "host_op": np.asarray(fb["host_op"], np.int32), "module": np.asarray(fb["module"], np.int32),
            "stack": np.asarray(fb["stack"], np.int32), "bwd": np.asarray(fb["bwd"], bool)})
        writer.append("steps", {"step": np.array([s], np.int32), "ts": np.array([step_ts], np.int64),
                                "dur": np.array([h - step_ts], np.int64), "active": np.array([True]),
                                "complete": np.array([True])})
        for table, cols in it.take_new().items():
            writer.append(table, cols)
        for table, n in (("ops", n_ops), ("device_enqueues", ne), ("queue_flushes", nf), ("device_kernels", nk_),
                         ("kernel_enqueues", len(links["kernel"])), ("fallbacks", nb), ("steps", 1)):
            written[table] = written.get(table, 0) + n
        counters = {"dropped": {}, "written": dict(written), "cap_reached_at_step": None}
        (writer.compact if (s + 1) % COMPACT_EVERY == 0 else writer.commit)(s + 1, counters)
        h += 40_000  # the session's own work between steps
    writer.close(steps, counters)
    return time.perf_counter() - t_start, written


# ---------------------------------------------------------------------------------- measuring

def _basis(run):
    from neuron_prof.analysis.steps import basis_steps
    return basis_steps(analyze(run).step_kinds, captured_only=True).steps  # what summary.build.summarize calls ``scope``


def _sync(run):
    from neuron_prof.analysis.sync import sync_points
    return sync_points(run.ops, analyze(run).op_parent, exclude=analyze(run).op_compile.inside)


def _verdicts(run):
    from neuron_prof.analysis import device as dev
    v = dev.step_verdicts(analyze(run).device_steps)
    flags = analyze(run).step_kinds.set_index(["rank", "step"])[["warmup", "steady"]]
    return v.join(flags, on=["rank", "step"])


def analyses():
    """name -> (inputs(run) -> dict, analysis(run, inputs) -> result). Inputs are read (and timed)
    first; the analysis alone is what the figure measures."""
    from neuron_prof.analysis import device as dev
    return {
        "enqueuing_ops": (lambda r: {"e": r.device_enqueues, "o": r.ops},
                          lambda r, i: dev.enqueuing_ops(i["e"], i["o"])),
        "kernel_of": (lambda r: {"e": r.device_enqueues, "l": r.kernel_enqueues},
                      lambda r, i: dev.kernel_of(i["e"], i["l"])),
        "correlation": (lambda r: {"e": r.device_enqueues, "k": r.device_kernels, "l": r.kernel_enqueues, "o": r.ops},
                        lambda r, i: analyze(r).device_correlation),
        "device_steps": (lambda r: {"k": r.device_kernels, "f": r.queue_flushes, "s": analyze(r).step_kinds},
                         lambda r, i: analyze(r).device_steps),
        "step_verdicts": (lambda r: {"d": analyze(r).device_steps}, lambda r, i: dev.step_verdicts(i["d"])),
        "verdict_summary": (lambda r: {"v": _verdicts(r), "b": _basis(r)},
                            lambda r, i: dev.verdict_summary(i["v"], i["b"])),
        "stalls": (lambda r: {"f": r.queue_flushes, "b": _basis(r)}, lambda r, i: dev.stalls(i["f"], i["b"])),
        "sync_waits": (lambda r: {"s": _sync(r), "f": r.queue_flushes}, lambda r, i: dev.sync_waits(i["s"], i["f"])),
        "top_kernels": (lambda r: {"k": r.device_kernels, "c": analyze(r).device_correlation, "b": _basis(r)},
                        lambda r, i: dev.top_kernels(i["k"], i["c"], i["b"]).head(10)),
        "fusion": (lambda r: {"k": r.device_kernels}, lambda r, i: dev.fusion(i["k"])),
        "unfused_sequences": (lambda r: {"k": r.device_kernels, "c": analyze(r).device_correlation, "b": _basis(r)},
                              lambda r, i: dev.unfused_sequences(i["k"], i["c"], i["b"]).head(10)),
        "queue_depth": (lambda r: {"e": r.device_enqueues, "k": r.device_kernels},
                        lambda r, i: dev.queue_depth(i["e"], i["k"])),
        "fallback_summary": (lambda r: {"f": r.fallbacks, "b": _basis(r)},
                             lambda r, i: dev.fallback_summary(i["f"], i["b"])),
        "coverage": (lambda r: {"e": r.device_enqueues, "f": r.fallbacks}, lambda r, i: dev.coverage(i["e"], i["f"])),
    }


ANALYSES = ("enqueuing_ops", "kernel_of", "correlation", "device_steps", "step_verdicts", "verdict_summary", "stalls",
            "sync_waits", "top_kernels", "fusion", "unfused_sequences", "queue_depth",
            "fallback_summary", "coverage")
IN_ALL = tuple(a for a in ANALYSES if a not in ("enqueuing_ops", "kernel_of"))  # parts of correlation


def _rows(x) -> int:
    return int(len(x))


def measure(what: str, run_dir: Path, profile: bool, dump: Path | None) -> dict:
    """One measurement in this (fresh) process; printed as JSON for the parent."""
    t: dict = {}
    t0 = time.perf_counter()
    import neuron_prof
    t["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = neuron_prof.load(run_dir)
    t["load_s"] = time.perf_counter() - t0
    if what == "load":
        for name in ("device_enqueues", "queue_flushes", "kernel_enqueues", "device_kernels", "fallbacks"):
            t1 = time.perf_counter()
            t[f"rows_{name}"] = len(getattr(run, name))
            t[f"{name}_s"] = time.perf_counter() - t1
        t["load_and_device_tables_s"] = time.perf_counter() - t0
        for name, get in (("ops", lambda: run.ops), ("step_kinds", lambda: analyze(run).step_kinds)):
            t1 = time.perf_counter()  # the analyses' other inputs
            t[f"rows_{name}"] = len(get())
            t[f"{name}_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        t["rows_sync_points"] = len(_sync(run))
        t["sync_points_s"] = time.perf_counter() - t1
        return t
    if what in ANALYSES:
        prep, fn = analyses()[what]
        t1 = time.perf_counter()
        inputs = prep(run)
        t["inputs_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        t["rows"] = _rows(fn(run, inputs))
        t["analysis_s"] = time.perf_counter() - t1
        return t
    if what == "all":  # every device analysis, one after another, inputs read first
        table = analyses()
        t1 = time.perf_counter()
        for name in ("device_enqueues", "queue_flushes", "kernel_enqueues", "device_kernels", "fallbacks", "ops"):
            getattr(run, name)
        analyze(run).step_kinds
        basis, sync = _basis(run), _sync(run)
        t["inputs_s"] = time.perf_counter() - t1
        results = {}
        for name in IN_ALL:
            prep, fn = table[name]
            if name == "verdict_summary":
                inputs = {"v": _verdicts(run), "b": basis}
            elif name == "sync_waits":
                inputs = {"s": sync, "f": run.queue_flushes}
            else:
                inputs = prep(run)  # cached properties by now, but for device_correlation/device_steps
            t1 = time.perf_counter()
            results[name] = fn(run, inputs)
            t[f"{name}_s"] = time.perf_counter() - t1
            t[f"rows_{name}"] = _rows(results[name])
        t["analyses_s"] = sum(t[f"{n}_s"] for n in IN_ALL)
        if dump:
            import pickle
            dump.mkdir(parents=True, exist_ok=True)
            for name, res in {**results, "device_kernels": run.device_kernels}.items():
                (dump / f"{name}.pkl").write_bytes(pickle.dumps(res))
        return t
    if what == "summarize":
        import cProfile
        import io
        import pstats
        from neuron_prof.reports.summary import build
        from neuron_prof.reports.summary.build import summarize
        from neuron_prof.reports.summary.text import render_text
        if hasattr(build, "_device"):  # the Device section's own share (its tables read before it, by summarize)
            section = build._device

            def timed(*a, **kw):
                t2 = time.perf_counter()
                try:
                    return section(*a, **kw)
                finally:
                    t["device_section_s"] = t.get("device_section_s", 0.0) + time.perf_counter() - t2
            build._device = timed
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        t1 = time.perf_counter()
        summary = summarize(run)
        t["summarize_s"] = time.perf_counter() - t1
        if prof:
            prof.disable()
        t1 = time.perf_counter()
        text = render_text(summary)
        t["render_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        dumped = json.dumps(summary.to_json())
        t["json_s"] = time.perf_counter() - t1
        t["device_section"] = summary.device.captured
        t["report_lines"] = text.count("\n")
        t["json_bytes"] = len(dumped)
        if prof:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
            out.write("\n")
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
            t["profile"] = out.getvalue()
        return t
    raise SystemExit(f"unknown measurement {what}")


def in_child(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; its result, wall seconds and peak RSS in GB (its own rusage, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
        return done, wall, usage.ru_maxrss / 1024 ** 2


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(s: dict, unit: str = "s", prec: int = 2) -> str:
    return f"{s['median']:.{prec}f} {unit} ({s['min']:.{prec}f}-{s['max']:.{prec}f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--kernels-per-step", type=int, default=1000)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--reps", type=int, default=3, help="fresh processes per measurement")
    p.add_argument("--keep", type=Path, help="write the run here and keep it (reused if it exists)")
    p.add_argument("--only", nargs="+", help="measure only these: load, all, summarize, cli, or analysis names")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child before it is killed")
    p.add_argument("--profile", action="store_true", help="cProfile the in-process summarize")
    p.add_argument("--dump", type=Path, help="write each analysis's result (the 'all' pass) here as pickles")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--measure", help=argparse.SUPPRESS)  # the child's side
    p.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.run, args.profile, args.dump)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        gen = None
        if not (run_dir / "rank-00000").exists():
            gen, _ = generate(run_dir, args.steps, args.kernels_per_step, args.layers)
            print(f"generated in {gen:.1f} s", flush=True)
        disk = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
        wanted = args.only or ["load", *ANALYSES, "all", "summarize", "cli"]
        figures: dict = {"generate_s": gen, "disk_mb": disk / 1e6, "targets": TARGETS, "measurements": {}}
        profile_text = None
        for what in wanted:
            reps = []
            for rep in range(args.reps):
                if what == "cli":
                    cmd = [sys.executable, "-m", "neuron_prof", "report", str(run_dir), "--json"]
                else:
                    cmd = [sys.executable, __file__, "--measure", what, "--run", str(run_dir)]
                    if what == "summarize" and args.profile and rep == 0:
                        cmd.append("--profile")
                    if what == "all" and args.dump and rep == 0:
                        cmd += ["--dump", str(args.dump)]
                r, wall, rss = in_child(cmd, args.timeout)
                if r.returncode:
                    print(f"  {what}: failed (rc {r.returncode}, {wall:.0f} s)\n{r.stderr[-3000:]}", flush=True)
                    reps.append({"failed": r.returncode, "wall_s": wall, "rss_gb": rss})
                    break
                got = {} if what == "cli" else json.loads(r.stdout)
                if what == "cli":
                    got["json_bytes"] = len(r.stdout)
                if "profile" in got:
                    profile_text = got.pop("profile")
                reps.append({**got, "wall_s": wall, "rss_gb": rss})
            figures["measurements"][what] = reps
            ok = [x for x in reps if "failed" not in x]
            if not ok:
                continue
            keys = [k for k, v in ok[0].items() if k.endswith("_s") and isinstance(v, (int, float))]
            summ = {k: spread([x[k] for x in ok]) for k in keys + ["rss_gb"]}
            figures["measurements"][what] = {"reps": reps, "summary": summ,
                                             **{k: v for k, v in ok[0].items() if k.startswith("rows")}}
            main_key = {"load": "load_and_device_tables_s", "all": "analyses_s", "summarize": "summarize_s",
                        "cli": "wall_s"}.get(what, "analysis_s")
            extra = f"inputs {fmt(summ['inputs_s'])}; " if "inputs_s" in summ else ""
            rows = f", {ok[0]['rows']:,} rows" if "rows" in ok[0] else ""
            print(f"  {what:<18} {fmt(summ[main_key]):<26} {extra}process {fmt(summ['wall_s'])}, peak RSS "
                  f"{fmt(summ['rss_gb'], 'GB')}{rows}", flush=True)
            if what in ("load", "all", "summarize"):
                parts = [k for k in keys if k not in ("import_s", main_key, "inputs_s", "wall_s")]
                print("      " + ", ".join(f"{k[:-2]} {summ[k]['median']:.2f}" for k in parts), flush=True)
    m = figures["measurements"]
    if "load" in m and "summary" in m["load"]:
        rows = {k[5:]: v for k, v in m["load"].items() if k.startswith("rows_")}
        figures["rows"] = rows
        print("rows: " + ", ".join(f"{k} {v:,}" for k, v in rows.items()) + f"; {disk / 1e6:.0f} MB on disk")
    if "all" in m and "summary" in m["all"]:
        a = m["all"]["summary"]["analyses_s"]["median"]
        print(f"device analyses together: {a:.2f} s ({'within' if a <= TARGETS['analyses_s'] else 'OVER'} the "
              f"{TARGETS['analyses_s']:.0f} s target)")
    if profile_text:
        print(profile_text)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
