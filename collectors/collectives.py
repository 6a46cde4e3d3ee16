"""The collectives collector: every collective this rank issues, on any process-group backend.

Mechanism (measured; see docs/benchmarks.md, "Collectives capture cost"): the native observer in
``_comms.cpp`` sees the c10d dispatcher op that every collective runs, whoever issues it (explicit ``torch.distributed``
calls, DDP's bucketed gradient all-reduce, FSDP2's all-gathers and reduce-scatters, functional
collectives and DTensor), and records op, group, the group's own sequence number, bytes, dtype,
issuing line and module, issue time and completion time. It is on from the moment a default
process group exists (``init_process_group``) until it is destroyed or the capture ends, in and
out of capture windows: collectives are few and matching ranks needs every sequence number.

Three things beside the rows:

* the process groups (members as global ranks, from ``torch.distributed``), table ``groups``;
* each rank's clock offset to rank 0 at start and end (``_clocksync``), table ``clock_sync``;
* an in-flight ring in the rank folder (``schema.INFLIGHT``), written by the observer at every
  issue and completion, so a rank killed while stuck in a collective still says which one.
"""
from __future__ import annotations

import functools
import logging
import mmap
import os
import types

import numpy as np

from neuron_prof.recording.api import Recorder
from neuron_prof.store.schema import INFLIGHT, INFLIGHT_SLOT
from neuron_prof.recording.torchhooks import when_imported

INFLIGHT_SLOTS = 512
"""Collectives the in-flight ring remembers (128 bytes each): far more than are ever in flight."""

log = logging.getLogger("neuron_prof")
_STRING_COLUMNS = ("op", "call", "group", "dtype", "module")
_generation = 0  # default process groups this process has had: keys of one clock measurement


