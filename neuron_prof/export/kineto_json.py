"""A run as torch.profiler writes a trace: Kineto's Chrome JSON, one file per rank, what Holistic
Trace Analysis, TensorBoard's profiler plugin and other Kineto readers load (``neuron-prof export
--format kineto``), and what ``neuron-prof import`` reads back into the same tables.

Per rank (``rank-00000.json``, ``rank-00001.json`` ... in the output folder), the events torch.profiler
writes for the same facts, with the same categories, names and args:

======================  =======================================================================
run table               Kineto events
======================  =======================================================================
steps                   ``ProfilerStep#N`` (``user_annotation``) on the training thread
ops                     ``cpu_op`` on their thread (``External id``, ``Sequence number``,
                        ``Input Dims``/``Input type`` where shapes were recorded)
collectives             ``record_param_comms`` (``cpu_op``) on the issuing thread, with
                        ``Collective name``, ``Process Group Name``, ``Seq``, ``In msg nelems``,
                        ``Out msg nelems``, ``dtype``
device_kernels          ``kernel`` on the device's track (``pid`` the device index, ``tid`` the
                        stream; ``device``, ``stream``, ``correlation``, ``queued ops``)
device_enqueues         ``<backend>_runtime`` launches on the host thread (``correlation``, ``op``,
                        ``queue depth``), an ``ac2g`` flow to the kernel they launched
device_copies           ``gpu_memcpy``/``gpu_memset`` (``bytes``) and the runtime call that issued each
queue_flushes,          runtime calls the host waited in (``wait reason``, ``ops waited for``,
stream_syncs            ``stream``, ``event``)
fallbacks               a runtime call with ``cpu fallback``, ``bytes to host``, ``bytes from host``
event_enqueues          ``...EventRecord`` / ``...StreamWaitEvent`` runtime calls
event_completions       ``gpu_user_annotation`` "Event Record" (1 ns early and 2 ns long, as Kineto
                        draws them)
stream_waits            ``cuda_sync`` "Stream Wait Event" with ``stream idle``
memory_events           ``[memory]`` instants (``Device Type``, ``Addr``, ``Bytes`` ...)
======================  =======================================================================

and at the top ``distributedInfo`` (rank, world size, backend, the process groups),
``deviceProperties``, ``torch_version`` (as ``prof.add_metadata`` writes it) and
``baseTimeNanoseconds``: times are ``ts`` microseconds (nanosecond decimals) after it, every rank
on rank 0's clock (``TraceClock``). The metadata keys beyond Kineto's own are
``neuron_prof.backends.device_activity.METADATA``'s.
"""
from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from neuron_prof.backends.device_activity import WAIT_REASONS
from neuron_prof.errors import NeuronProfError
from neuron_prof.export.clock import TraceClock
from neuron_prof.store.run import Run
from neuron_prof.store.safefile import atomic_output, kind

__all__ = ["FILE_GLOB", "write_kineto", "runtime_category"]

FILE_GLOB = "rank-*.json"
_RUNTIME_CALLS = {  # a host wait's reason -> the runtime call a CUDA or PrivateUse1 backend waits in
    "synchronize": "DeviceSynchronize", "stream_synchronize": "StreamSynchronize",
    "event_synchronize": "EventSynchronize"}
_DTYPE_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
                "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char", "uint8": "unsigned char",
                "bool": "bool", "complex64": "c10::complex<float>", "complex128": "c10::complex<double>"}
_MEMORY_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "xpu": 12, "mtia": 19}  # else PrivateUse1 (20)


def runtime_category(backend: str) -> str:
    """The Kineto category of a backend's runtime calls: ``cuda_runtime``, ``xpu_runtime``, or
    a PrivateUse1 backend's ``privateuse1_runtime``."""
    return {"cuda": "cuda_runtime", "xpu": "xpu_runtime", "mtia": "mtia_runtime"}.get(backend, "privateuse1_runtime")


