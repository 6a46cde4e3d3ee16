"""The event packets of one process as bytes: a head per event, then its tail.

An event packet is ``0x0A`` length ``0x40`` timestamp (its head: the only bytes of its own) and
its tail (``perfetto_templates``). A run of events becomes one uint8 matrix, a row per event:
its template's row taken whole (into a fresh array: several times faster than into a slice of
one), with room in front where its head is written; the tails of objects no other shares, built
for the run, written over their rows. The bytes in use are marked by a mask taken the same way
from a staircase (row L: the first L bytes) by each row's length, and one boolean index turns
the matrix into the packets. Packets are canonical, byte-identical to
``TracePacket.SerializeToString()``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from neuron_prof.export.buffered_writer import ProcessData
from neuron_prof.export.nesting import emission_order, slice_event_order
from neuron_prof.export.perfetto_templates import Templates
from neuron_prof.export.perfetto_wire import varint_block

__all__ = ["EventPackets", "event_order"]

HEAD = 22
"""Room for a packet's head: ``0x0A``, its length, ``0x40``, its timestamp (two varints, 10 bytes at most)."""


def event_order(d: ProcessData) -> np.ndarray:
    """The process's events, numbered as ``EventPackets`` numbers them, in the order they are
    written: slice events as ``slice_event_order`` sorts them (from nest-repairing), instants
    and counters merged in after slice events of equal time."""
    S, I = d.slices, d.instants
    ns, ni, nc = len(S), len(I), len(d.counter_ts)
    order = S.order if ns and S.order is not None else slice_event_order(S.ts, S.ts + S.dur)
    if not ni + nc:
        return order
    end = S.ts + S.dur
    ot = np.concatenate([I.ts, d.counter_ts])
    other = emission_order(ot, np.repeat(np.array([3, 4], np.int8), [ni, nc]), np.zeros(ni + nc, np.int64))
    rev = order >= ns
    slice_t = np.where(rev, end[np.where(rev, 2 * ns - 1 - order, 0)], S.ts[np.where(rev, 0, order)]) \
        if ns else np.empty(0, np.int64)
    return np.insert(order, np.searchsorted(slice_t, ot[other], side="right"), other + 2 * ns)


class EventPackets:
    """One process's event packets: its templates built once, then any run of its events as bytes
    (runs may be encoded in parallel threads).

    Events are numbered as ``nesting.slice_event_order`` lays them out: slice begins in input
    order, slice ends in reversed input order, then instants, then counters."""

    def __init__(self, d: ProcessData, seq: int, uuid: np.ndarray, kiid: Mapping[str, int]) -> None:
        """``uuid``: track uuid by writer handle; ``kiid``: interned id of each annotation key."""
        S = d.slices
        ns = len(S)
        self.templates = t = Templates(d, seq, uuid, kiid, room=HEAD)
        self.ts = np.concatenate([S.ts, (S.ts + S.dur)[::-1], d.instants.ts, d.counter_ts])
        self.tid = np.concatenate([t.object_tid[:ns], t.end_tid[::-1], t.object_tid[ns:]]).astype(np.int32)
        self.ns = ns
        # masks: staircase L (the head and L bytes in use) for a template's row, the same less
        # the head for a row of flow ids
        w = t.rows.shape[1] - HEAD
        stair = np.arange(w) < np.arange(w + 1)[:, None]
        self.stairs = np.concatenate([np.repeat([[True], [False]], w + 1, axis=0).repeat(HEAD, axis=1),
                                      np.concatenate([stair, stair])], axis=1)
        self.stair = t.row_len + (w + 1) * t.flow_rows

    def __len__(self) -> int:
        return len(self.tid)

    def encode(self, sel: np.ndarray) -> np.ndarray:
        """The packets (framed ``Trace.packet`` fields) of events ``sel``, in that order, as bytes."""
        t = self.templates
        tid = self.tid[sel]
        tail = t.tail_len[tid]
        alone = np.flatnonzero(tid < 0)
        own: list = []
        if len(alone):  # objects whose tail is their own: built here, with their events
            e = sel[alone]
            own, tail[alone] = t.build(np.where(e < self.ns, e, e - self.ns))
        ts_b, ts_m, ts_l = varint_block(self.ts[sel].view(np.uint64))
        pl_b, pl_m, _ = varint_block((1 + ts_l + tail).astype(np.uint64))
        wp = pl_b.shape[1]
        hw = 2 + wp + ts_b.shape[1]
        row = tid
        extra = t.extra[row]
        if extra.any():  # events with rows of flow ids: those after their first
            count = 1 + extra
            first = np.cumsum(count) - count
            ev = np.repeat(np.arange(len(sel)), count)
            k = np.arange(len(ev)) - first[ev]
            row = np.where(k == 0, row[ev], t.extra_at[row[ev]] + k - 1)
            at = first[alone]
        else:
            first, at = slice(None), alone
        w = max([int(t.row_len[row].max(initial=0))] + [blk.shape[1] for _, blk, _ in own])
        cols = slice(HEAD - hw, HEAD + w)
        M = np.take(t.rows[:, cols], row, axis=0, mode="wrap")    # -1: the empty last row
        K = np.take(self.stairs[:, cols], self.stair[row], axis=0, mode="clip")
        for which, blk, used in own:   # their rows: the empty one, so far
            M[at[which], hw:hw + blk.shape[1]] = blk
            K[at[which], hw:hw + blk.shape[1]] = used
        head = np.empty((len(sel), hw), np.uint8)
        head[:, 0], head[:, 1 + wp] = 0x0A, 0x40
        head[:, 1:1 + wp], head[:, 2 + wp:] = pl_b, ts_b
        M[first, :hw] = head
        if pl_m is not None:
            K[first, 1:1 + wp] = pl_m
        if ts_m is not None:
            K[first, 2 + wp:hw] = ts_m
        return M[K]