class CollectivesCollector:
    """Collector (neuron_prof.recording.api) of tables ``collectives``, ``groups``, ``clock_sync``."""

    name = "collectives"

    def __init__(self) -> None:
        self._rec: Recorder | None = None
        self._engine = None
        self._ext = None
        self._ids = None  # engine string/stack ids -> the Recorder's (_engine.EngineIds)
        self._dtype: np.dtype | None = None
        self._groups_written: set[str] = set()
        self._clock = None
        self._clock_error_logged = False
        self._patched: tuple[types.ModuleType, object] | None = None
        self._backward: tuple[types.ModuleType, object] | None = None  # torch.autograd's wrapped entry
        self._inflight: mmap.mmap | None = None  # the in-flight ring, read-only: what a dump reads
        self._cancel_import = None

    # ---- Collector protocol
    def install(self, rec: Recorder) -> None:
        self._rec = rec
        self._cancel_import = when_imported("torch.distributed.distributed_c10d", self._hook_c10d)

    def window(self, on: bool) -> None:
        pass  # collectives are recorded in and out of windows

    def flush(self, rec: Recorder, keep: bool) -> None:
        if self._ext is None:
            return
        if rec.closing:
            self._group_ending()  # the end clock measurement, if the group was not destroyed
        data, groups = self._ext.comms_drain(rec.closing)
        self._append_groups(rec, groups)
        rows = np.frombuffer(data, dtype=self._dtype)
        if len(rows):
            cols = {c: np.ascontiguousarray(rows[c]) for c in self._dtype.names}
            for c in _STRING_COLUMNS:
                cols[c] = self._ids.map(rec, cols[c], "strings")
            cols["stack"] = self._ids.map(rec, cols["stack"], "stacks")
            cols["async_op"] = cols["async_op"].astype(bool)
            cols["bwd"] = cols["bwd"].astype(bool)
            rec.append("collectives", cols)
        self._append_clock(rec)

    def uninstall(self) -> None:
        if self._cancel_import is not None:
            self._cancel_import()
            self._cancel_import = None
        if self._patched is not None:
            c10d, original = self._patched
            c10d._update_default_pg = original
            self._patched = None
        if self._backward is not None:
            autograd, original = self._backward
            autograd._engine_run_backward = original
            self._backward = None
        if self._ext is not None:
            self._ext.comms_stop()
            self._ext.comms_close_inflight()
            self._ext = None
        if self._inflight is not None:
            self._inflight.close()
            self._inflight = None

    def on_dump(self, rec: Recorder, ts: int) -> None:
        """An always-on dump: the collectives issued and not completed, as the in-flight ring holds
        them now (the observer marks a slot at issue and at completion), into ``dump_collectives``."""
        if self._inflight is None:
            return
        data = self._inflight[len(self._inflight) - INFLIGHT_SLOTS * INFLIGHT_SLOT.itemsize:]  # a copy
        slots = np.frombuffer(data, INFLIGHT_SLOT)
        slots = slots[(slots["id"] > 0) & (slots["state"] == 1)]  # 1: issued (schema.INFLIGHT_STATES)
        if not len(slots):
            return
        slots = slots[np.argsort(slots["ts"], kind="stable")]
        rec.append("dump_collectives", {
            "ts": np.full(len(slots), ts, np.int64), "since": slots["ts"].astype(np.int64),
            "op": _interned(rec, slots["op"]), "group": _interned(rec, slots["group"]),
            "seq": slots["seq"].astype(np.int64), "bytes": slots["bytes"].astype(np.int64),
            "peer": slots["peer"].astype(np.int32)})

    # ---- internals
    def _hook_c10d(self, c10d: types.ModuleType) -> None:
        """``init_process_group`` and ``destroy_process_group`` both end in ``_update_default_pg``
        (the group, or None): the one place where a default group comes and goes, however the
        program spelled the call."""
        try:
            original = getattr(c10d, "_update_default_pg", None)
            if original is None:
                return
            collector = self

            def _update_default_pg(pg):
                if pg is None:
                    collector._guarded(collector._group_ending)
                original(pg)
                if pg is not None:
                    collector._guarded(collector._activate)

            c10d._update_default_pg = _update_default_pg
            self._patched = (c10d, original)
            if c10d.is_initialized():
                self._activate()
        except Exception as exc:  # noqa: BLE001 - an import of the user's must never fail because of us
            self._rec.failure(self.name, exc)

    def _guarded(self, fn) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - training must never break
            self._rec.failure(self.name, exc)
            self.uninstall()

    def _activate(self) -> None:
        """A default process group exists: observe collectives, map the in-flight ring, measure clocks."""
        global _generation
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        from neuron_prof.collectors._clocksync import ClockSync, tcp_address
        from neuron_prof.collectors._engine import EngineIds, load_engine

        if self._ext is None:
            self._engine = load_engine()
            self._ext = self._engine.extension()
            self._ids = EngineIds(self._engine)
            lay = self._ext.comms_layout()
            self._dtype = np.dtype({"names": [f[0] for f in lay["fields"]], "offsets": [f[1] for f in lay["fields"]],
                                    "formats": [f[2] for f in lay["fields"]], "itemsize": lay["itemsize"]})
            fd = self._rec.rank_file(INFLIGHT)
            if fd is not None:
                try:
                    self._ext.comms_set_inflight(fd, INFLIGHT_SLOTS)
                    self._inflight = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
                finally:
                    os.close(fd)
            self._ext.comms_start()
            self._wrap_backward()
        _generation += 1
        address = tcp_address(c10d._get_default_store())
        self._clock = None
        if address is not None:
            self._clock = ClockSync(address, dist.get_rank(), dist.get_world_size(), _generation)
            self._clock.measure("start")

    def _wrap_backward(self) -> None:
        """``torch.autograd.backward`` and ``grad`` (``Tensor.backward`` too) enter the engine through
        ``torch.autograd._engine_run_backward``: wrapped, each call records its user line for the
        collectives issued on an accelerator's autograd thread, where Python has no frame (DDP's
        gradient all-reduces), so that they name the ``loss.backward()`` line as on the CPU."""
        import torch.autograd as autograd

        original = getattr(autograd, "_engine_run_backward", None)
        if original is None or getattr(original, "__wrapped__", None) is not None:
            return
        ext = self._ext

        @functools.wraps(original)
        def _engine_run_backward(*args, **kwargs):
            before = ext.comms_backward_begin()
            try:
                return original(*args, **kwargs)
            finally:
                ext.comms_backward_end(before)

        autograd._engine_run_backward = _engine_run_backward
        self._backward = (autograd, original)

    def _group_ending(self) -> None:
        if self._clock is not None and not any(t.name.endswith(" end") for t in self._clock._threads):
            self._clock.measure("end")
            self._clock.wait()

    def _append_groups(self, rec: Recorder, groups: list) -> None:
        new = [g for g in groups if g[0] not in self._groups_written]
        if not new:
            return
        members = _group_members()
        rec.append("groups", {
            "group": np.array([rec.intern(g[0]) for g in new], np.int32),
            "desc": self._ids.map(rec, np.array([g[1] for g in new], np.int32), "strings"),
            "backend": self._ids.map(rec, np.array([g[2] for g in new], np.int32), "strings"),
            "size": np.array([g[3] for g in new], np.int32),
            "group_rank": np.array([g[4] for g in new], np.int32),
            "ranks": [members.get(g[0], []) for g in new]})
        self._groups_written.update(g[0] for g in new)

    def _append_clock(self, rec: Recorder) -> None:
        if self._clock is None:
            return
        rows = self._clock.take()
        if rows:
            rec.append("clock_sync", {
                "ts": np.array([r["ts"] for r in rows], np.int64),
                "offset": np.array([r["offset"] for r in rows], np.int64),
                "rtt": np.array([r["rtt"] for r in rows], np.int64),
                "same_clock": np.array([r["same_clock"] for r in rows], bool),
                "phase": np.array([rec.intern(r["phase"]) for r in rows], np.int32)})
        if self._clock.error and not self._clock_error_logged:
            self._clock_error_logged = True
            log.warning("neuron_prof: could not measure this rank's clock against rank 0's (%s); merged views "
                        "assume one clock", self._clock.error)


def _interned(rec: Recorder, names: np.ndarray) -> np.ndarray:
    """The in-flight ring's fixed-width names as ids of the rank's strings."""
    return np.array([rec.intern(n.decode("utf-8", "replace")) for n in names], np.int32)


def _group_members() -> dict[str, list[int]]:
    """Group name -> its members as global ranks, for the groups torch.distributed knows now."""
    try:
        from torch.distributed import distributed_c10d as c10d
        return {name: sorted(int(r) for r in c10d._world.pg_group_ranks.get(pg, {}))
                for pg, name in c10d._world.pg_names.items()}
    except Exception:  # noqa: BLE001 - private state of torch.distributed: the run says "unknown" instead
        return {}