def _us(ns: int) -> str:
    """int ns as exact decimal microseconds, as Kineto writes them."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(int(ns)), 1000)
    return f"{sign}{q}.{r:03d}"


def _event(ph: str, cat: str, name: str, pid: int, tid: int, ts: int, dur: int | None = None,
           args: dict[str, Any] | None = None) -> str:
    head = f'{{"ph":"{ph}","cat":{json.dumps(cat)},"name":{json.dumps(name, ensure_ascii=False)},' \
           f'"pid":{pid},"tid":{tid},"ts":{_us(ts)}'
    if dur is not None:
        head += f',"dur":{_us(max(dur, 0))}'
    if ph == "i":
        head += ',"s":"t"'
    if args:
        head += ',"args":' + json.dumps(args, ensure_ascii=False, default=_plain)
    return head + "}"


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(type(value))


def _strings(col: pd.Series) -> np.ndarray:
    return col.astype(str).to_numpy(dtype=object)


class _Rank:
    """One rank's events, on the trace's clock less ``base``."""

    def __init__(self, run: Run, rank: int, clock: TraceClock, base: int, backend: str) -> None:
        self.run, self.rank, self.clock, self.base, self.backend = run, rank, clock, base, backend
        self.pid = int(next(rd.meta.get("pid", 0) for rd in run.rank_data if rd.rank == rank)) or 1
        self.runtime = runtime_category(backend)
        self.prefix = backend if backend not in ("cuda", "xpu") else backend
        self.next_id = 1 << 40  # correlation ids of the host calls a table has no id for

    def at(self, ts) -> np.ndarray:
        return self.clock.at(self.rank, ts) - self.base

    def span(self, ts, dur) -> tuple[np.ndarray, np.ndarray]:
        start, d = self.clock.span(self.rank, ts, dur)
        return start - self.base, d

    def mine(self, df: pd.DataFrame) -> pd.DataFrame:
        return df[df["rank"].to_numpy() == self.rank] if len(df) else df

    def fresh_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def events(self) -> Iterator[str]:
        yield from self._metadata()
        yield from self._steps()
        yield from self._ops()
        yield from self._collectives()
        yield from self._memory()
        yield from self._device()

    def _metadata(self) -> Iterator[str]:
        pid = self.pid
        yield f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"ts":0,"args":{{"name":"python"}}}}'
        yield f'{{"ph":"M","name":"process_labels","pid":{pid},"tid":0,"ts":0,"args":{{"labels":"CPU"}}}}'
        threads = self.mine(self.run.threads)
        for tid, name in zip(threads["tid"].tolist(), _strings(threads["name"]).tolist()):
            yield f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"ts":0,"args":{{"name":{json.dumps(name)}}}}}'
        devices = self._device_indices()
        for index in sorted(devices):
            label = f"GPU {index}" if self.backend == "cuda" else f"{self.backend} {index}"
            yield f'{{"ph":"M","name":"process_name","pid":{index},"tid":0,"ts":0,"args":{{"name":{json.dumps(self.backend)}}}}}'
            yield f'{{"ph":"M","name":"process_labels","pid":{index},"tid":0,"ts":0,"args":{{"labels":{json.dumps(label)}}}}}'
            for stream in sorted(devices[index]):
                yield (f'{{"ph":"M","name":"thread_name","pid":{index},"tid":{stream},"ts":0,'
                       f'"args":{{"name":"stream {stream}"}}}}')

    def _device_indices(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for table in ("device_kernels", "device_copies", "stream_waits", "event_completions"):
            df = self.mine(self.run.table(table))
            for device, stream in zip(_strings(df["device"]).tolist(), df["stream"].tolist()):
                out.setdefault(_index(device), set()).add(int(stream))
        return out

    def _steps(self) -> Iterator[str]:
        steps = self.mine(self.run.steps)
        steps = steps[steps["active"].to_numpy()] if len(steps) else steps
        ops = self.mine(self.run.ops)
        tid = int(ops["tid"].mode().iloc[0]) if len(ops) else self.pid
        start, dur = self.span(steps["ts"], steps["dur"])
        for step, ts, d in zip(steps["step"].tolist(), start.tolist(), dur.tolist()):
            yield _event("X", "user_annotation", f"ProfilerStep#{step}", self.pid, tid, ts, d)

    def _ops(self) -> Iterator[str]:
        """Each op; around each top-level one, as torch.profiler's ``with_stack`` and
        ``with_modules`` write them, its module path (``nn.Module: <name>`` ranges, one per part)
        and its Python stack (``python_function`` ranges, outermost first): the ops inside it are
        in them too."""
        ops = self.mine(self.run.ops)
        if ops.empty:
            return
        start, dur = self.span(ops["ts"], ops["dur"])
        names, shapes, dtypes = _strings(ops["name"]), _strings(ops["shapes"]), _strings(ops["dtypes"])
        modules = _strings(ops["module"])
        frames: dict[int, list[str]] = {}
        for i, (name, tid, ts, d, seq, shape, dtype, depth, module, stack) in enumerate(zip(
                names.tolist(), ops["tid"].tolist(), start.tolist(), dur.tolist(), ops["seq"].tolist(),
                shapes.tolist(), dtypes.tolist(), ops["depth"].tolist(), modules.tolist(), ops["stack"].tolist())):
            if depth == 0:
                for part in module.split(".") if module else ():
                    yield _event("X", "python_function", f"nn.Module: {part}", self.pid, tid, ts, d)
                if stack not in frames:
                    frames[stack] = [f"{file}({line}): {func}" for file, func, line in
                                     reversed(self.run.stack(self.rank, int(stack)))]
                for frame in frames[stack]:
                    yield _event("X", "python_function", frame, self.pid, tid, ts, d)
            args: dict[str, Any] = {"External id": i + 1}
            if seq >= 0:
                args["Sequence number"] = seq
            if shape:
                try:
                    args["Input Dims"] = json.loads(shape)
                    args["Input type"] = [_DTYPE_NAMES.get(t, t) for t in dtype.split(",")] if dtype else []
                except ValueError:
                    pass
            yield _event("X", "cpu_op", name, self.pid, tid, ts, d, args)

    def _collectives(self) -> Iterator[str]:
        c = self.mine(self.run.collectives)
        if c.empty:
            return
        start, dur = self.span(c["ts"], c["dur"])
        for row, ts, d in zip(c.itertuples(), start.tolist(), dur.tolist()):
            args = {"Collective name": str(row.op), "Process Group Name": str(row.group), "Seq": int(row.seq),
                    "In msg nelems": int(row.count), "dtype": str(row.dtype), "Group size": int(row.group_size)}
            if row.out_bytes >= 0 and row.bytes > 0 and row.count > 0:
                args["Out msg nelems"] = int(row.out_bytes * row.count // row.bytes)
            yield _event("X", "cpu_op", "record_param_comms", self.pid, int(row.tid), ts, d, args)

    def _memory(self) -> Iterator[str]:
        m = self.mine(self.run.memory_events)
        if m.empty:
            return
        kind = m["kind"].astype(str).to_numpy()
        m = m[np.isin(kind, ("alloc", "free"))]
        ts = self.at(m["ts"])
        for row, t in zip(m.itertuples(), ts.tolist()):
            device = str(row.device)
            name, _, index = device.partition(":")
            args = {"Device Type": _MEMORY_DEVICE_TYPES.get(name, 20), "Device Id": int(index) if index else -1,
                    "Addr": int(row.addr), "Bytes": int(row.bytes), "Total Allocated": int(row.total_allocated),
                    "Total Reserved": int(row.total_reserved)}
            yield _event("i", "cpu_instant_event", "[memory]", self.pid, int(row.tid), t, None, args)

    def _device(self) -> Iterator[str]:
        run = self.run
        kernels, links = self.mine(run.device_kernels), self.mine(run.kernel_enqueues)
        first_of = {int(k): int(e) for k, e in zip(links.groupby("kernel")["enqueue"].first().index,
                                                   links.groupby("kernel")["enqueue"].first())} if len(links) else {}
        start, dur = self.span(kernels["ts"], kernels["dur"])
        for row, ts, d in zip(kernels.itertuples(), start.tolist(), dur.tolist()):
            corr = first_of.get(int(row.id), 0) or self.fresh_id()
            args = {"device": _index(str(row.device)), "stream": int(row.stream), "correlation": corr,
                    "queued ops": [int(i) for i in row.enqueue_ids]}
            yield _event("X", "kernel", str(row.name), args["device"], int(row.stream), ts, d, args)
            yield (f'{{"ph":"f","id":{corr},"pid":{args["device"]},"tid":{int(row.stream)},"ts":{_us(ts)},'
                   f'"cat":"ac2g","name":"ac2g","bp":"e"}}')
        launched = set(first_of.values())
        enq = self.mine(run.device_enqueues)
        for row, ts in zip(enq.itertuples(), self.at(enq["ts"]).tolist()):
            op = str(row.op)
            name = op if "::" not in op else f"{self.prefix}LaunchKernel"
            args = {"device": _index(str(row.device)), "stream": int(row.stream), "correlation": int(row.id),
                    "op": op}
            if row.queue_depth >= 0:
                args["queue depth"] = int(row.queue_depth)
            yield _event("X", self.runtime, name, self.pid, int(row.tid), ts, 0, args)
            if int(row.id) in launched:
                yield (f'{{"ph":"s","id":{int(row.id)},"pid":{self.pid},"tid":{int(row.tid)},"ts":{_us(ts)},'
                       f'"cat":"ac2g","name":"ac2g"}}')
        yield from self._copies()
        yield from self._waits()
        yield from self._calls()

    def _copies(self) -> Iterator[str]:
        copies = self.mine(self.run.device_copies)
        start, dur = self.span(copies["ts"], copies["dur"])
        host = self.at(copies["host_ts"])
        for row, ts, d, h in zip(copies.itertuples(), start.tolist(), dur.tolist(), host.tolist()):
            corr, device = self.fresh_id(), _index(str(row.device))
            cat = "gpu_memset" if str(row.kind) == "memset" else "gpu_memcpy"
            yield _event("X", cat, str(row.name), device, int(row.stream), ts, d,
                         {"device": device, "stream": int(row.stream), "correlation": corr, "bytes": int(row.bytes)})
            yield (f'{{"ph":"f","id":{corr},"pid":{device},"tid":{int(row.stream)},"ts":{_us(ts)},'
                   f'"cat":"ac2g","name":"ac2g","bp":"e"}}')
            if row.host_ts >= 0:
                call = "Memset" if cat == "gpu_memset" else "MemcpyAsync"
                yield _event("X", self.runtime, f"{self.prefix}{call}", self.pid, int(row.tid), h, 0,
                             {"device": device, "correlation": corr})
                yield (f'{{"ph":"s","id":{corr},"pid":{self.pid},"tid":{int(row.tid)},"ts":{_us(h)},'
                       f'"cat":"ac2g","name":"ac2g"}}')

    def _waits(self) -> Iterator[str]:
        run = self.run
        waits = self.mine(run.stream_syncs if len(self.mine(run.stream_syncs)) else run.queue_flushes)
        start, dur = self.span(waits["ts"], waits["dur"])
        has = "stream" in waits.columns
        for row, ts, d in zip(waits.itertuples(), start.tolist(), dur.tolist()):
            reason = str(row.reason)
            stream = int(row.stream) if has else -1
            call = _RUNTIME_CALLS.get(reason, "StreamSynchronize" if stream >= 0 else "DeviceSynchronize")
            args = {"device": _index(str(row.device)), "stream": stream,
                    "wait reason": reason if reason in WAIT_REASONS else "other", "ops waited for": int(row.ops),
                    "correlation": self.fresh_id()}
            if has and row.event:
                args["event"] = int(row.event)
            yield _event("X", self.runtime, f"{self.prefix}{call}", self.pid, int(row.tid), ts, d, args)
        falls = self.mine(run.fallbacks)
        start, dur = self.span(falls["ts"], falls["dur"])
        for row, ts, d in zip(falls.itertuples(), start.tolist(), dur.tolist()):
            yield _event("X", self.runtime, f"{self.prefix}CpuFallback", self.pid, int(row.tid), ts, d,
                         {"device": _index(str(row.device)), "cpu fallback": str(row.op),
                          "bytes to host": int(row.bytes_to_host), "bytes from host": int(row.bytes_from_host),
                          "correlation": self.fresh_id()})

    def _calls(self) -> Iterator[str]:
        """Event records and waits put on streams, where the device reached each record, and the
        streams' idle waits."""
        run = self.run
        calls = self.mine(run.event_enqueues)
        for row, ts in zip(calls.itertuples(), self.at(calls["ts"]).tolist()):
            name = "EventRecord" if str(row.kind) == "record" else "StreamWaitEvent"
            yield _event("X", self.runtime, f"{self.prefix}{name}", self.pid, int(row.tid), ts, 0,
                         {"device": _index(str(row.device)), "stream": int(row.stream), "event": int(row.event),
                          "correlation": self.fresh_id()})
        done = self.mine(run.event_completions)
        for row, ts in zip(done.itertuples(), self.at(done["ts"]).tolist()):
            device = _index(str(row.device))
            yield _event("X", "gpu_user_annotation", "Event Record", device, int(row.stream), ts - 1, 2,
                         {"device": device, "stream": int(row.stream), "event": int(row.event)})
        waits = self.mine(run.stream_waits)
        start, dur = self.span(waits["ts"], waits["dur"])
        for row, ts, d in zip(waits.itertuples(), start.tolist(), dur.tolist()):
            device = _index(str(row.device))
            yield _event("X", "cuda_sync", "Stream Wait Event", device, int(row.stream), ts, d,
                         {"device": device, "stream": int(row.stream), "cuda_sync_kind": "Stream Wait Event",
                          "wait_on_cuda_event_id": int(row.event), "stream idle": 1})

    def header(self) -> dict[str, Any]:
        """The top-level fields: distributedInfo, deviceProperties, baseTimeNanoseconds, and the
        run's torch version as a job adds it (``torch_version``: torch.profiler writes none), so
        an import of the trace says it."""
        run = self.run
        groups = self.mine(run.collective_groups)
        pg = [{"pg_name": str(g.group), "pg_desc": str(g.desc), "backend_config": str(g.backend),
               "pg_size": int(g.size), "ranks": [int(r) for r in g.ranks]} for g in groups.itertuples()]
        default = next((g for g in pg if g["pg_desc"] == "default_pg"), pg[0] if pg else None)
        dist = {"backend": default["backend_config"].rsplit(":", 1)[-1] if default else "", "rank": self.rank,
                "world_size": int(run.meta.get("world_size") or len(run.ranks)), "pg_count": len(pg), "pg_config": pg}
        props = [{"id": i, "name": self.backend} for i in sorted(self._device_indices())]
        version = str(run.meta.get("torch_version") or "unknown")
        return {"schemaVersion": 1, "deviceProperties": props, "distributedInfo": dist,
                "baseTimeNanoseconds": self.base, "displayTimeUnit": "ms",
                **({"torch_version": version} if version != "unknown" else {})}


def _index(device: str) -> int:
    """``"neuron:1"`` -> 1 (a device named without an index: 0)."""
    _, _, index = device.partition(":")
    try:
        return int(index) if index else 0
    except ValueError:
        return 0


def backend_of(run: Run) -> str:
    """The run's device backend (``neuron``, ``cuda``): its device tables' device names, else
    the run's."""
    for table in ("device_kernels", "device_enqueues", "device_copies", "queue_flushes"):
        df = run.table(table)
        if len(df):
            return str(df["device"].iloc[0]).partition(":")[0]
    return str(run.meta.get("device") or "cpu").partition(":")[0]


def write_kineto(run: Run, out: Path, progress: Callable[[str], None] = lambda phase: None) -> dict[str, int]:
    """Every rank of ``run`` as a torch.profiler trace in the folder ``out`` (made if missing;
    ``rank-<N>.json`` each). Returns what was written, by count name."""
    clock = TraceClock.of_run(run)
    backend = backend_of(run)
    out.mkdir(exist_ok=True)
    counts = {"ranks": 0, "events": 0}
    for rank in run.ranks:
        progress(f"rank {rank}")
        r = _Rank(run, rank, clock, clock.wall, backend)
        header = r.header()
        path = out / f"rank-{rank:05d}.json"
        with atomic_output(path) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
            f.write("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items())
                    + ', "traceEvents": [\n')
            first = True
            for line in r.events():
                f.write(line if first else ",\n" + line)
                first = False
                counts["events"] += 1
            f.write("\n]}\n")
        counts["ranks"] += 1
    return counts


def check_folder(out: Path, force: bool) -> None:
    """Raise :class:`NeuronProfError` unless ``out`` is nothing yet, or a folder of rank traces an
    export wrote (or ``force``): export never writes into a folder of other files, nor through a
    link. With ``force`` a link or file there is removed (a link's target left untouched)."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        if not force:
            raise NeuronProfError(f"{out}: is {kind(mode)}, not a folder of traces neuron_prof wrote; export does not "
                                  "write through it: remove it, choose another -o, or pass --force to replace it (a "
                                  "link's target is left untouched)")
        out.unlink()
        return
    others = [p.name for p in out.iterdir() if not p.match(FILE_GLOB)]
    if others and not force:
        raise NeuronProfError(f"{out}: holds files an export did not write ({others[0]}); choose another -o, or "
                              "pass --force to write beside them")
